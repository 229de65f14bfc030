"""Layer selection by NetState rules and Split insertion, with Caffe's semantics and names."""
from __future__ import annotations


import pytest

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeNetError
from cgvm.frontends.caffe.filter import (
    filter_by_state, filter_net, insert_splits, layer_included, split_blob_name, split_layer_name,
    state_meets_rule, to_phase,
)
from cgvm.frontends.caffe.prototxt import parse_net_text, read_net
from shared_paths import SHARED_CAFFE_MODELS

MODELS = SHARED_CAFFE_MODELS
needs_models = pytest.mark.skipif(not MODELS.is_dir(), reason="shared/models/caffe not present")


def state(phase=caffe_pb2.TEST, level=0, stages=()) -> caffe_pb2.NetState:
    return caffe_pb2.NetState(phase=phase, level=level, stage=list(stages))


def rule(**fields) -> caffe_pb2.NetStateRule:
    return caffe_pb2.NetStateRule(**fields)


def test_empty_rule_is_always_met():
    assert state_meets_rule(state(), rule())
    assert state_meets_rule(state(caffe_pb2.TRAIN, 7, ["x"]), rule())


def test_phase_rule():
    assert state_meets_rule(state(caffe_pb2.TRAIN), rule(phase=caffe_pb2.TRAIN))
    assert not state_meets_rule(state(caffe_pb2.TEST), rule(phase=caffe_pb2.TRAIN))
    # An explicitly set TRAIN (= 0, the enum default) still counts as set.
    assert not state_meets_rule(state(caffe_pb2.TEST), caffe_pb2.NetStateRule(phase=0))


def test_min_and_max_level_are_inclusive():
    assert state_meets_rule(state(level=2), rule(min_level=2))
    assert not state_meets_rule(state(level=1), rule(min_level=2))
    assert state_meets_rule(state(level=2), rule(max_level=2))
    assert not state_meets_rule(state(level=3), rule(max_level=2))
    assert state_meets_rule(state(level=-1), rule(max_level=0))  # max_level 0 is a real bound
    assert not state_meets_rule(state(level=1), rule(max_level=0))
    assert state_meets_rule(state(level=2), rule(min_level=1, max_level=3))


def test_stage_needs_all_listed_and_not_stage_needs_none():
    both = rule(stage=["a", "b"])
    assert state_meets_rule(state(stages=["b", "a", "c"]), both)
    assert not state_meets_rule(state(stages=["a"]), both)
    avoid = rule(not_stage=["x", "y"])
    assert state_meets_rule(state(stages=["a"]), avoid)
    assert not state_meets_rule(state(stages=["a", "y"]), avoid)
    mixed = rule(phase=caffe_pb2.TEST, stage=["deploy"], not_stage=["debug"], min_level=1)
    assert state_meets_rule(state(caffe_pb2.TEST, 1, ["deploy"]), mixed)
    assert not state_meets_rule(state(caffe_pb2.TEST, 1, ["deploy", "debug"]), mixed)
    assert not state_meets_rule(state(caffe_pb2.TEST, 0, ["deploy"]), mixed)


def test_include_any_exclude_any_and_never_both():
    layer = caffe_pb2.LayerParameter(name="l")
    assert layer_included(layer, state())
    layer.include.add(phase=caffe_pb2.TRAIN)
    layer.include.add(stage=["s"])
    assert layer_included(layer, state(caffe_pb2.TRAIN))
    assert layer_included(layer, state(caffe_pb2.TEST, stages=["s"]))
    assert not layer_included(layer, state(caffe_pb2.TEST))
    excluded = caffe_pb2.LayerParameter(name="e")
    excluded.exclude.add(phase=caffe_pb2.TEST)
    excluded.exclude.add(min_level=3)
    assert layer_included(excluded, state(caffe_pb2.TRAIN, 2))
    assert not layer_included(excluded, state(caffe_pb2.TRAIN, 3))
    assert not layer_included(excluded, state(caffe_pb2.TEST))
    excluded.include.add(phase=caffe_pb2.TRAIN)
    with pytest.raises(CaffeNetError, match="'e' has both include and exclude"):
        layer_included(excluded, state())


NET_WITH_RULES = """
state { phase: TRAIN stage: "file-stage" level: 5 }
layer { name: "always" type: "Input" top: "x" }
layer { name: "train" type: "ReLU" bottom: "x" top: "t" include { phase: TRAIN } }
layer { name: "test" type: "ReLU" bottom: "x" top: "u" include { phase: TEST } }
layer { name: "staged" type: "ReLU" bottom: "x" top: "s" include { stage: "extra" } }
layer { name: "filestaged" type: "ReLU" bottom: "x" top: "f" include { stage: "file-stage" } }
layer { name: "deep" type: "ReLU" bottom: "x" top: "d" include { min_level: 2 } }
layer { name: "nodebug" type: "ReLU" bottom: "x" top: "n" exclude { stage: "debug" } }
"""


def kept(net: caffe_pb2.NetParameter) -> list[str]:
    return [layer.name for layer in net.layer]


def test_filter_net_sets_state_as_the_pycaffe_constructor_does():
    net = parse_net_text(NET_WITH_RULES)
    assert kept(filter_net(net, "TRAIN")) == ["always", "train", "filestaged", "nodebug"]
    assert kept(filter_net(net, caffe_pb2.TEST, level=2, stages=["extra", "debug"])) == [
        "always", "test", "staged", "filestaged", "deep"]
    filtered = filter_net(net, None, level=0)  # keep the file's phase; level is always set
    assert filtered.state.phase == caffe_pb2.TRAIN and filtered.state.level == 0
    assert list(filtered.state.stage) == ["file-stage"]
    assert kept(filter_by_state(net)) == ["always", "train", "filestaged", "deep", "nodebug"]
    assert len(net.layer) == 7  # the argument is left as it was


def test_to_phase():
    assert to_phase("train") == caffe_pb2.TRAIN and to_phase("TEST") == caffe_pb2.TEST
    assert to_phase(caffe_pb2.TEST) == 1
    with pytest.raises(ValueError):
        to_phase("deploy")


@needs_models
def test_lenet_train_and_test_nets():
    net = read_net(MODELS / "lenet" / "lenet_train_test.prototxt")
    train = filter_net(net, "TRAIN")
    assert [l.name for l in train.layer] == ["mnist", "conv1", "pool1", "conv2", "pool2", "ip1",
                                             "relu1", "ip2", "loss"]
    assert train.layer[0].data_param.source == "examples/mnist/mnist_train_lmdb"
    test = filter_net(net, "TEST")
    assert test.layer[0].data_param.source == "examples/mnist/mnist_test_lmdb"
    assert "accuracy" in [l.name for l in test.layer]


@needs_models
def test_mnist_autoencoder_test_stages():
    net = read_net(MODELS / "mnist_autoencoder" / "mnist_autoencoder.prototxt")
    on_train = filter_net(net, "TEST", stages=["test-on-train"])
    on_test = filter_net(net, "TEST", stages=["test-on-test"])
    sources = lambda n: [l.data_param.source for l in n.layer if l.type == "Data"]
    assert sources(on_train) == ["examples/mnist/mnist_train_lmdb"]
    assert sources(on_test) == ["examples/mnist/mnist_test_lmdb"]


def test_split_names_for_a_blob_feeding_two_layers():
    net = parse_net_text("""
        layer { name: "data" type: "Input" top: "data" }
        layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1" }
        layer { name: "a" type: "ReLU" bottom: "conv1" top: "a" }
        layer { name: "b" type: "Sigmoid" bottom: "conv1" top: "b" }
    """)
    split = insert_splits(net)
    assert [(l.name, l.type) for l in split.layer] == [
        ("data", "Input"), ("conv1", "Convolution"), ("conv1_conv1_0_split", "Split"),
        ("a", "ReLU"), ("b", "Sigmoid")]
    assert list(split.layer[2].bottom) == ["conv1"]
    assert list(split.layer[2].top) == ["conv1_conv1_0_split_0", "conv1_conv1_0_split_1"]
    assert list(split.layer[3].bottom) == ["conv1_conv1_0_split_0"]
    assert list(split.layer[4].bottom) == ["conv1_conv1_0_split_1"]
    assert split_layer_name("conv1", "conv1", 0) == "conv1_conv1_0_split"
    assert split_blob_name("conv1", "conv1", 0, 1) == "conv1_conv1_0_split_1"
    assert insert_splits(split) == split  # nothing left to split


def test_split_follows_the_latest_in_place_producer_and_counts_top_index():
    net = parse_net_text("""
        layer { name: "in" type: "Input" top: "x" top: "y" }
        layer { name: "relu" type: "ReLU" bottom: "y" top: "y" }
        layer { name: "c1" type: "Eltwise" bottom: "x" bottom: "y" top: "c1" }
        layer { name: "c2" type: "Eltwise" bottom: "y" bottom: "y" top: "c2" }
    """)
    split = insert_splits(net)
    assert [l.name for l in split.layer] == ["in", "relu", "y_relu_0_split", "c1", "c2"]
    assert list(split.layer[3].bottom) == ["x", "y_relu_0_split_0"]  # x has one consumer
    assert list(split.layer[4].bottom) == ["y_relu_0_split_1", "y_relu_0_split_2"]
    assert list(split.layer[1].bottom) == ["y"]  # the first production of y has one consumer


def test_loss_weight_counts_as_a_consumer_and_moves_to_split_top_zero():
    net = parse_net_text("""
        layer { name: "in" type: "Input" top: "x" top: "label" }
        layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip" loss_weight: 0.5 }
        layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
    """)
    split = insert_splits(net)
    ip, splitter, loss = split.layer[1], split.layer[2], split.layer[3]
    assert splitter.name == "ip_ip_0_split"
    assert list(splitter.top) == ["ip_ip_0_split_0", "ip_ip_0_split_1"]
    assert list(splitter.loss_weight) == [0.5, 0.0]
    assert list(ip.loss_weight) == []
    assert list(loss.bottom) == ["ip_ip_0_split_1", "label"]  # split top 0 carries the loss


@needs_models
def test_lenet_test_net_split_names_match_pycaffe():
    net = filter_net(read_net(MODELS / "lenet" / "lenet_train_test.prototxt"), "TEST")
    split = insert_splits(net)
    splits = {l.name: list(l.top) for l in split.layer if l.type == "Split"}
    assert splits == {"label_mnist_1_split": ["label_mnist_1_split_0", "label_mnist_1_split_1"],
                      "ip2_ip2_0_split": ["ip2_ip2_0_split_0", "ip2_ip2_0_split_1"]}


@needs_models
def test_googlenet_inception_output_feeds_four_branches():
    net = filter_net(read_net(MODELS / "bvlc_googlenet" / "train_val.prototxt"), "TRAIN")
    split = insert_splits(net)
    by_name = {l.name: l for l in split.layer}
    fan_out = by_name["inception_3a/output_inception_3a/output_0_split"]
    assert list(fan_out.bottom) == ["inception_3a/output"] and len(fan_out.top) == 4


def test_net_level_inputs_and_unknown_bottoms():
    net = parse_net_text('input: "x" layer { name: "a" type: "ReLU" bottom: "x" top: "a" }'
                         ' layer { name: "b" type: "ReLU" bottom: "x" top: "b" }')
    split = insert_splits(net)
    assert split.layer[0].name == "x_input_0_split"
    assert list(split.layer[1].bottom) == ["x_input_0_split_0"]
    with pytest.raises(CaffeNetError, match="unknown bottom blob 'ghost' \\(layer 'a', bottom index 0\\)"):
        insert_splits(parse_net_text('layer { name: "a" type: "ReLU" bottom: "ghost" top: "a" }'))
