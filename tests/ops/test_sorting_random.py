"""Ops added for the Theano frontend: sort/argsort/take_along_axis/scatter_along_axis, random_draw, gradient steering."""
import numpy as np
import pytest

import cgvm
from cgvm.errors import ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import grad_control as gc
from cgvm.ops import random as rnd
from cgvm.ops import sorting as srt
from harness import Case, check_case, check_grad

rng = np.random.default_rng(0)
X = rng.standard_normal((3, 5))
IDX = np.argsort(rng.standard_normal((3, 5)), axis=1)

CASES = [
    Case("sort_last", lambda x: srt.sort(x), [X], lambda x: np.sort(x, -1)),
    Case("sort_axis0", lambda x: srt.sort(x, axis=0), [X], lambda x: np.sort(x, 0), dynamic=True),
    Case("argsort", lambda x: srt.argsort(x, axis=-1), [X], lambda x: np.argsort(x, -1, kind="stable"), grad=False),
    Case("take_along", lambda x, i: srt.take_along_axis(x, i, axis=1), [X, IDX],
         lambda x, i: np.take_along_axis(x, i, 1)),
    Case("scatter_along", lambda g, x, i: srt.scatter_along_axis(g, x, i, axis=1), [X, X, IDX],
         lambda g, x, i: _scatter(g, i), grad_inputs=[0]),
    Case("stop_gradient", lambda x: gc.stop_gradient(x), [X], lambda x: x, grad=False),
    Case("grad_scale", lambda x: gc.grad_scale(x, scale=1.0), [X], lambda x: x),
]


def _scatter_reduce(x, idx, upd, axis, reduction):
    """torch.scatter_reduce(include_self=True) / ONNX ScatterElements as a loop over the updates."""
    out = x.copy()
    combine = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "max": max, "min": min}[reduction]
    for pos in np.ndindex(*idx.shape):
        target = list(pos)
        target[axis] = idx[pos]
        out[tuple(target)] = combine(out[tuple(target)], upd[pos])
    return out


# repeated indices along each axis; distinct values so max/min have no ties
SX = rng.permutation(12).reshape(3, 4).astype(np.float64) / 3.0 - 2.0
SIDX0 = np.array([[0, 2, 2, 1], [0, 0, 1, 1]])
SIDX1 = np.array([[3, 3, 0], [1, 2, 1], [0, 0, 0]])
SUPD0 = rng.standard_normal((2, 4))
SUPD1 = rng.standard_normal((3, 3))
ZX = np.array([0.0, 2.0, 0.0, 3.0])            # mul: zero in x (one factor, two factors) and in the updates
ZIDX = np.array([0, 0, 2, 3, 3, 1])
ZUPD = np.array([1.5, -2.0, 0.0, 0.0, 4.0, 0.5])

CASES += [
    Case(f"scatter_reduce_{red}_axis{axis}",
         (lambda red, axis: lambda x, i, u: srt.scatter_reduce(x, i, u, axis=axis, reduction=red))(red, axis),
         [SX, idx, upd], (lambda red, axis: lambda x, i, u: _scatter_reduce(x, i, u, axis, red))(red, axis),
         grad_inputs=[0, 2])
    for red in ("add", "mul", "max", "min") for axis, idx, upd in ((0, SIDX0, SUPD0), (1, SIDX1, SUPD1))
] + [
    Case("scatter_reduce_mul_zeros", lambda x, i, u: srt.scatter_reduce(x, i, u, axis=0, reduction="mul"),
         [ZX, ZIDX, ZUPD], lambda x, i, u: _scatter_reduce(x, i, u, 0, "mul"), grad_inputs=[0, 2]),
    Case("scatter_reduce_int_max", lambda x, i, u: srt.scatter_reduce(x, i, u, axis=0, reduction="max"),
         [np.array([1, 5, -3]), np.array([2, 2, 0]), np.array([7, -9, 0])],
         lambda x, i, u: _scatter_reduce(x, i, u, 0, "max"), grad=False),
    Case("scatter_reduce_float32_dynamic", lambda x, i, u: srt.scatter_reduce(x, i, u, axis=1, reduction="add"),
         [SX.astype(np.float32), SIDX1, SUPD1.astype(np.float32)],
         lambda x, i, u: _scatter_reduce(x, i, u, 1, "add"), dynamic=True, grad_inputs=[0, 2]),
]


def test_scatter_reduce_max_ties_share_the_gradient():
    x = input_value(TensorType((2,), "float64"), "x")
    u = input_value(TensorType((3,), "float64"), "u")
    idx = cgvm.ir.const_value(np.array([0, 0, 1]))
    y = srt.scatter_reduce(x, idx, u, axis=0, reduction="max")
    gx, gu = cgvm.grad(cgvm.ops.reduce.sum(y), [x, u])
    f = cgvm.compile([x, u], [y, gx, gu])
    got_y, got_gx, got_gu = f(np.array([2.0, 1.0]), np.array([2.0, 2.0, 0.5]))
    np.testing.assert_array_equal(got_y, [2.0, 1.0])
    np.testing.assert_allclose(got_gx, [1 / 3, 1.0])          # x[0] ties with two updates
    np.testing.assert_allclose(got_gu, [1 / 3, 1 / 3, 0.0])


def _scatter(g, i):
    out = np.zeros_like(g)
    for r in range(g.shape[0]):
        for c in range(g.shape[1]):
            out[r, i[r, c]] += g[r, c]
    return out


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case):
    check_grad(case)


def test_grad_scale_and_clip_rules():
    x = input_value(TensorType((3,), "float64"), "x")
    g1 = cgvm.grad(cgvm.ops.reduce.sum(cgvm.ops.elementwise.mul(gc.grad_scale(x, scale=3.0), x)), x)
    g2 = cgvm.grad(cgvm.ops.reduce.sum(cgvm.ops.elementwise.mul(gc.grad_clip(x, lower=-0.5, upper=0.5), 10.0)), x)
    f = cgvm.compile([x], [g1, g2])
    a, b = f(np.array([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(a, [4.0, 8.0, 12.0])
    np.testing.assert_allclose(b, [0.5, 0.5, 0.5])


def test_random_draw_is_a_function_of_the_state():
    state = input_value(TensorType((2,), "int64"), "state")
    shape = cgvm.ir.const_value(np.array([1000], dtype=np.int64))
    lo, hi = cgvm.ir.const_value(np.float64(2.0)), cgvm.ir.const_value(np.float64(3.0))
    u, nxt = rnd.random_draw(state, shape, lo, hi, dist="uniform", dtype="float64", static_shape=(1000,))
    f = cgvm.compile([state], [u, nxt])
    s0 = rnd.initial_state(7)
    a, s1 = f(s0)
    b, _ = f(s0)
    c, _ = f(s1)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c) and list(s1) == [7, 1]
    assert a.min() >= 2.0 and a.max() < 3.0 and abs(a.mean() - 2.5) < 0.05


def test_random_draw_bad_state_names_source():
    state = input_value(TensorType((2, 2), "int64"), "state")
    shape = cgvm.ir.const_value(np.array([3], dtype=np.int64))
    p = cgvm.ir.const_value(np.float64(0.5))
    with pytest.raises(ShapeError, match="test_sorting_random.py"):
        rnd.random_draw(state, shape, p, p, dist="binomial", dtype="int64")
