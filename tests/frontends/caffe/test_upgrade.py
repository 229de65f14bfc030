"""Legacy Caffe definitions (V0, V1, input_dim, solver_type) upgraded as Caffe upgrades them."""
from __future__ import annotations

import os

import pytest

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeUpgradeError, CaffeUpgradeWarning
from cgvm.frontends.caffe.prototxt import parse_net_text, parse_solver_text, read_net, read_solver
from cgvm.frontends.caffe.upgrade import (
    V1_LAYER_TYPE_NAMES, needs_upgrade, upgrade_net, upgrade_snapshot_prefix, upgrade_solver,
)
from shared_paths import SHARED_CAFFE_MODELS

MODELS = SHARED_CAFFE_MODELS
needs_models = pytest.mark.skipif(not MODELS.is_dir(), reason="shared/models/caffe not present")


def names_and_types(net: caffe_pb2.NetParameter) -> list[tuple[str, str]]:
    return [(layer.name, layer.type) for layer in net.layer]


@needs_models
def test_v1_lenet_upgrades_to_exactly_the_current_lenet():
    legacy = read_net(MODELS / "legacy_v1_lenet" / "lenet_train_test.prototxt", upgrade=False)
    assert needs_upgrade(legacy) and len(legacy.layers) == 11 and len(legacy.layer) == 0
    upgraded = upgrade_net(legacy)
    assert names_and_types(upgraded) == [
        ("mnist", "Data"), ("mnist", "Data"), ("conv1", "Convolution"), ("pool1", "Pooling"),
        ("conv2", "Convolution"), ("pool2", "Pooling"), ("ip1", "InnerProduct"),
        ("relu1", "ReLU"), ("ip2", "InnerProduct"), ("accuracy", "Accuracy"),
        ("loss", "SoftmaxWithLoss")]
    assert [(p.lr_mult, p.HasField("decay_mult")) for p in upgraded.layer[2].param] == [
        (1.0, False), (2.0, False)]
    # The same net, written in the current format by BVLC later, is identical field for field.
    assert upgraded == read_net(MODELS / "lenet" / "lenet_train_test.prototxt")
    assert not needs_upgrade(upgraded)


@needs_models
def test_input_dim_caffenet_gets_an_input_layer_first():
    legacy = read_net(MODELS / "legacy_input_dim_caffenet" / "deploy.prototxt", upgrade=False)
    assert list(legacy.input) == ["data"] and list(legacy.input_dim) == [10, 3, 227, 227]
    net = upgrade_net(legacy)
    first = net.layer[0]
    assert (first.name, first.type, list(first.top)) == ("input", "Input", ["data"])
    assert [list(shape.dim) for shape in first.input_param.shape] == [[10, 3, 227, 227]]
    assert names_and_types(net)[1:4] == [("conv1", "Convolution"), ("relu1", "ReLU"),
                                         ("pool1", "Pooling")]
    assert names_and_types(net)[-1] == ("prob", "Softmax")
    assert not (net.input or net.input_dim or net.input_shape)
    assert len(legacy.input) == 1  # the argument is left as it was


V0_NET = """
name: "v0net"
input: "data"
input_dim: 10 input_dim: 3 input_dim: 32 input_dim: 32
layers { layer { name: "pad1" type: "padding" pad: 2 } bottom: "data" top: "pad1" }
layers {
  layer { name: "conv1" type: "conv" num_output: 8 kernelsize: 5 stride: 1 biasterm: false
          weight_filler { type: "gaussian" std: 0.01 }
          blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0 }
  bottom: "pad1" top: "conv1"
}
layers { layer { name: "relu1" type: "relu" } bottom: "conv1" top: "conv1" }
layers { layer { name: "pool1" type: "pool" pool: AVE kernelsize: 3 stride: 2 pad: 1 }
         bottom: "conv1" top: "pool1" }
layers { layer { name: "norm1" type: "lrn" local_size: 3 alpha: 0.0001 beta: 0.75 k: 2 }
         bottom: "pool1" top: "norm1" }
layers { layer { name: "fc" type: "innerproduct" num_output: 10 } bottom: "norm1" top: "fc" }
layers { layer { name: "drop" type: "dropout" dropout_ratio: 0.4 } bottom: "fc" top: "fc" }
layers { layer { name: "prob" type: "softmax" } bottom: "fc" top: "prob" }
"""


def test_v0_net_folds_padding_and_spreads_flat_fields_into_params():
    net = read_net(V0_NET, filename="v0.prototxt")
    assert names_and_types(net) == [
        ("input", "Input"), ("conv1", "Convolution"), ("relu1", "ReLU"), ("pool1", "Pooling"),
        ("norm1", "LRN"), ("fc", "InnerProduct"), ("drop", "Dropout"), ("prob", "Softmax")]
    conv = net.layer[1]
    assert list(conv.bottom) == ["data"]  # rewired past the padding layer
    params = conv.convolution_param
    assert (list(params.pad), list(params.kernel_size), list(params.stride)) == ([2], [5], [1])
    assert (params.num_output, params.bias_term, params.weight_filler.type) == (8, False, "gaussian")
    assert [(p.lr_mult, p.decay_mult) for p in conv.param] == [(1.0, 1.0), (2.0, 0.0)]
    pool = net.layer[3].pooling_param
    assert (pool.pool, pool.kernel_size, pool.stride, pool.pad) == (pool.AVE, 3, 2, 1)
    lrn = net.layer[4].lrn_param
    assert (lrn.local_size, lrn.alpha, lrn.beta, lrn.k) == pytest.approx((3, 1e-4, 0.75, 2))
    assert net.layer[5].inner_product_param.num_output == 10
    assert net.layer[6].dropout_param.dropout_ratio == pytest.approx(0.4)
    assert [list(s.dim) for s in net.layer[0].input_param.shape] == [[10, 3, 32, 32]]


def test_v0_data_layer_fields_go_to_data_and_transform_params():
    net = read_net("""layers { layer { name: "data" type: "data" source: "db" batchsize: 64
                   scale: 0.5 meanfile: "mean.binaryproto" cropsize: 27 mirror: true rand_skip: 3 }
                   top: "data" top: "label" }""")
    layer = net.layer[0]
    assert (layer.type, layer.data_param.source, layer.data_param.batch_size) == ("Data", "db", 64)
    assert layer.data_param.rand_skip == 3
    transform = layer.transform_param
    assert (transform.scale, transform.mean_file, transform.crop_size, transform.mirror) == (
        0.5, "mean.binaryproto", 27, True)
    assert not layer.data_param.HasField("scale")


def test_v0_problems_warn_or_fail_where_caffe_logs_or_aborts():
    with pytest.warns(CaffeUpgradeWarning, match="unknown parameter num_output for layer type 'relu'"):
        net = read_net('layers { layer { name: "r" type: "relu" num_output: 3 } bottom: "x" top: "x" }'
                       ' input: "x"')
    assert names_and_types(net) == [("r", "ReLU")]
    with pytest.raises(CaffeUpgradeError, match="unknown V0 layer type 'deconv'"):
        read_net('layers { layer { name: "d" type: "deconv" } }')
    with pytest.raises(CaffeUpgradeError, match="only conv and pool"):
        read_net('input: "x" layers { layer { name: "p" type: "padding" pad: 1 } bottom: "x" top: "p" }'
                 ' layers { layer { name: "r" type: "relu" } bottom: "p" top: "r" }')
    with pytest.raises(CaffeUpgradeError, match="unknown blob 'nowhere'"):
        read_net('layers { layer { name: "r" type: "relu" } bottom: "nowhere" top: "r" }')


def test_v1_data_transform_fields_move_to_transform_param():
    net = read_net("""layers { name: "d" type: DATA top: "data" top: "label"
                   data_param { source: "x" scale: 0.5 mean_file: "m" crop_size: 10 mirror: true } }""")
    layer = net.layer[0]
    assert (layer.transform_param.scale, layer.transform_param.mean_file) == (0.5, "m")
    assert (layer.transform_param.crop_size, layer.transform_param.mirror) == (10, True)
    assert layer.data_param.source == "x"
    assert not any(layer.data_param.HasField(f) for f in ("scale", "mean_file", "crop_size", "mirror"))


def test_v1_param_names_share_modes_rates_and_decays_become_param_specs():
    net = read_net("""layers { name: "ip" type: INNER_PRODUCT bottom: "x" top: "y"
                   param: "w" param: "b" blob_share_mode: PERMISSIVE blobs_lr: 1 weight_decay: 0
                   loss_weight: 2 inner_product_param { num_output: 5 }
                   include { phase: TEST stage: "s" } }""")
    layer = net.layer[0]
    first, second = layer.param
    assert (first.name, first.share_mode, first.lr_mult, first.decay_mult) == (
        "w", caffe_pb2.ParamSpec.PERMISSIVE, 1.0, 0.0)
    assert second.name == "b" and not second.HasField("lr_mult") and not second.HasField("share_mode")
    assert list(layer.loss_weight) == [2.0] and layer.inner_product_param.num_output == 5
    assert layer.include[0].phase == caffe_pb2.TEST and list(layer.include[0].stage) == ["s"]


def test_every_v1_layer_type_has_its_current_name():
    for value in caffe_pb2.V1LayerParameter.LayerType.values():
        assert value in V1_LAYER_TYPE_NAMES
    assert V1_LAYER_TYPE_NAMES[caffe_pb2.V1LayerParameter.SOFTMAX_LOSS] == "SoftmaxWithLoss"
    assert V1_LAYER_TYPE_NAMES[caffe_pb2.V1LayerParameter.IM2COL] == "Im2col"


def test_layer_and_layers_together_is_refused():
    with pytest.raises(CaffeUpgradeError, match="both `layer`"):
        read_net('layer { name: "a" type: "ReLU" } layers { name: "b" type: RELU }')


def test_input_shape_and_shapeless_inputs():
    net = read_net('input: "a" input: "b" input_shape { dim: 1 dim: 2 } input_shape { dim: 3 }'
                   ' layer { name: "c" type: "Concat" bottom: "a" bottom: "b" top: "c" }')
    assert names_and_types(net) == [("input", "Input"), ("c", "Concat")]
    assert list(net.layer[0].top) == ["a", "b"]
    assert [list(s.dim) for s in net.layer[0].input_param.shape] == [[1, 2], [3]]
    bare = read_net('input: "a" layer { name: "r" type: "ReLU" bottom: "a" top: "r" }')
    assert names_and_types(bare) == [("r", "ReLU")] and not bare.input  # old caffemodel style
    with pytest.raises(CaffeUpgradeError, match="need 8 input_dim values"):
        read_net('input: "a" input: "b" input_dim: 1 input_dim: 3 input_dim: 4 input_dim: 4')


def test_batchnorm_with_three_params_is_frozen():
    net = read_net("""
        layer { name: "bn" type: "BatchNorm" param { lr_mult: 1 } param { lr_mult: 1 }
                param { lr_mult: 1 decay_mult: 5 name: "keep" } }
        layer { name: "bn2" type: "BatchNorm" param { lr_mult: 1 } }""")
    assert [(p.lr_mult, p.decay_mult) for p in net.layer[0].param] == [(0.0, 0.0)] * 3
    assert net.layer[0].param[2].name == "keep"
    assert net.layer[1].param[0].lr_mult == 1.0  # only the three-param form is upgraded


def test_upgrade_is_idempotent_and_leaves_its_argument_alone():
    legacy = parse_net_text(V0_NET)
    before = legacy.SerializeToString()
    once = upgrade_net(legacy)
    assert legacy.SerializeToString() == before
    assert upgrade_net(once) == once and not needs_upgrade(once)


def test_solver_type_enum_becomes_type_string():
    names = {"SGD": "SGD", "NESTEROV": "Nesterov", "ADAGRAD": "AdaGrad", "RMSPROP": "RMSProp",
             "ADADELTA": "AdaDelta", "ADAM": "Adam"}
    for enum_name, type_name in names.items():
        solver = upgrade_solver(parse_solver_text(f"base_lr: 0.1 solver_type: {enum_name}"))
        assert solver.type == type_name and not solver.HasField("solver_type")
    with pytest.raises(CaffeUpgradeError, match="both"):
        upgrade_solver(parse_solver_text('solver_type: ADAM type: "Adam"'))


def test_snapshot_prefix_rule(tmp_path):
    path = tmp_path / "nets" / "my_solver.prototxt"
    path.parent.mkdir()
    path.write_text('base_lr: 0.01 lr_policy: "fixed"')
    assert read_solver(path).snapshot_prefix == str(tmp_path / "nets" / "my_solver")
    snapshots = tmp_path / "snaps"
    snapshots.mkdir()
    path.write_text(f'base_lr: 0.01 snapshot_prefix: "{snapshots}"')
    assert read_solver(path).snapshot_prefix == os.path.join(snapshots, "my_solver")
    path.write_text('base_lr: 0.01 snapshot_prefix: "runs/lenet"')
    assert read_solver(path).snapshot_prefix == "runs/lenet"  # not a directory: kept as written
    assert read_solver(path, upgrade=False).snapshot_prefix == "runs/lenet"
    untouched = caffe_pb2.SolverParameter()
    assert upgrade_snapshot_prefix(untouched, "a/b.prototxt").snapshot_prefix == "a/b"
    assert not untouched.HasField("snapshot_prefix")
