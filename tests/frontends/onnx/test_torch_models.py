"""Models exported by real PyTorch (torch.onnx.export) import into cgvm and match PyTorch's outputs,
their gradients match torch.autograd's, and an imported model fine-tunes (its loss falls) inside a
graph that also holds a Keras-style head and a Theano-style loss."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

import cgvm  # noqa: E402
import cgvm.keras as keras  # noqa: E402
import cgvm.onnx  # noqa: E402
import cgvm.theano as theano  # noqa: E402
import cgvm.theano.tensor as T  # noqa: E402
from cgvm.ir import TensorType, input_value  # noqa: E402
from cgvm.ops import reduce as R, elementwise as E  # noqa: E402
from benchmarks.torch_onnx_nets import LSTMNet, ResNet18, export_bytes, randomize_batchnorm  # noqa: E402


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    net = randomize_batchnorm(ResNet18(width=8, classes=10)).eval()
    return net, export_bytes(net, torch.randn(2, 3, 64, 64), dynamic_batch=True)


@pytest.fixture(scope="module")
def lstm():
    torch.manual_seed(1)
    net = LSTMNet().eval()
    return net, export_bytes(net, torch.randn(3, 5, 8))


def test_resnet18_shaped_matches_pytorch_for_two_batch_sizes(resnet):
    net, data = resnet
    model = cgvm.onnx.load(data, workspace=cgvm.Workspace())
    assert model.input_types()[0].shape == (None, 3, 64, 64)          # dim_param "batch" stays symbolic
    assert any(p.type.ndim == 4 for p in model.params.values())        # conv weights are parameters
    for batch in (2, 5):
        x = torch.randn(batch, 3, 64, 64)
        want = net(x).detach().numpy()
        got = model(x.numpy())
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_resnet18_shaped_compiles_with_a_symbolic_batch(resnet):
    net, data = resnet
    model = cgvm.onnx.load(data, workspace=cgvm.Workspace())
    fn = model.compile()
    x = torch.randn(3, 3, 64, 64)
    np.testing.assert_allclose(fn(x.numpy())[0], net(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_lstm_net_matches_pytorch(lstm):
    net, data = lstm
    model = cgvm.onnx.load(data, workspace=cgvm.Workspace())
    assert {n.op_type for n in model.proto.graph.node} >= {"LSTM"}
    x = torch.randn(3, 5, 8)
    np.testing.assert_allclose(model(x.numpy()), net(x).detach().numpy(), rtol=1e-5, atol=1e-5)


def test_gradients_through_imported_weights_match_torch_autograd(lstm):
    net, data = lstm
    ws = cgvm.Workspace()
    model = cgvm.onnx.load(data, workspace=ws)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)
    weights = rng.standard_normal((3, 4)).astype(np.float32)
    xv = input_value(TensorType(x.shape, "float32"), "x")
    (y,) = model.symbolic(xv)
    loss = R.sum(E.mul(y, weights))
    params = list(model.params.values())
    grads = cgvm.grad(loss, params)
    got = cgvm.compile([xv], list(grads), workspace=ws)(x)
    xt = torch.from_numpy(x)
    (net(xt) * torch.from_numpy(weights)).sum().backward()
    torch_grads = {name: p.grad.numpy() for name, p in net.named_parameters()}
    # each imported initializer is one torch parameter, or (LSTM W/R/B) a stack of several: compare by value
    matched = 0
    for p, g in zip(params, got):
        init = ws[p.name]
        for name, tp in net.named_parameters():
            if tp.detach().numpy().shape == init.shape and np.allclose(tp.detach().numpy(), init):
                np.testing.assert_allclose(g, torch_grads[name], rtol=1e-4, atol=1e-5)
                matched += 1
    assert matched >= 2  # at least the Linear head's weight and bias are compared one to one
    assert all(np.abs(g).sum() > 0 for g in got)


def test_fine_tune_imported_resnet_with_a_keras_head_and_a_theano_loss(resnet):
    _, data = resnet
    ws = cgvm.Workspace()
    model = cgvm.onnx.load(data, workspace=ws, prefix="onnx/")
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((8, 3, 64, 64)).astype(np.float32)
    ys = rng.integers(0, 3, 8)
    x = T.TensorType("float32", shape=(8, 3, 64, 64))("x")
    y = T.lvector("y")
    (features,) = model.symbolic(x)                   # the imported net: 10 outputs
    keras.utils.set_random_seed(0)
    previous = keras.backend.get_workspace()
    keras.backend.set_workspace(ws)
    try:
        head = keras.layers.Dense(3, name="onnx_head")  # a Keras-style layer on the ONNX part's output
        scores = T.as_tensor_variable(head(features))
    finally:
        keras.backend.set_workspace(previous)
    cost = T.mean(T.nnet.categorical_crossentropy(T.nnet.softmax(scores), y))
    params = [theano.shared_from_workspace(v, ws) for v in model.params.values()]
    params += [theano.shared_from_workspace(w) for w in head.trainable_weights]
    assert all(p.key.startswith("onnx/") for p in params[:len(model.params)])
    grads = theano.grad(cost, params)
    step = theano.function([x, y], cost, updates=[(p, p - np.float32(0.1) * g) for p, g in zip(params, grads)],
                           workspace=ws)
    before = {k: np.array(ws[k]) for k in model.params}
    losses = [float(step(xs, ys)) for _ in range(10)]
    assert losses[-1] < 0.95 * losses[0] and losses[-1] == min(losses), losses
    changed = [k for k in model.params if not np.allclose(before[k], ws[k])]
    assert len(changed) == len(model.params)           # every imported weight was trained
    # the trained weights are what the model now computes with
    out = model(xs)
    fresh = cgvm.onnx.load(data, workspace=cgvm.Workspace())(xs)
    assert not np.allclose(out, fresh)
