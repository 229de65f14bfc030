"""Selection ops (cgvm.ops.selection): filter_rows / unfilter_rows, nonzero, unique against plain NumPy loops,
and gradients."""
import numpy as np
import pytest

import cgvm
from cgvm.errors import ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R
from cgvm.ops import selection as S
from harness import Case, check_case, check_grad

rng = np.random.default_rng(5)


def r(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def kept_rows(x, selector):
    return np.stack([x[i] for i in range(len(selector)) if selector[i] != 0]) if np.any(selector != 0) \
        else np.zeros((0,) + x.shape[1:], x.dtype)


def scattered(g, selector, like):
    out = np.zeros(like.shape, g.dtype)
    j = 0
    for i in range(len(selector)):
        if selector[i] != 0:
            out[i] = g[j]
            j += 1
    return out


SEL = np.array([1.0, 0.0, 2.5, 0.0, -1.0], np.float32)

CASES = [
    Case("filter_float_selector", lambda x, s: S.filter_rows(x, s), [r(5, 3), SEL], kept_rows, grad_inputs=[0]),
    Case("filter_int_selector_4d", lambda x, s: S.filter_rows(x, s), [r(4, 2, 3, 2), np.array([0, 1, 1, 0])],
         kept_rows),
    Case("filter_vector", lambda x, s: S.filter_rows(x, s), [r(5), SEL], kept_rows, grad_inputs=[0]),
    Case("filter_keeps_all_dynamic", lambda x, s: S.filter_rows(x, s), [r(3, 2), np.ones(3, np.float32)],
         kept_rows, dynamic=True, grad_inputs=[0]),
    Case("filter_keeps_none", lambda x, s: S.filter_rows(x, s), [r(3, 2), np.zeros(3, np.float32)],
         kept_rows, grad=False),
    Case("filter_then_math", lambda x, s: E.tanh(S.filter_rows(E.mul(x, x), s)), [r(5, 2), SEL],
         lambda x, s: np.tanh(kept_rows(x * x, s)), grad_inputs=[0]),
    Case("unfilter", lambda g, s, like: S.unfilter_rows(g, s, like), [r(3, 2), SEL, r(5, 2)], scattered,
         grad_inputs=[0]),
    Case("unfilter_dynamic", lambda g, s, like: S.unfilter_rows(g, s, like), [r(2, 2, 2), np.array([0, 1, 0, 1]),
         r(4, 2, 2)], scattered, dynamic=True, grad_inputs=[0]),
]


def nonzero_loop(x):
    coords = [idx for idx in np.ndindex(*x.shape) if x[idx] != 0]      # row-major order
    return np.array(coords, np.int64).reshape(-1, x.ndim).T.copy()


def unique_loop(x, axis=None, keep_sorted=True):
    """(values, first index, inverse, counts) by a scan over the items (elements, or slices along axis)."""
    items = list(x.reshape(-1)) if axis is None else [np.take(x, i, axis=axis) for i in range(x.shape[axis])]
    keys = [np.asarray(v).tobytes() for v in items]
    first = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    order = list(first.values())
    if keep_sorted:
        order.sort(key=lambda i: tuple(np.asarray(items[i]).reshape(-1).tolist()))
    pos = {keys[i]: j for j, i in enumerate(order)}
    values = np.array([items[i] for i in order], x.dtype)
    if axis is not None:
        values = np.moveaxis(values, 0, axis)
    inverse = np.array([pos[k] for k in keys], np.int64)
    counts = np.array([keys.count(keys[i]) for i in order], np.int64)
    return values, np.array(order, np.int64), inverse, counts


REPEATS = np.array([2.0, 1.0, 1.0, 3.0, 4.0, 3.0], np.float32)
ROWS = np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4], [0, 1, 2], [2, 3, 4]], np.int64)

CASES += [
    Case("nonzero_2d", lambda x: S.nonzero(x), [np.array([[1.0, 0.0, 2.0], [0.0, 0.0, -1.0]], np.float32)],
         nonzero_loop, grad=False),
    Case("nonzero_3d_int_dynamic", lambda x: S.nonzero(x), [rng.integers(0, 2, (2, 3, 4))], nonzero_loop,
         dynamic=True, grad=False),
    Case("nonzero_none", lambda x: S.nonzero(x), [np.zeros(4, np.float32)], nonzero_loop, grad=False),
    Case("nonzero_then_math", lambda x: E.add(S.nonzero(x), S.nonzero(x)), [np.array([0, 3, 0, 5])],
         lambda x: 2 * nonzero_loop(x), grad=False),
    Case("unique_sorted", lambda x: S.unique(x), [REPEATS], unique_loop, grad=False),
    Case("unique_first_seen", lambda x: S.unique(x, sorted=False), [REPEATS],
         lambda x: unique_loop(x, keep_sorted=False), grad=False),
    Case("unique_matrix_flattened", lambda x: S.unique(x), [ROWS], unique_loop, grad=False),
    Case("unique_rows", lambda x: S.unique(x, axis=0), [ROWS], lambda x: unique_loop(x, axis=0), grad=False),
    Case("unique_columns_first_seen", lambda x: S.unique(x, axis=1, sorted=False), [ROWS.T.copy()],
         lambda x: unique_loop(x, axis=1, keep_sorted=False), grad=False),
    Case("unique_then_math", lambda x: E.mul(S.unique(x)[0], S.unique(x)[0]), [REPEATS],
         lambda x: unique_loop(x)[0] ** 2, grad=False),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)


def test_filter_output_rows_are_unknown_until_run_time():
    x = input_value(TensorType((5, 3), "float32"))
    s = input_value(TensorType((5,), "float32"))
    y = S.filter_rows(x, s)
    assert tuple(y.shape) == (None, 3)


def test_second_derivative_through_filter():
    x = input_value(TensorType((5,), "float64"))
    s = input_value(TensorType((5,), "float64"))
    (gx,) = cgvm.grad(R.sum(E.exp(S.filter_rows(x, s))), [x])
    (ggx,) = cgvm.grad(R.sum(gx), [x])
    f = cgvm.compile([x, s], [gx, ggx])
    xv, sv = rng.standard_normal(5), SEL.astype(np.float64)
    want = np.where(sv != 0, np.exp(xv), 0.0)
    got_g, got_gg = f(xv, sv)
    np.testing.assert_allclose(got_g, want, rtol=1e-12)
    np.testing.assert_allclose(got_gg, want, rtol=1e-12)


def _sym(*shape, dtype="float32"):
    return input_value(TensorType(shape, dtype))


@pytest.mark.parametrize("build", [
    lambda: S.filter_rows(_sym(4, 2), _sym(3)),
    lambda: S.filter_rows(_sym(4, 2), _sym(4, 1)),
    lambda: S.unfilter_rows(_sym(2, 3), _sym(4), _sym(4, 2)),
], ids=["rows_mismatch", "selector_rank", "unfilter_row_shape"])
def test_bad_shapes_name_the_user_line(build):
    with pytest.raises(ShapeError) as info:
        build()
    assert "test_selection.py" in str(info.value)


def test_data_dependent_outputs_are_typed_with_unknown_sizes():
    x = _sym(2, 3)
    assert tuple(S.nonzero(x).shape) == (2, None)
    values, first, inverse, counts = S.unique(x, axis=1)
    assert tuple(values.shape) == (2, None) and tuple(inverse.shape) == (3,)
    assert tuple(first.shape) == (None,) == tuple(counts.shape)
    assert tuple(S.unique(x)[2].shape) == (6,)


def test_unique_output_sizes_follow_each_call():
    x = input_value(TensorType((None,), "int64"))
    values, _, _, counts = S.unique(x)
    f = cgvm.compile([x], [values, counts])
    for data in ([3, 1, 3], [5, 5, 5, 5, 2, 7, 7]):
        got_v, got_c = f(np.array(data, np.int64))
        want_v, want_c = np.unique(np.array(data), return_counts=True)
        np.testing.assert_array_equal(got_v, want_v)
        np.testing.assert_array_equal(got_c, want_c)


def test_nonzero_of_a_scalar_is_refused_naming_the_line():
    with pytest.raises(ShapeError, match="test_selection.py"):
        S.nonzero(_sym())
