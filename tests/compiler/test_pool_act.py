"""max_pool(relu(z)) -> relu(max_pool(z)) with its gradient: same results, ties included."""
import numpy as np
import pytest

import cgvm
from cgvm.compiler import pass_names
from cgvm.compiler.pool_act import pool_before_activation
from cgvm.ir import Graph, TensorType, input_value, param_value
from cgvm.ops import conv as C
from cgvm.ops import elementwise as E
from cgvm.ops import pool as P
from cgvm.ops import reduce as R

RNG = np.random.default_rng(7)


def _ops(graph):
    return [n.op.name for n in graph.nodes]


def _training_graph(x_shape, slope=0.0, pool=None, read_twice=False):
    """conv -> relu -> max_pool -> weighted sum; loss and the gradients of x and w."""
    pool = pool or {"kernel": (2, 2)}
    ws = cgvm.Workspace()
    ws["w"] = RNG.standard_normal((3, x_shape[1], 3, 3)).astype(np.float32)
    x = input_value(TensorType((None,) + tuple(x_shape[1:])), "x")
    r = input_value(TensorType((None, 3, None, None)), "r")
    w = param_value("w", TensorType(ws["w"].shape))
    a = E.relu(C.conv(x, w, pad=1), negative_slope=slope)
    p = P.max_pool(a, **pool)
    loss = R.sum(E.mul(p, r))
    if read_twice:
        loss = E.add(loss, R.sum(a))
    gx, gw = cgvm.grad(loss, [x, w])
    return ws, [x, r], [loss, gx, gw, p]


def _pair(ws, ins, outs):
    everything = cgvm.compile(ins, outs, workspace=ws)
    without = cgvm.compile(ins, outs, workspace=ws, passes=[p for p in pass_names() if p != "pool_act"])
    return everything, without


@pytest.mark.parametrize("slope", [0.0, 0.1])
@pytest.mark.parametrize("pool,shape", [({"kernel": (2, 2)}, (2, 2, 6, 6)),
                                        ({"kernel": (2, 2)}, (1, 2, 7, 5)),           # floor mode rest
                                        ({"kernel": (3, 3), "stride": (2, 2)}, (2, 2, 7, 7)),   # overlapping
                                        ({"kernel": (2, 3), "stride": (1, 2), "pad": (1, 1)}, (2, 1, 5, 6))])
def test_same_values_and_gradients_with_many_ties(slope, pool, shape):
    ws, ins, outs = _training_graph(shape, slope, pool)
    f, bare = _pair(ws, ins, outs)
    assert "relu_grad" in _ops(bare.graph)
    moved = [n for n in f.graph.nodes if n.op.name in ("max_pool", "relu", "conv_bias_act")]
    assert [n.op.name for n in moved][:2] == ["max_pool", "relu"]     # the activation after the pool
    # integer inputs and weights: many exact ties in the windows, and exact zeros after relu
    x = RNG.integers(-2, 3, shape).astype(np.float32)
    ws["w"] = RNG.integers(-1, 2, ws["w"].shape).astype(np.float32)
    y = bare(x, np.ones((shape[0], 3, 1, 1), np.float32))[3]
    r = RNG.standard_normal(y.shape).astype(np.float32)
    for got, want in zip(f(x, r), bare(x, r)):
        np.testing.assert_array_equal(got, want)


def test_gradient_matches_a_numpy_reference():
    """Independent of the old graph: d/dz of sum(r * relu(maxpool2x2(z))) routed by hand."""
    z = input_value(TensorType((1, 1, 4, 4)), "z")
    r = input_value(TensorType((1, 1, 2, 2)), "r")
    loss = R.sum(E.mul(P.max_pool(E.relu(z), kernel=(2, 2)), r))
    f = cgvm.compile([z, r], [loss, cgvm.grad(loss, [z])[0]])
    assert "relu_grad" in _ops(f.graph) and _ops(f.graph).index("max_pool") < _ops(f.graph).index("relu")
    zv = np.array([[1, 3, -1, -2], [3, 0, -3, -1], [0, 0, 5, 2], [0, -1, 1, 5]], np.float32).reshape(1, 1, 4, 4)
    rv = np.array([[2, 3], [4, 5]], np.float32).reshape(1, 1, 2, 2)
    want = np.zeros((4, 4), np.float32)
    want[0, 1] = 2      # first maximum (3) of the top-left window, row-major order
    want[2, 2] = 5      # 5 at (2, 2) before 5 at (3, 3); the top-right window's max is -1: relu' = 0
    loss_v, gz = f(zv, rv)
    assert loss_v == pytest.approx(2 * 3 + 4 * 0 + 5 * 5)
    np.testing.assert_array_equal(gz.reshape(4, 4), want)


def test_left_alone_when_the_activation_is_read_elsewhere():
    ws, ins, outs = _training_graph((2, 2, 6, 6), read_twice=True)
    graph = cgvm.compile(ins, outs, workspace=ws, passes=["simplify"]).graph
    assert pool_before_activation(graph) is graph


def test_left_alone_when_the_activation_is_an_output():
    z = input_value(TensorType((1, 1, 4, 4)), "z")
    a = E.relu(z)
    graph = Graph([z], [P.max_pool(a, kernel=(2, 2)), a])
    assert pool_before_activation(graph) is graph


def test_inference_graph_pools_first():
    z = input_value(TensorType((None, 2, 6, 6)), "z")
    f = cgvm.compile([z], P.max_pool(E.relu(z), kernel=(2, 2)))
    assert _ops(f.graph) == ["max_pool", "relu"]
    v = RNG.standard_normal((3, 2, 6, 6)).astype(np.float32)
    want = np.maximum(v, 0).reshape(3, 2, 3, 2, 3, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(f(v), want)


@pytest.mark.parametrize("axis,keepdims", [((0, 2, 3), False), ((2, 3), True), (None, False)])
def test_sums_of_routed_gradients_over_the_planes_read_g(axis, keepdims):
    x = input_value(TensorType((None, 3, 7, 6)), "x")
    g = input_value(TensorType((None, 3, 3, 3)), "g")
    routed = P.max_pool_grad(x, g, P.max_pool(x, kernel=(2, 2)), kernel=(2, 2))
    total = R.sum(routed, axis=axis, keepdims=keepdims)
    f = cgvm.compile([x, g], [total, routed])
    sums = [n for n in f.graph.nodes if n.op.name == "sum"]
    assert len(sums) == 1 and sums[0].inputs[0] is f.graph.inputs[1]
    xv = RNG.integers(-2, 3, (2, 3, 7, 6)).astype(np.float32)      # ties: still one element per window
    gv = RNG.standard_normal((2, 3, 3, 3)).astype(np.float32)
    got, dx = f(xv, gv)
    np.testing.assert_allclose(got, np.sum(dx, axis=axis, keepdims=keepdims), rtol=1e-5, atol=1e-5)


def test_a_sum_keeping_a_spatial_axis_reads_the_routed_gradient():
    x = input_value(TensorType((None, 3, 6, 6)), "x")
    g = input_value(TensorType((None, 3, 3, 3)), "g")
    total = R.sum(P.max_pool_grad(x, g, P.max_pool(x, kernel=(2, 2)), kernel=(2, 2)), axis=(0, 2))
    f = cgvm.compile([x, g], total)
    assert [n.op.name for n in f.graph.nodes if n.op.name == "sum"] == ["sum"]
    assert f.graph.nodes[-1].inputs[0].node.op.name == "max_pool_grad"
