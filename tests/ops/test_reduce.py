"""Reductions, arg-reductions, cumsum and sum_to_like against NumPy references, and their gradients."""
import math

import numpy as np
import pytest

import cgvm
from cgvm.errors import GraphBuildError, ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R
from cgvm.ops import indexing as I
from cgvm.ops import shape as S
from harness import Case, check_case, check_grad

# log(0) = -inf is the right logsumexp of a row of -inf; NumPy warns about it on the way
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")

rng = np.random.default_rng(3)


def r(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def ints(*shape, dtype=np.int32):
    return rng.integers(-5, 6, size=shape).astype(dtype)


def sum_squares_ref(a):
    """math.fsum of the squares in float64, in a's dtype."""
    return np.asarray(math.fsum(float(v) ** 2 for v in np.asarray(a, np.float64).ravel()), a.dtype)


def distinct(*shape):
    """Shuffled, well separated values: max/min and their gradients have no ties."""
    n = int(np.prod(shape))
    return (rng.permutation(n).reshape(shape) * 0.37 - 1.0).astype(np.float32)


def logsumexp_ref(a, axis=None, keepdims=False):
    """Loops over the reduced entries with math.fsum, shifted by the maximum."""
    a = np.asarray(a, np.float64)
    axes = tuple(range(a.ndim)) if axis is None else tuple(ax % a.ndim for ax in np.atleast_1d(axis))
    moved = np.moveaxis(a, axes, tuple(range(a.ndim - len(axes), a.ndim)))
    lead = moved.shape[:a.ndim - len(axes)]
    flat = moved.reshape(lead + (-1,))
    out = np.empty(lead)
    for idx in np.ndindex(*lead):
        row = flat[idx]
        m = max(row)
        out[idx] = m + math.log(math.fsum(math.exp(v - m) for v in row))
    if keepdims:
        out = np.expand_dims(out, axes)
    return out


def cumsum_ref(a, axis=None, reverse=False):
    if axis is None:
        a, axis = a.reshape(-1), 0
    moved = np.moveaxis(a.astype(np.float64), axis, 0)
    out = np.zeros_like(moved)
    order = range(moved.shape[0] - 1, -1, -1) if reverse else range(moved.shape[0])
    acc = np.zeros(moved.shape[1:])
    for i in order:
        acc = acc + moved[i]
        out[i] = acc
    return np.moveaxis(out, 0, axis)


def second_derivative(op):
    """build(x) -> grad(sum(op(x) * w), x) for fixed weights: check_grad on it checks second derivatives."""
    def build(x):
        y = op(x)
        w = np.linspace(0.5, 1.5, int(np.prod(y.shape)) or 1).reshape(y.shape).astype(y.dtype.np)
        return cgvm.grad(R.sum(E.mul(y, w)), x)
    return build


SUMS = [
    Case("sum_all", R.sum, [r(3, 4)], np.sum),
    Case("sum_axis", lambda x: R.sum(x, axis=1), [r(3, 4)], lambda a: a.sum(axis=1)),
    Case("sum_negative_axes_keepdims", lambda x: R.sum(x, axis=(-1, 0), keepdims=True), [r(2, 3, 4)],
         lambda a: a.sum(axis=(0, 2), keepdims=True)),
    Case("sum_dynamic", lambda x: R.sum(x, axis=-2), [r(2, 3, 4)], lambda a: a.sum(axis=1), dynamic=True),
    # sum_squares: one BLAS dot where x is a contiguous float32/float64 NumPy array, else sum(square(x))
    Case("sum_squares", R.sum_squares, [r(3, 4)], lambda a: sum_squares_ref(a)),
    Case("sum_squares_blas_float64", R.sum_squares, [r(300, 250, dtype=np.float64)], lambda a: sum_squares_ref(a),
         rtol=1e-12, grad=False),
    Case("sum_squares_blas_float32", R.sum_squares, [r(300, 250)], lambda a: sum_squares_ref(a), rtol=1e-5,
         grad=False),
    Case("sum_squares_strided", lambda x: R.sum_squares(I.slice(S.transpose(x), steps=(2,), axes=(0,))), [r(6, 8)],
         lambda a: sum_squares_ref(a.T[::2])),
    Case("sum_squares_dynamic_3d", R.sum_squares, [r(2, 3, 4, dtype=np.float64)], lambda a: sum_squares_ref(a),
         dynamic=True),
    Case("sum_squares_0d", R.sum_squares, [np.array(-1.5)], lambda a: sum_squares_ref(a)),
    Case("sum_int32_gives_int64", lambda x: R.sum(x, axis=0), [ints(3, 4)], lambda a: a.sum(axis=0), grad=False),
    Case("sum_bool_counts", R.sum, [ints(3, 4) > 0], np.sum, grad=False),
    Case("sum_uint8_gives_uint64", R.sum, [ints(5).astype(np.uint8)], np.sum, grad=False),
    Case("mean_all", R.mean, [r(3, 4)], np.mean),
    Case("mean_axes_keepdims", lambda x: R.mean(x, axis=(0, 2), keepdims=True), [r(2, 3, 2)],
         lambda a: a.mean(axis=(0, 2), keepdims=True)),
    Case("mean_dynamic", lambda x: R.mean(x, axis=-1), [r(3, 4)], lambda a: a.mean(axis=-1), dynamic=True),
    Case("mean_int_gives_float64", lambda x: R.mean(x, axis=1), [ints(3, 4)], lambda a: a.mean(axis=1), grad=False),
    Case("prod_all", R.prod, [r(2, 3)], np.prod),
    Case("prod_axis", lambda x: R.prod(x, axis=0), [r(3, 4)], lambda a: a.prod(axis=0)),
    Case("prod_with_zeros", lambda x: R.prod(x, axis=1, keepdims=True),
         [np.array([[1.5, 0.0, -2.0, 0.5], [0.0, 3.0, 0.0, 1.0], [1.2, -0.7, 2.0, 0.9]], np.float32)],
         lambda a: a.prod(axis=1, keepdims=True)),
    Case("prod_dynamic", lambda x: R.prod(x, axis=1), [r(2, 3)], lambda a: a.prod(axis=1), dynamic=True),
    Case("prod_int", R.prod, [ints(4, dtype=np.int16)], np.prod, grad=False),
]

EXTREMES = [
    Case("max_all", R.max, [distinct(3, 4)], np.max),
    Case("max_axis", lambda x: R.max(x, axis=-1), [distinct(3, 4)], lambda a: a.max(axis=-1)),
    Case("max_axes_keepdims", lambda x: R.max(x, axis=(0, 2), keepdims=True), [distinct(2, 3, 2)],
         lambda a: a.max(axis=(0, 2), keepdims=True)),
    Case("max_dynamic", lambda x: R.max(x, axis=0), [distinct(3, 4)], lambda a: a.max(axis=0), dynamic=True),
    Case("min_axis", lambda x: R.min(x, axis=1), [distinct(3, 4)], lambda a: a.min(axis=1)),
    Case("min_keepdims", lambda x: R.min(x, keepdims=True), [distinct(2, 3)], lambda a: a.min(keepdims=True)),
    Case("min_int", lambda x: R.min(x, axis=0), [ints(3, 4)], lambda a: a.min(axis=0), grad=False),
    Case("argmax_flat", R.argmax, [distinct(3, 4)], lambda a: np.int64(a.argmax()), grad=False),
    Case("argmax_axis", lambda x: R.argmax(x, axis=1), [distinct(3, 4)], lambda a: a.argmax(axis=1), grad=False),
    Case("argmax_negative_axis_keepdims", lambda x: R.argmax(x, axis=-2, keepdims=True), [distinct(2, 3, 4)],
         lambda a: np.expand_dims(a.argmax(axis=1), 1), grad=False),
    Case("argmax_flat_keepdims", lambda x: R.argmax(x, keepdims=True), [distinct(2, 3)],
         lambda a: np.full((1, 1), a.argmax(), np.int64), grad=False),
    Case("argmax_first_of_ties", lambda x: R.argmax(x, axis=0), [np.array([1, 3, 3, 2], np.int32)],
         lambda a: np.int64(1), grad=False),
    Case("argmin_axis_dynamic", lambda x: R.argmin(x, axis=0), [distinct(3, 4)], lambda a: a.argmin(axis=0),
         dynamic=True, grad=False),
    Case("argmin_flat", R.argmin, [distinct(4, 2)], lambda a: np.int64(a.argmin()), grad=False),
]

MOMENTS = [
    Case("var_all", R.var, [r(3, 4)], np.var),
    Case("var_axis_ddof1", lambda x: R.var(x, axis=0, ddof=1), [r(4, 3)], lambda a: a.var(axis=0, ddof=1)),
    Case("var_axes_keepdims", lambda x: R.var(x, axis=(-1, 0), keepdims=True), [r(2, 3, 2)],
         lambda a: a.var(axis=(0, 2), keepdims=True)),
    Case("var_dynamic_ddof1", lambda x: R.var(x, axis=1, ddof=1), [r(2, 5)], lambda a: a.var(axis=1, ddof=1),
         dynamic=True),
    Case("var_int_gives_float64", R.var, [ints(6)], np.var, grad=False),
    Case("std_all", R.std, [r(3, 4)], np.std),
    Case("std_axis_ddof1_keepdims", lambda x: R.std(x, axis=-1, ddof=1, keepdims=True), [r(3, 4)],
         lambda a: a.std(axis=-1, ddof=1, keepdims=True)),
    Case("std_dynamic", lambda x: R.std(x, axis=0), [r(4, 3)], lambda a: a.std(axis=0), dynamic=True),
    Case("logsumexp_all", R.logsumexp, [r(3, 4)], logsumexp_ref),
    Case("logsumexp_axis", lambda x: R.logsumexp(x, axis=1), [r(3, 4)], lambda a: logsumexp_ref(a, 1)),
    Case("logsumexp_large_values", lambda x: R.logsumexp(x, axis=-1, keepdims=True), [r(2, 3) * 3 + 1000],
         lambda a: logsumexp_ref(a, -1, True), rtol=1e-6),
    Case("logsumexp_very_negative", lambda x: R.logsumexp(x, axis=0), [r(3, 2) - 1000],
         lambda a: logsumexp_ref(a, 0), rtol=1e-6),
    Case("logsumexp_row_of_minus_inf", lambda x: R.logsumexp(x, axis=1),
         [np.array([[-np.inf, -np.inf], [0.0, -np.inf]], np.float32)], lambda a: np.array([-np.inf, 0.0]),
         grad=False),
    Case("logsumexp_axes_dynamic", lambda x: R.logsumexp(x, axis=(0, 2)), [r(2, 3, 2)],
         lambda a: logsumexp_ref(a, (0, 2)), dynamic=True),
]

CUMSUMS = [
    Case("cumsum_axis0", lambda x: R.cumsum(x, axis=0), [r(3, 4)], lambda a: cumsum_ref(a, 0)),
    Case("cumsum_negative_axis", lambda x: R.cumsum(x, axis=-1), [r(2, 3, 4)], lambda a: cumsum_ref(a, 2)),
    Case("cumsum_flat", R.cumsum, [r(3, 4)], cumsum_ref),
    Case("cumsum_reverse", lambda x: R.cumsum(x, axis=1, reverse=True), [r(3, 4)],
         lambda a: cumsum_ref(a, 1, reverse=True)),
    Case("cumsum_flat_reverse_dynamic", lambda x: R.cumsum(x, reverse=True), [r(2, 3)],
         lambda a: cumsum_ref(a, reverse=True), dynamic=True),
    Case("cumsum_dynamic", lambda x: R.cumsum(x, axis=1), [r(2, 3)], lambda a: cumsum_ref(a, 1), dynamic=True),
    Case("cumsum_int32_gives_int64", lambda x: R.cumsum(x, axis=0), [ints(4, 2)], lambda a: np.cumsum(a, axis=0),
         grad=False),
    Case("sum_to_like", R.sum_to_like, [r(2, 3, 4), r(3, 1)], lambda g, x: g.sum(axis=(0, 2)).reshape(3, 1),
         grad_inputs=[0]),
    Case("sum_to_like_same_shape", R.sum_to_like, [r(3, 4), r(3, 4)], lambda g, x: g, grad_inputs=[0]),
    Case("sum_to_like_dynamic", R.sum_to_like, [r(2, 3, 4), r(1, 4)], lambda g, x: g.sum(axis=(0, 1))[None],
         dynamic=True, grad_inputs=[0]),
]

SECOND = [
    Case("var_2nd", second_derivative(lambda x: R.var(x, axis=1, ddof=1)), [r(2, 4)],
         lambda a: 2 * (a - a.mean(axis=1, keepdims=True)) / 3 * np.linspace(0.5, 1.5, 2)[:, None]),
    Case("std_2nd", second_derivative(R.std), [r(5)],
         lambda a: 0.5 * (a - a.mean()) / (5 * a.std())),  # weight 0.5 on the 0-d output
    Case("logsumexp_2nd", second_derivative(lambda x: R.logsumexp(x, axis=0)), [r(3, 2)],
         lambda a: np.exp(a - logsumexp_ref(a, 0)) * np.linspace(0.5, 1.5, 2)),
    Case("prod_2nd", second_derivative(lambda x: R.prod(x, axis=1)), [r(2, 3) + 2],
         lambda a: a.prod(axis=1, keepdims=True) / a * np.linspace(0.5, 1.5, 2)[:, None]),
]

CASES = SUMS + EXTREMES + MOMENTS + CUMSUMS + SECOND


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)


def _grad(build, x, backend):
    xs = input_value(TensorType(x.shape, x.dtype), "x")
    ws = cgvm.Workspace(backend)
    f = cgvm.compile([xs], cgvm.grad(R.sum(build(xs)), xs), workspace=ws)
    return ws.backend.to_numpy(f(ws.backend.asarray(x)))


@pytest.mark.parametrize("op", [R.max, R.min], ids=["max", "min"])
def test_extreme_gradient_splits_ties_equally(op, backend):
    x = np.array([[3.0, 1.0, 3.0, 3.0], [2.0, 2.0, 5.0, -1.0]]) * (1 if op is R.max else -1)
    g = _grad(lambda v: op(v, axis=1), x, backend)
    np.testing.assert_allclose(g, [[1 / 3, 0, 1 / 3, 1 / 3], [0, 0, 1, 0]])
    g_all = _grad(op, x, backend)  # over everything: the three tied extremes of row 0 lose to 5
    np.testing.assert_allclose(g_all, [[0, 0, 0, 0], [0, 0, 1, 0]])


def test_prod_gradient_with_zeros(backend):
    x = np.array([[2.0, 0.0, 3.0], [0.0, 4.0, 0.0], [1.0, 2.0, 3.0]])
    g = _grad(lambda v: R.prod(v, axis=1), x, backend)
    np.testing.assert_allclose(g, [[0, 6, 0], [0, 0, 0], [6, 3, 2]])


def test_dtypes_follow_numpy():
    i32 = input_value(TensorType((3, 4), "int32"), "i")
    b = input_value(TensorType((3,), "bool"), "b")
    f16 = input_value(TensorType((4,), "float16"), "h")
    assert R.sum(i32).dtype.name == "int64"
    assert R.prod(b).dtype.name == "int64"
    assert R.cumsum(i32, axis=0).dtype.name == "int64"
    assert R.mean(i32).dtype.name == "float64"
    assert R.var(f16).dtype.name == "float16"
    assert R.max(i32, axis=0).dtype.name == "int32"
    assert R.argmax(f16).dtype.name == "int64"
    assert E.div(i32, i32).dtype.name == "float64"
    assert E.floordiv(i32, i32).dtype.name == "int32"
    assert E.exp(input_value(TensorType((2,), "int8"), "c")).dtype.name == "float16"
    assert E.sigmoid(i32).dtype.name == "float64"
    assert E.eq(i32, f16).dtype.name == "bool"


def test_shapes_with_unknown_dims():
    x = input_value(TensorType((None, 3, None), "float32"), "x")
    assert R.sum(x, axis=1).shape == (None, None)
    assert R.mean(x, axis=(0, -1), keepdims=True).shape == (1, 3, 1)
    assert R.argmax(x, axis=-1).shape == (None, 3)
    assert R.cumsum(x).shape == (None,)
    assert R.cumsum(x, axis=2).shape == (None, 3, None)


def test_axis_out_of_range_names_the_source():
    x = input_value(TensorType((3, 4), "float32"), "x")
    with pytest.raises(ShapeError, match="axis 5.*test_reduce.py"):
        R.sum(x, axis=5)
    with pytest.raises(ShapeError, match="repeated axis.*test_reduce.py"):
        R.mean(x, axis=(1, -1))
    with pytest.raises(ShapeError, match="test_reduce.py"):
        R.cumsum(x, axis=-3)


def test_argmax_takes_a_single_axis():
    x = input_value(TensorType((3, 4), "float32"), "x")
    with pytest.raises(GraphBuildError, match="axis.*test_reduce.py"):
        R.argmax(x, axis=(0, 1))


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [(0, 2, 3), (0, 1), (0, -1), (-4, -2), (0, 1, 2, 3)])
def test_multi_axis_sums_over_the_batch_add_whole_samples_first(axis, keepdims):
    """Sums over axis 0 and others (conv bias gradients) reduce the batch axis first; shape and
    value must be NumPy's, in float64 and float32, into a given out buffer too."""
    from cgvm.ops import reduce as RD

    rng = np.random.default_rng(6)
    for dtype, rtol in ((np.float64, 1e-12), (np.float32, 1e-5)):
        x = rng.standard_normal((4, 5, 6, 7)).astype(dtype)
        want = x.astype(np.float64).sum(axis=axis, keepdims=keepdims)
        kernel = RD.sum.bind(np, dict(axis=axis, keepdims=keepdims))
        got = kernel(x)
        assert got.shape == want.shape and got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)
        out = np.empty(want.shape, dtype)
        np.testing.assert_allclose(kernel(x, out=out), want, rtol=rtol, atol=rtol)
        np.testing.assert_allclose(out, want, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("axis,keepdims", [(None, False), ((1,), False), ((0, 2), True), (None, True), ((), False)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_mean_is_numpys_own_to_the_bit(axis, keepdims, dtype):
    """The NumPy kernel sums and divides as numpy.mean does (without its Python layer): same bits."""
    from cgvm.ops import reduce as R
    x = np.random.default_rng(3).standard_normal((4, 5, 6)).astype(dtype)
    got = R.mean.bind(np, {"axis": axis, "keepdims": keepdims})(x)
    want = np.mean(x, axis=axis, keepdims=keepdims)
    assert got.dtype == want.dtype and got.shape == np.shape(want)
    np.testing.assert_array_equal(got, want)
