"""cgvm.onnx.export: a compiled function, a Caffe Net, a Keras-style model and a Theano-style
function written as ONNX pass onnx.checker (full_check) and give ONNX Runtime's outputs equal to
cgvm's own; fused ops of an optimized graph are lowered to standard ops."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import cgvm  # noqa: E402
import cgvm.caffe as caffe  # noqa: E402
import cgvm.keras as keras  # noqa: E402
import cgvm.onnx  # noqa: E402
import cgvm.theano as theano  # noqa: E402
import cgvm.theano.tensor as T  # noqa: E402
from cgvm.frontends.onnx.errors import OnnxExportError  # noqa: E402
from cgvm.ir import TensorType, input_value, param_value  # noqa: E402
from cgvm.ops import elementwise as E, linalg as L, nn as NN  # noqa: E402

rng = np.random.default_rng(0)


def run_ort(model, *arrays):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, dict(zip(names, arrays)))


def test_compiled_function_exports_and_runs_in_onnxruntime(tmp_path):
    ws = cgvm.Workspace()
    ws["w"] = rng.standard_normal((4, 3)).astype(np.float32)
    ws["b"] = rng.standard_normal(3).astype(np.float32)
    x = input_value(TensorType((None, 4), "float32"), "x")
    y = NN.softmax(E.tanh(E.add(L.matmul(x, param_value("w", TensorType((4, 3), "float32"))),
                                param_value("b", TensorType((3,), "float32")))), axis=1)
    fn = cgvm.compile([x], y, workspace=ws)
    path = tmp_path / "f.onnx"
    model = cgvm.onnx.export(fn, str(path))
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    assert {i.name for i in model.graph.initializer} >= {"w", "b"}
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param and not dim.dim_value            # the unknown batch stays symbolic
    for batch in (2, 7):
        xs = rng.standard_normal((batch, 4)).astype(np.float32)
        np.testing.assert_allclose(run_ort(model, xs)[0], fn(xs), rtol=1e-5, atol=1e-6)


TINY_NET = """
name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 1 dim: 12 dim: 12 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "gaussian" std: 0.5 }
                            bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "norm1" type: "LRN" bottom: "conv1" top: "norm1" lrn_param { local_size: 3 alpha: 0.1 beta: 0.75 } }
layer { name: "pool1" type: "Pooling" bottom: "norm1" top: "pool1" pooling_param { pool: MAX kernel_size: 3 stride: 2 } }
layer { name: "pool2" type: "Pooling" bottom: "pool1" top: "pool2" pooling_param { pool: AVE kernel_size: 2 stride: 1 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.3 }
                              bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "prob" type: "Softmax" bottom: "ip1" top: "prob" }
"""


def test_caffe_net_exports_and_matches(tmp_path):
    proto = tmp_path / "tiny.prototxt"
    proto.write_text(TINY_NET)
    caffe.set_random_seed(3)
    net = caffe.Net(str(proto), caffe.TEST)
    xs = rng.standard_normal((2, 1, 12, 12)).astype(np.float32)
    net.blobs["data"].data[...] = xs
    want = net.forward()["prob"].copy()
    model = cgvm.onnx.export(net, str(tmp_path / "tiny.onnx"))
    assert [i.name for i in model.graph.input] == ["data"]
    ops = {n.op_type for n in model.graph.node}
    assert {"Conv", "Relu", "LRN", "MaxPool", "AveragePool", "Softmax"} <= ops
    np.testing.assert_allclose(run_ort(model, xs)[0], want, rtol=1e-5, atol=1e-6)


def test_keras_model_exports_and_matches():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((8, 8, 3)), keras.layers.Conv2D(4, 3, activation="relu"),
                              keras.layers.MaxPooling2D(2), keras.layers.Flatten(),
                              keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(3, activation="softmax")])
    xs = rng.standard_normal((5, 8, 8, 3)).astype(np.float32)
    want = model.predict(xs, verbose=0)
    exported = cgvm.onnx.export(model, example=xs)
    np.testing.assert_allclose(run_ort(exported, xs)[0], want, rtol=1e-5, atol=1e-6)


def test_theano_function_exports_and_matches():
    x = T.matrix("x")
    w = theano.shared(rng.standard_normal((4, 5)).astype(np.float32), name="W")
    b = theano.shared(rng.standard_normal(5).astype(np.float32), name="b")
    h = T.tanh(T.dot(x, w) + b)
    f = theano.function([x], [T.nnet.softmax(h), T.max(h, axis=1), T.sqrt(T.abs_(h)).sum()])
    # floatX is float64 (Theano's default): x is float64 and the float32 weights are promoted, which
    # the export spells as Casts
    xs = rng.standard_normal((3, 4))
    exported = cgvm.onnx.export(f)
    for got, want in zip(run_ort(exported, xs), f(xs)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_optimized_graph_with_fused_ops_exports_as_standard_ops():
    torch = pytest.importorskip("torch")
    from benchmarks.torch_onnx_nets import ResNet18, export_bytes, randomize_batchnorm

    torch.manual_seed(0)
    net = randomize_batchnorm(ResNet18(width=4, classes=5)).eval()
    data = export_bytes(net, torch.randn(1, 3, 32, 32))
    imported = cgvm.onnx.load(data, workspace=cgvm.Workspace())
    fn = imported.compile()
    fused = {n.op.name for n in fn.graph.nodes}
    assert fused & {"conv_bias_act", "fused_elementwise", "gemm_bias_act"}, fused
    again = cgvm.onnx.export(fn, optimized=True)
    assert all(n.domain in ("", "ai.onnx") for n in again.graph.node)
    xs = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(run_ort(again, xs)[0], net(torch.from_numpy(xs)).detach().numpy(), rtol=1e-4,
                               atol=1e-5)


def test_an_op_without_lowering_is_named():
    from cgvm.ops import sorting as S

    x = input_value(TensorType((3,), "float32"), "x")
    fn = cgvm.compile([x], E.exp(S.sort(x, axis=0)), workspace=cgvm.Workspace())
    with pytest.raises(OnnxExportError, match="op sort has no ONNX lowering"):
        cgvm.onnx.export(fn)
