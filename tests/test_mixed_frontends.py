"""Caffe, Keras-style and Theano-style frontends in one graph, sharing one Workspace.

The shipped example (a Caffe LeNet trunk, a Keras head, a Theano-style loss) trains to the
accuracy the issue asks for; a parameter two frontends share is one array; gradients through a
mixed graph match numeric ones; ``caffe.symbolic_net`` takes inputs mid-net and says what is
wrong with inputs it cannot use.
"""
import importlib.util
import os

import numpy as np
import pytest

import cgvm
import cgvm.caffe as caffe
import cgvm.keras as keras
import cgvm.theano as theano
import cgvm.theano.tensor as T
from cgvm.frontends.caffe.errors import CaffeNetError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "mixed", "lenet_keras_theano.py")

# a LeNet in miniature: conv -> max pool -> inner product with an in-place TanH on its top
TINY_NET = """
name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 1 dim: 6 dim: 6 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "gaussian" std: 0.5 }
                            bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
        param { lr_mult: 1 } param { lr_mult: 2 }
        inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "act1" type: "TanH" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 3 } }
"""


def _load_example():
    spec = importlib.util.spec_from_file_location("lenet_keras_theano", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def keras_workspace():
    """A fresh Workspace that Keras weights go into for the test (the global setting is restored)."""
    ws = cgvm.Workspace()
    previous = keras.backend.get_workspace()
    keras.backend.set_workspace(ws)
    yield ws
    keras.backend.set_workspace(previous)


# --------------------------------------------------------------------------- the shipped example

def test_example_trains_lenet_trunk_keras_head_theano_loss():
    pytest.importorskip("sklearn")
    example = _load_example()
    lines = []
    result = example.train(epochs=4, log=lines.append)
    assert len(lines) == 4 and lines[-1].startswith("epoch 4")
    assert result["losses"][-1] < result["losses"][0]
    assert result["accuracy"] >= 0.95, lines
    ws = result["workspace"]
    # one Workspace holds the parameters of all three frontends under their own names
    for name in ("conv1/0", "conv1/1", "conv2/0", "ip1/0", "ip1/1", "keras/head/kernel", "keras/head/bias",
                 "theano.log_scale"):
        assert name in ws
    assert ws["ip1/0"].shape == (500, 800) and ws["keras/head/kernel"].shape == (500, 10)


# --------------------------------------------------------------------------- one array, several frontends

def test_keras_weight_and_theano_shared_variable_are_one_array(keras_workspace):
    ws = keras_workspace
    x = T.TensorType("float32", shape=(2, 4))("x")
    dense = keras.layers.Dense(3, use_bias=False, name="shared_dense")
    y = T.as_tensor_variable(dense(x))                # Theano-style variable over the Keras output
    W = theano.shared_from_workspace(dense.kernel)   # the Keras kernel as a Theano shared variable
    assert W.key == "keras/shared_dense/kernel"
    assert W.get_value(borrow=True) is ws[W.key]
    assert theano.shared_from_workspace(W.key, ws) is W
    assert theano.shared_from_workspace(dense.kernel) is W

    forward = theano.function([x], y, workspace=ws)
    double = theano.function([], [], updates=[(W, W * 2)], workspace=ws)
    xs = np.arange(8, dtype=np.float32).reshape(2, 4)
    before = dense.kernel.numpy()
    double()                                         # a Theano update ...
    np.testing.assert_array_equal(dense.kernel.numpy(), 2 * before)  # ... is what the Keras layer holds
    np.testing.assert_allclose(forward(xs), xs @ (2 * before), rtol=1e-6)
    dense.kernel.assign(np.ones((4, 3), np.float32))  # a Keras assignment ...
    np.testing.assert_array_equal(W.get_value(), np.ones((4, 3)))  # ... is what Theano reads
    np.testing.assert_allclose(forward(xs), xs @ np.ones((4, 3)), rtol=1e-6)


def test_caffe_blob_updated_by_theano_is_seen_by_a_caffe_net():
    ws = cgvm.Workspace()
    x = T.TensorType("float32", shape=(2, 1, 6, 6))("x")
    sym = caffe.symbolic_net(TINY_NET, inputs={"data": x}, outputs=["ip1"], workspace=ws, seed=1)
    net = caffe.Net(TINY_NET, caffe.TEST, workspace=ws)   # shares the blobs by name
    W = theano.shared_from_workspace(sym.params["ip1/0"], ws)
    assert W.get_value(borrow=True) is net.params["ip1"][0].data
    theano.function([], [], updates=[(W, W + 1)], workspace=ws)()
    np.testing.assert_array_equal(net.params["ip1"][0].data, W.get_value())
    data = np.random.default_rng(0).standard_normal((2, 1, 6, 6)).astype(np.float32)
    net.blobs["data"].data[...] = data
    net.forward()
    features = theano.function([x], T.as_tensor_variable(sym["ip1"]), workspace=ws)(data)
    np.testing.assert_allclose(features, net.blobs["ip1"].data, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- gradients of a mixed graph

def test_mixed_graph_gradients_match_numeric(keras_workspace):
    ws = keras_workspace
    rng = np.random.default_rng(3)
    x = T.TensorType("float64", shape=(2, 1, 6, 6))("x")
    labels = np.array([0, 2])
    trunk = caffe.symbolic_net(TINY_NET, inputs={"data": x}, outputs=["ip1"], workspace=ws, seed=2)
    assert list(trunk.params) == ["conv1/0", "conv1/1", "ip1/0", "ip1/1"]   # ip2 is not read
    assert trunk.param_infos["ip1/1"].lr_mult == 2
    head = keras.layers.Dense(3, activation="tanh", dtype="float64", name="grad_head")
    scores = T.as_tensor_variable(head(trunk["ip1"]))
    cost = T.mean(T.nnet.categorical_crossentropy(T.nnet.softmax(scores), labels)) + 0.1 * T.sum(scores ** 2)
    params = [theano.shared_from_workspace(v, ws) for v in trunk.params.values()]
    params += [theano.shared_from_workspace(w) for w in head.trainable_weights]
    grads = theano.function([x], theano.grad(cost, [x] + params), workspace=ws)
    loss = theano.function([x], cost, workspace=ws)

    xs = rng.standard_normal((2, 1, 6, 6))
    symbolic = grads(xs)

    def numeric(read, write, eps=1e-6):
        base = read().copy()
        out = np.zeros_like(base)
        for i in np.ndindex(base.shape):
            bumped = base.copy()
            bumped[i] += eps
            up = loss(write(bumped))
            bumped[i] -= 2 * eps
            down = loss(write(bumped))
            out[i] = (up - down) / (2 * eps)
        write(base)
        return out

    np.testing.assert_allclose(symbolic[0], numeric(lambda: xs, lambda v: v), rtol=1e-5, atol=1e-8)
    for p, g in zip(params, symbolic[1:]):
        def write(v, p=p):
            p.set_value(v)
            return xs
        np.testing.assert_allclose(g, numeric(lambda p=p: p.get_value(), write), rtol=1e-5, atol=1e-8,
                                   err_msg=p.key)


# --------------------------------------------------------------------------- symbolic_net's contract

def test_symbolic_net_inputs_mid_net_and_end_layer():
    ws = cgvm.Workspace()
    pooled = cgvm.input_value(cgvm.TensorType((2, 2, 2, 2), "float32"), "pooled")
    sym = caffe.symbolic_net(TINY_NET, inputs={"pool1": pooled}, outputs=["ip1"], workspace=ws, seed=0)
    assert list(sym.params) == ["ip1/0", "ip1/1"] and sym.layer_range == range(3, 5)
    before_tanh = caffe.symbolic_net(TINY_NET, inputs={"pool1": pooled}, outputs=["ip1"], end="ip1", workspace=ws)
    run = cgvm.compile([pooled], [sym["ip1"], before_tanh["ip1"]], workspace=ws)
    p = np.random.default_rng(1).standard_normal((2, 2, 2, 2)).astype(np.float32)
    after, before = run(p)
    expected = p.reshape(2, 8) @ ws["ip1/0"].T + ws["ip1/1"]
    np.testing.assert_allclose(before, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after, np.tanh(expected), rtol=1e-5, atol=1e-6)


def test_symbolic_net_refuses_inputs_it_cannot_use():
    with pytest.raises(CaffeNetError, match="unknown dimensions"):
        caffe.symbolic_net(TINY_NET, inputs={"data": T.tensor4("x")}, outputs=["ip1"])
    x = T.TensorType("float32", shape=(2, 1, 6, 6))("x")
    with pytest.raises(CaffeNetError, match="no blob 'conv9'"):
        caffe.symbolic_net(TINY_NET, inputs={"data": x}, outputs=["conv9"])
    with pytest.raises(CaffeNetError, match="ip1/0"):   # 8x8 images make ip1 wider than the prototxt's 6x6
        caffe.symbolic_net(TINY_NET, inputs={"data": T.TensorType("float32", shape=(2, 1, 8, 8))("x")},
                           outputs=["ip1"])
    with pytest.raises(TypeError, match="must be symbolic"):
        caffe.symbolic_net(TINY_NET, inputs={"data": np.zeros((2, 1, 6, 6), np.float32)})
