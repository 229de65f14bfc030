"""Net construction and the pycaffe surface: pycaffe's own test_net.py behaviours, filtering,
weights round trips, bad input naming file/line/layer, Python layers, the shared model zoo."""
import glob
import os
import sys
import textwrap

import numpy as np
import pytest

import cgvm.caffe as caffe
from cgvm.frontends.caffe.errors import CaffeError, CaffeNetError, CaffeParseError
from cgvm.frontends.caffe.prototxt import read_net_binary
from shared_paths import SHARED_CAFFE_MODELS

MODELS = str(SHARED_CAFFE_MODELS)

SIMPLE = """name: "testnet"
force_backward: true
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { num: 5 num: 5 channels: 2 channels: 1 height: 3 height: 1 width: 4 width: 1
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 11 kernel_size: 2 pad: 3
    weight_filler { type: "gaussian" std: 1 } bias_filler { type: "constant" value: 2 } }
  param { decay_mult: 1 } param { decay_mult: 0 } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip_blob"
  inner_product_param { num_output: 13 weight_filler { type: "gaussian" std: 2.5 }
    bias_filler { type: "constant" value: -3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip_blob" bottom: "label" top: "loss" }
"""


@pytest.fixture
def simple(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text(SIMPLE)
    return str(path)


def test_pycaffe_net_surface(simple):
    net = caffe.Net(simple, caffe.TRAIN, seed=1)
    assert net.inputs == [] and net.outputs == ["loss"]
    assert dict(net.top_names) == {"data": ["data", "label"], "conv": ["conv"], "ip": ["ip_blob"], "loss": ["loss"]}
    assert dict(net.bottom_names) == {"data": [], "conv": ["data"], "ip": ["conv"], "loss": ["ip_blob", "label"]}
    assert list(net.layer_dict) == net._layer_names
    assert [p.data.shape for p in net.params["conv"]] == [(11, 2, 2, 2), (11,)]
    assert np.all(net.params["conv"][1].data == 2) and np.all(net.params["ip"][1].data == -3)
    assert net.blob_loss_weights["loss"] == 1.0 and net.blob_loss_weights["ip_blob"] == 0.0
    assert [l.type for l in net.layers] == ["DummyData", "Convolution", "InnerProduct", "SoftmaxWithLoss"]
    assert net.blobs["data"].num == 5 and net.blobs["label"].count == 5 and net.blobs["data"].width == 4


def test_forward_backward_ranges(simple):
    net = caffe.Net(simple, caffe.TRAIN, seed=1)
    net.forward()
    out = net.forward(start="ip", end="ip")
    conv = net.blobs["conv"].data.reshape(5, -1)
    w, b = (p.data for p in net.params["ip"])
    np.testing.assert_allclose(out["ip_blob"], conv @ w.T + b, rtol=1e-5, atol=1e-4)
    net.blobs["ip_blob"].diff[...] = np.random.default_rng(0).normal(size=(5, 13))
    grads = net.backward(start="ip", end="ip")
    np.testing.assert_allclose(grads["conv"].reshape(5, -1), net.blobs["ip_blob"].diff @ w, rtol=1e-5, atol=1e-4)
    assert np.abs(net.params["ip"][0].diff).sum() > 0
    net.clear_param_diffs()
    assert all(np.all(p.diff == 0) for ps in net.params.values() for p in ps)


def test_loss_and_param_diffs_accumulate(simple):
    net = caffe.Net(simple, caffe.TRAIN, seed=1)
    net.forward()
    net.backward()
    once = net.params["conv"][0].diff.copy()
    net.backward()
    np.testing.assert_allclose(net.params["conv"][0].diff, 2 * once, rtol=1e-5)
    assert net.blobs["data"].diff.any()   # force_backward


def test_save_and_reload_both_constructors(simple, tmp_path):
    net = caffe.Net(simple, caffe.TRAIN, seed=1)
    path = str(tmp_path / "w.caffemodel")
    net.save(path)
    for other in (caffe.Net(simple, path, caffe.TRAIN, seed=2), caffe.Net(simple, caffe.TRAIN, weights=path, seed=3)):
        for name in net.params:
            for a, b in zip(net.params[name], other.params[name]):
                np.testing.assert_array_equal(a.data, b.data)
    h5 = str(tmp_path / "w.caffemodel.h5")
    net.save_hdf5(h5)
    third = caffe.Net(simple, caffe.TRAIN, seed=4)
    third.load_hdf5(h5)
    np.testing.assert_array_equal(third.params["ip"][0].data, net.params["ip"][0].data)


def test_corrupt_or_mismatched_caffemodel_never_half_loads(simple, tmp_path):
    net = caffe.Net(simple, caffe.TRAIN, seed=1)
    path = tmp_path / "w.caffemodel"
    net.save(str(path))
    data = path.read_bytes()
    (tmp_path / "cut.caffemodel").write_bytes(data[:len(data) // 2])
    target = caffe.Net(simple, caffe.TRAIN, seed=9)
    before = {n: [p.data.copy() for p in ps] for n, ps in target.params.items()}
    with pytest.raises(CaffeParseError):
        target.copy_from(str(tmp_path / "cut.caffemodel"))
    proto = read_net_binary(str(path))
    proto.layer[2].blobs[0].shape.dim[1] += 1            # ip weights no longer fit
    proto.layer[2].blobs[0].data.extend([0.0] * 13)
    (tmp_path / "bad.caffemodel").write_bytes(proto.SerializeToString())
    with pytest.raises(CaffeNetError, match="ip"):
        target.copy_from(str(tmp_path / "bad.caffemodel"))
    for name, arrays in before.items():
        for a, p in zip(arrays, target.params[name]):
            np.testing.assert_array_equal(a, p.data)


def test_levels_and_stages(tmp_path):
    rules = {"NoLevel": "", "Level0Only": "include { min_level: 0 max_level: 0 }",
             "Level1Only": "include { min_level: 1 max_level: 1 }", "Level>=0": "include { min_level: 0 }",
             "Level>=1": "include { min_level: 1 }", "A": 'include { stage: "A" }', "B": 'include { stage: "B" }',
             "AorB": 'include { stage: "A" } include { stage: "B" }', "AandB": 'include { stage: "A" stage: "B" }'}
    text = 'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 } } }\n'
    text += "".join(f'layer {{ name: "{n}" type: "Split" bottom: "data" top: "{n}" {r} }}\n' for n, r in rules.items())
    path = tmp_path / "levels.prototxt"
    path.write_text(text)
    def names(**kw):
        return [n for n in caffe.Net(str(path), caffe.TEST, **kw)._layer_names[1:] if not n.endswith("_split")]
    assert names() == ["NoLevel", "Level0Only", "Level>=0"]
    assert names(level=1) == ["NoLevel", "Level1Only", "Level>=0", "Level>=1"]
    assert names(stages=["A"]) == ["NoLevel", "Level0Only", "Level>=0", "A", "AorB"]
    assert names(stages=["A", "B"])[-4:] == ["A", "B", "AorB", "AandB"]


def test_splits_in_place_and_reshape():
    text = """layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "relu" type: "ReLU" bottom: "x" top: "x" }
layer { name: "a" type: "Power" bottom: "x" top: "a" power_param { scale: 2 } }
layer { name: "b" type: "Power" bottom: "x" top: "b" power_param { scale: 3 } }
"""
    net = caffe.Net(text, caffe.TEST)
    assert "x_relu_0_split_0" in net.blobs and "x_relu_0_split_1" in net.blobs
    assert net.outputs == ["a", "b"]
    out = net.forward(x=np.array([[-1, 2, 3], [4, -5, 6]], np.float32))
    np.testing.assert_allclose(out["a"], 2 * np.maximum([[-1, 2, 3], [4, -5, 6]], 0))
    net.blobs["x"].reshape(4, 3)
    net.blobs["x"].data[...] = 1
    out = net.forward()
    assert out["b"].shape == (4, 3) and np.all(out["b"] == 3)


@pytest.mark.parametrize("text, match", [
    ('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }\n'
     'layer { name: "odd" type: "Frobnicate" bottom: "x" top: "y" }', r"<string>:2: layer 'odd' \(Frobnicate\).*unknown"),
    ('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 1 } } }\n'
     'layer { name: "r" type: "ReLU" bottom: "nope" top: "y" }', r"<string>:2: layer 'r' \(ReLU\).*unknown bottom blob 'nope'"),
    ('layer { name: "in" type: "Input" top: "x" top: "y" input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 4 } } }\n'
     '\nlayer { name: "sum" type: "Eltwise" bottom: "x" bottom: "y" top: "z" }', r"<string>:3: layer 'sum' \(Eltwise\).*shape"),
    ('layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }\n'
     'layer { name: "c" type: "Convolution" bottom: "x" top: "y" convolution_param { num_output: 2 kernel_size: 3 } }',
     r"<string>:2: layer 'c' \(Convolution\)"),
])
def test_bad_nets_name_file_line_and_layer(text, match):
    with pytest.raises(CaffeError, match=match):
        caffe.Net(text, caffe.TEST)


def test_malformed_prototxt_names_file_and_line(tmp_path):
    path = tmp_path / "bad.prototxt"
    path.write_text('layer {\n  name: "x"\n  typo: "ReLU"\n}\n')
    with pytest.raises(CaffeParseError, match=r"bad.prototxt:3"):
        caffe.Net(str(path), caffe.TEST)


PYTHON_LAYERS = '''
import caffe_test_pylayers_base as base


class TimesTen(base.Layer):
    def setup(self, bottom, top):
        self.factor = float(self.param_str or 10)

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.factor * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = self.factor * top[0].diff


class ParameterLayer(base.Layer):
    def setup(self, bottom, top):
        self.blobs.add_blob(1)
        self.blobs[0].data[0] = 0

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] = 1


class Broken(base.Layer):
    def setup(self, bottom, top):
        raise RuntimeError("setup failed on purpose")
'''


@pytest.fixture
def pylayers(tmp_path, monkeypatch):
    import types

    base = types.ModuleType("caffe_test_pylayers_base")
    base.Layer = caffe.Layer
    monkeypatch.setitem(sys.modules, "caffe_test_pylayers_base", base)
    (tmp_path / "caffe_test_pylayers.py").write_text(textwrap.dedent(PYTHON_LAYERS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("caffe_test_pylayers", None)


def _python_net(layers, **kwargs):
    text = 'input: "data" input_shape { dim: 10 dim: 9 dim: 8 }\n'
    bottom = "data"
    for i, (cls, param_str) in enumerate(layers):
        text += (f'layer {{ type: "Python" name: "p{i}" bottom: "{bottom}" top: "p{i}" python_param {{ '
                 f'module: "caffe_test_pylayers" layer: "{cls}" param_str: "{param_str}" }} }}\n')
        bottom = f"p{i}"
    return caffe.Net("force_backward: true\n" + text, caffe.TEST, **kwargs)


def test_python_layers_need_opt_in(pylayers):
    with pytest.raises(CaffeNetError, match="allow_python_layers=True"):
        _python_net([("TimesTen", "")])


def test_python_layers_forward_backward(pylayers):
    net = _python_net([("TimesTen", ""), ("TimesTen", ""), ("TimesTen", "")], allow_python_layers=True)
    net.blobs["data"].data[...] = 8
    net.forward()
    assert np.all(net.blobs["p2"].data == 8000)
    net.blobs["p2"].diff[...] = 7
    net.backward()
    assert np.all(net.blobs["data"].diff == 7000)
    net.blobs["data"].reshape(4, 4, 4, 4)
    net.forward()
    assert all(b.data.shape == (4, 4, 4, 4) for b in net.blobs.values())
    with_str = _python_net([("TimesTen", "10"), ("TimesTen", "2")], allow_python_layers=True)
    with_str.blobs["data"].data[...] = 8
    assert np.all(with_str.forward()["p1"] == 160)


def test_python_layer_params_and_setup_errors(pylayers, tmp_path):
    net = _python_net([("ParameterLayer", "")], allow_python_layers=True)
    net.forward()
    net.backward()
    blob = net.params["p0"][0]
    assert blob.data[0] == 0 and blob.diff[0] == 1
    blob.data[...] += blob.diff
    path = str(tmp_path / "p.caffemodel")
    net.save(path)
    blob.data[...] = -1
    net.copy_from(path)
    assert net.params["p0"][0].data[0] == 1
    with pytest.raises(RuntimeError, match="on purpose"):
        _python_net([("Broken", "")], allow_python_layers=True)


MODEL_FILES = sorted(f for f in glob.glob(f"{MODELS}/**/*.prototxt", recursive=True) if "solver" not in f)


# image shapes of the data sets the shared nets read (examples/... paths, relative to the working directory)
_DATASET_SHAPES = {"siamese": (2, 28, 28), "mnist": (1, 28, 28), "cifar10": (3, 32, 32), "imagenet": (3, 256, 256)}


def _write_tiny_sources(text: str) -> None:
    """A 4-record LMDB at every data_param source the net names, shaped like its data set."""
    import re

    from cgvm.frontends.caffe.digits import write_lmdb

    from cgvm.frontends.caffe.io import array_to_blobproto

    for source in set(re.findall(r'source:\s*"([^"]+)"', text)):
        shape = next(v for k, v in _DATASET_SHAPES.items() if k in source)
        images = np.random.default_rng(0).integers(0, 256, (4,) + shape).astype(np.uint8)
        os.makedirs(os.path.dirname(source), exist_ok=True)
        write_lmdb(source, images, np.arange(4) % 2)
    for mean_file in set(re.findall(r'mean_file:\s*"([^"]+)"', text)):
        shape = next(v for k, v in _DATASET_SHAPES.items() if k in mean_file or k.replace("10", "") in mean_file
                     or (k == "imagenet" and "ilsvrc" in mean_file))
        os.makedirs(os.path.dirname(mean_file), exist_ok=True)
        with open(mean_file, "wb") as f:
            f.write(array_to_blobproto(np.full((1,) + shape, 100.0, np.float32)).SerializeToString())


# the stages a net's solver runs its test nets with (the TEST phase has no data layer without one)
_TEST_STAGES = {"mnist_autoencoder.prototxt": ["test-on-test"]}


@pytest.mark.skipif(not os.path.isdir(MODELS), reason="no shared Caffe models")
@pytest.mark.parametrize("path", MODEL_FILES, ids=[os.path.relpath(p, MODELS) for p in MODEL_FILES])
def test_every_shared_net_builds(path, tmp_path, monkeypatch):
    from cgvm.frontends.caffe.net import Net

    text = open(path).read()
    monkeypatch.chdir(tmp_path)
    if 'type: "Data"' in text or "type: DATA" in text:
        _write_tiny_sources(text)
    for phase in (caffe.TRAIN, caffe.TEST):
        stages = _TEST_STAGES.get(os.path.basename(path), []) if phase == caffe.TEST else []
        net = Net(path, phase, stages=stages)
        assert net.outputs and all(net.blobs[b].count >= 1 for b in net.outputs)


def test_partial_backward_gives_diffs_to_bottoms_that_need_backward(tmp_path):
    """Caffe computes a bottom's diff wherever something learnable lies upstream, force_backward or not:
    backward over [ip, loss] alone must still hand pool its diff (conv's weights are below it)."""
    proto = tmp_path / "net.prototxt"
    proto.write_text(textwrap.dedent("""
        name: "partial"
        layer { name: "data" type: "Input" top: "data" top: "label"
                input_param { shape { dim: 2 dim: 1 dim: 6 dim: 6 } shape { dim: 2 } } }
        layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
                convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "gaussian" std: 0.5 } } }
        layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
        layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
                inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 } } }
        layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
    """))
    net = caffe.Net(str(proto), caffe.TRAIN)
    rng = np.random.default_rng(0)
    net.blobs["data"].data[...] = rng.standard_normal((2, 1, 6, 6))
    net.blobs["label"].data[...] = [1, 3]
    net.forward()
    net.backward()
    full = net.blobs["pool"].diff.copy()
    assert np.abs(full).sum() > 0
    net.blobs["pool"].diff[...] = 0
    net.backward(start="loss", end="ip")
    np.testing.assert_allclose(net.blobs["pool"].diff, full, rtol=1e-6)
    assert np.all(net.blobs["data"].diff == 0)  # nothing learnable above the input: no diff without force_backward
