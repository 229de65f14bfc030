"""Sums of squares: ``sum(square(x))`` and ``sum(x * x)`` over every axis as one sum_squares.

The rewrite is checked on the IR (what fires and what does not), on values against math.fsum
in float64, and its gradient path (taken before the passes, and sum_squares' own) against
central differences.
"""
import math

import numpy as np
import pytest

import cgvm
from cgvm.compiler.reductions import fuse_square_sums
from cgvm.ir import Graph, TensorType, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R
from cgvm.ops import shape as S

RNG = np.random.default_rng(7)


def _names(graph):
    return [n.op.name for n in graph.nodes]


def _fsum_squares(a):
    return math.fsum(float(v) ** 2 for v in np.asarray(a, np.float64).ravel())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("build", [lambda x: R.sum(E.square(x)), lambda x: R.sum(E.mul(x, x)),
                                   lambda x: R.sum(E.square(x), axis=(1, 0)), lambda x: R.sum(E.pow(x, 2.0))],
                         ids=["square", "x_times_x", "every_axis", "pow_2"])
def test_a_full_sum_of_squares_is_one_op(dtype, build):
    x = input_value(TensorType((None, None), dtype), "x")
    f = cgvm.compile([x], build(x))
    assert _names(f.graph) == ["sum_squares"]
    for shape in ((300, 200), (1, 7)):            # the BLAS dot and a small one
        xv = RNG.standard_normal(shape).astype(dtype)
        got = f(xv)
        assert got.dtype == np.dtype(dtype) and got.shape == ()
        np.testing.assert_allclose(got, _fsum_squares(xv), rtol=1e-5 if dtype == "float32" else 1e-13)


def test_strided_and_transposed_views_are_summed_too():
    x = input_value(TensorType((40, 30), "float64"), "x")
    f = cgvm.compile([x], R.sum(E.square(S.transpose(x))))
    assert "sum_squares" in _names(f.graph)
    xv = RNG.standard_normal((80, 30))[::2]       # neither C- nor Fortran-contiguous
    np.testing.assert_allclose(f(xv), _fsum_squares(xv), rtol=1e-13)


def test_what_is_not_rewritten():
    x = input_value(TensorType((4, 5), "float64"), "x")
    y = input_value(TensorType((4, 5), "float64"), "y")
    i = input_value(TensorType((4, 5), "int64"), "i")
    h = input_value(TensorType((4, 5), "float16"), "h")
    for out in (R.sum(E.square(x), axis=1),                 # not every axis
                R.sum(E.square(x), keepdims=True),           # a 1x1 result
                R.sum(E.mul(x, y)),                          # a dot of two values: not this pattern
                R.sum(E.square(i)),                          # integers
                R.sum(E.square(h)),                          # float16: NumPy's dot is no BLAS there
                R.sum(E.square(E.cast(h, dtype="float32")))):      # the cast stays, the sum is of float32
        g = fuse_square_sums(Graph([x, y, i, h], [out]))
        names = _names(g)
        assert ("sum_squares" in names) == (names[0] == "cast"), names


def test_the_square_stays_for_its_other_readers():
    x = input_value(TensorType((50, 40), "float64"), "x")
    sq = E.square(x)
    f = cgvm.compile([x], [R.sum(sq), E.exp(sq)])
    assert "sum_squares" in _names(f.graph)
    xv = RNG.standard_normal((50, 40)) * 0.1
    total, e = f(xv)
    np.testing.assert_allclose(total, _fsum_squares(xv), rtol=1e-13)
    np.testing.assert_allclose(e, np.exp(xv ** 2), rtol=1e-13)


def _numeric_grad(fn, x, eps=1e-6):
    g = np.zeros_like(x)
    for k in range(x.size):
        d = np.zeros_like(x)
        d.flat[k] = eps
        g.flat[k] = (fn(x + d) - fn(x - d)) / (2 * eps)
    return g


@pytest.mark.parametrize("penalty", [lambda w: R.sum(E.square(w)), lambda w: R.sum_squares(w)],
                         ids=["rewritten_sum_of_square", "sum_squares_op"])
def test_gradients_of_a_penalized_loss_match_central_differences(penalty):
    """cost = sum(tanh(w) * c) + 0.3 * sum(w ** 2): the penalty's value by sum_squares, its gradient
    (autodiff's, or sum_squares' own) beside the rest."""
    w = input_value(TensorType((6, 5), "float64"), "w")
    c = RNG.standard_normal((6, 5))
    cost = E.add(R.sum(E.mul(E.tanh(w), c)), E.mul(0.3, penalty(w)))
    f = cgvm.compile([w], [cost, cgvm.grad(cost, w)])
    assert "sum_squares" in _names(f.graph)
    wv = RNG.standard_normal((6, 5))
    value, grad = f(wv)
    np.testing.assert_allclose(value, np.sum(np.tanh(wv) * c) + 0.3 * _fsum_squares(wv), rtol=1e-13)
    np.testing.assert_allclose(grad, _numeric_grad(lambda v: float(f(v)[0]), wv), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(grad, (1 - np.tanh(wv) ** 2) * c + 0.6 * wv, rtol=1e-12)


def test_the_sum_keeps_its_name():
    x = input_value(TensorType((4, 5), "float64"), "x")
    total = R.sum(E.square(x))
    total.name = "penalty"
    (node,) = fuse_square_sums(Graph([x], [total])).nodes
    assert node.op.name == "sum_squares" and node.outputs[0].name == "penalty"
