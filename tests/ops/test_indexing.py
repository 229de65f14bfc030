"""Indexing ops (cgvm.ops.indexing) against NumPy references, and their gradients."""
import numpy as np
import pytest

import cgvm
from cgvm.errors import ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import indexing as I
from cgvm.ops import reduce as R
from harness import Case, check_case, check_grad, second_order

rng = np.random.default_rng(11)


def r(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def ints(*values):
    return np.array(values, dtype=np.int64)


def _assigned(x, index, v):
    out = x.copy()
    out[index] = v
    return out


def _scatter_added(x, idx, g, axis):
    """x with g added at idx along axis, one index at a time (repeats accumulate)."""
    out = x.copy()
    moved, vals = np.moveaxis(out, axis, 0), np.moveaxis(g, axis, 0).reshape((-1,) + np.moveaxis(out, axis, 0).shape[1:])
    for k, j in enumerate(np.asarray(idx).reshape(-1)):
        moved[j] += vals[k]
    return out


def replaced(x, index, y):
    out = x.copy()
    out[index] = y
    return out


def incremented(x, index, y):
    out = x.copy()
    out[index] += y
    return out


def pad_reference(x, pads, mode, value=0.0):
    width = [(pads[2 * i], pads[2 * i + 1]) for i in range(x.ndim)]
    if mode == "constant":
        return np.pad(x, width, mode="constant", constant_values=value)
    return np.pad(x, width, mode=mode)


def one_hot_reference(indices, depth, dtype=np.float32):
    out = np.zeros(indices.shape + (depth,), dtype)
    for pos in np.ndindex(*indices.shape):
        if 0 <= indices[pos] < depth:
            out[pos + (indices[pos],)] = 1
    return out


CASES = [
    # slice: Python semantics per axis
    Case("slice", lambda x: I.slice(x, starts=1, stops=3), [r(4, 3)], lambda a: a[1:3]),
    Case("slice_reverse_axis1", lambda x: I.slice(x, steps=-1, axes=1), [r(2, 4)], lambda a: a[:, ::-1]),
    Case("slice_negative_bounds", lambda x: I.slice(x, starts=-3, stops=-1), [r(5, 2)], lambda a: a[-3:-1]),
    Case("slice_many_axes", lambda x: I.slice(x, starts=(1, None, -1), stops=(None, None, 0), steps=(None, 2, -2)),
         [r(3, 5, 6)], lambda a: a[1:, ::2, -1:0:-2]),
    Case("slice_out_of_range", lambda x: I.slice(x, starts=(2,), stops=(100,), axes=(-1,)), [r(2, 4)],
         lambda a: a[:, 2:100]),
    Case("slice_empty", lambda x: I.slice(x, starts=3, stops=1), [r(4, 2)], lambda a: a[3:1]),
    Case("slice_dynamic", lambda x: I.slice(x, starts=(None, 1), stops=(-1, None), steps=(2, None)), [r(5, 3)],
         lambda a: a[:-1:2, 1:], dynamic=True),
    # dynamic_slice: bounds as 0-d values, Python's rules (negative from the end, clamped, negative steps)
    Case("dynamic_slice", lambda x, a, b: I.dynamic_slice(x, a, b), [r(6, 3), np.int64(1), np.int64(4)],
         lambda x, a, b: x[a:b]),
    Case("dynamic_slice_axis1_negative", lambda x, a, b: I.dynamic_slice(x, a, b, axis=-1), [r(2, 7), np.int64(-5),
         np.int64(-1)], lambda x, a, b: x[:, a:b]),
    Case("dynamic_slice_clamped", lambda x, a, b: I.dynamic_slice(x, a, b), [r(4, 2), np.int64(2), np.int64(100)],
         lambda x, a, b: x[a:b]),
    Case("dynamic_slice_reversed", lambda x, a, b: I.dynamic_slice(x, a, b, step=-2), [r(7), np.int64(5),
         np.int64(0)], lambda x, a, b: x[a:b:-2]),
    Case("dynamic_slice_empty", lambda x, a, b: I.dynamic_slice(x, a, b, axis=1), [r(3, 4), np.int64(3),
         np.int64(1)], lambda x, a, b: x[:, a:b]),
    Case("dynamic_slice_unknown_shape", lambda x, a, b: I.dynamic_slice(x, a, b), [r(5, 2, 3), np.int64(1),
         np.int64(3)], lambda x, a, b: x[a:b], dynamic=True),
    # set_subtensor / inc_subtensor
    Case("set_subtensor", lambda x, y: I.set_subtensor(x, y, starts=1, stops=3), [r(4, 3), r(2, 3)],
         lambda a, b: replaced(a, np.s_[1:3], b)),
    Case("set_subtensor_broadcast", lambda x, y: I.set_subtensor(x, y, steps=(-2,), axes=(1,)), [r(3, 5), r(3, 1)],
         lambda a, b: replaced(a, np.s_[:, ::-2], b)),
    Case("set_subtensor_dynamic", lambda x, y: I.set_subtensor(x, y, starts=-2), [r(4, 3), r(3)],
         lambda a, b: replaced(a, np.s_[-2:], b), dynamic=True),
    Case("inc_subtensor", lambda x, y: I.inc_subtensor(x, y, starts=(0, 1), stops=(2, None)), [r(3, 4), r(2, 3)],
         lambda a, b: incremented(a, np.s_[0:2, 1:], b)),
    Case("inc_subtensor_in_place", lambda x, y: I.inc_subtensor(E.exp(x), y, starts=1, steps=2),
         [r(5, 2), r(2)], lambda a, b: incremented(np.exp(a), np.s_[1::2], b)),
    Case("set_subtensor_in_place", lambda x, y: E.exp(I.set_subtensor(E.exp(x), y, stops=-1)),
         [r(3, 2), r(1)], lambda a, b: np.exp(replaced(np.exp(a), np.s_[:-1], b))),
    # take / advanced_index (repeated indices accumulate in the gradient)
    Case("take_flat", lambda x, i: I.take(x, i), [r(3, 4), ints(0, 11, -1, 5, 5)], lambda a, i: np.take(a, i)),
    Case("take_axis0", lambda x, i: I.take(x, i, axis=0), [r(4, 3), ints(3, 0, 3)], lambda a, i: a[i]),
    Case("take_axis1_matrix", lambda x, i: I.take(x, i, axis=1), [r(2, 5, 3), np.array([[4, 0], [-1, 4]])],
         lambda a, i: np.take(a, i, axis=1)),
    Case("take_negative_axis_dynamic", lambda x, i: I.take(x, i, axis=-1), [r(3, 4), ints(1, 1, 2)],
         lambda a, i: a[:, [1, 1, 2]], dynamic=True),
    Case("take_set_axis1", lambda x, v, i: I.take_set(x, v, i, axis=1), [r(3, 5), r(3, 2), ints(4, 1)],
         lambda a, v, i: _assigned(a, (slice(None), i), v), grad_inputs=[0, 1]),
    Case("take_set_repeats_last_wins", lambda x, v, i: I.take_set(x, v, i, axis=0), [r(4, 2), r(3, 2), ints(1, 3, 1)],
         lambda a, v, i: _assigned(a, i, v), grad=False),
    Case("advanced_set", lambda x, v, i, j: I.advanced_set(x, v, i, j), [r(3, 4), r(2), ints(0, 2), ints(3, 1)],
         lambda a, v, i, j: _assigned(a, (i, j), v), grad_inputs=[0, 1]),
    Case("take_add_rows_repeats_accumulate", lambda x, g, i: I.take_add(x, g, i, axis=0),
         [r(5, 3), r(2, 2, 3), np.array([[1, 4], [1, -1]])], lambda a, g, i: _scatter_added(a, i, g, 0),
         grad_inputs=[0, 1]),
    Case("take_add_axis1_dynamic", lambda x, g, i: I.take_add(x, g, i, axis=1), [r(2, 4), r(2, 3), ints(3, 0, 3)],
         lambda a, g, i: _scatter_added(a, i, g, 1), grad_inputs=[0, 1], dynamic=True),
    Case("take_int32_indices", lambda x, i: I.take(x, i, axis=0), [r(4, 2), np.array([2, 2], np.int32)],
         lambda a, i: a[[2, 2]]),
    Case("advanced_index", I.advanced_index, [r(5, 3), ints(4, 0, 4, 2)], lambda a, i: a[i]),
    Case("advanced_index_two", I.advanced_index, [r(4, 3, 2), np.array([[0], [3]]), ints(2, 0, 2)],
         lambda a, i, j: a[i, j]),
    Case("advanced_index_dynamic", I.advanced_index, [r(4, 3), ints(1, 1)], lambda a, i: a[i], dynamic=True),
    # pad
    Case("pad_constant", lambda x: I.pad(x, pads=(1, 2, 0, 3)), [r(2, 3)],
         lambda a: pad_reference(a, (1, 2, 0, 3), "constant")),
    Case("pad_constant_value_dynamic", lambda x: I.pad(x, pads=(2, 0, 1, 1), value=-1.5), [r(2, 3)],
         lambda a: pad_reference(a, (2, 0, 1, 1), "constant", -1.5), dynamic=True),
    Case("pad_edge", lambda x: I.pad(x, pads=(2, 1, 1, 3), mode="edge"), [r(2, 3)],
         lambda a: pad_reference(a, (2, 1, 1, 3), "edge")),
    Case("pad_reflect", lambda x: I.pad(x, pads=(2, 2, 1, 0), mode="reflect"), [r(3, 4)],
         lambda a: pad_reference(a, (2, 2, 1, 0), "reflect")),
    Case("pad_reflect_wide", lambda x: I.pad(x, pads=(5, 4), mode="reflect"), [r(3)],
         lambda a: pad_reference(a, (5, 4), "reflect")),
    Case("pad_symmetric", lambda x: I.pad(x, pads=(4, 2), mode="symmetric"), [r(3)],
         lambda a: pad_reference(a, (4, 2), "symmetric")),
    Case("pad_wrap_dynamic", lambda x: I.pad(x, pads=(0, 0, 3, 5), mode="wrap"), [r(2, 3)],
         lambda a: pad_reference(a, (0, 0, 3, 5), "wrap"), dynamic=True),
    Case("pad_nothing", lambda x: I.pad(x, pads=(0, 0), mode="edge"), [r(3)], lambda a: a.copy()),
    # one_hot
    Case("one_hot", lambda i: I.one_hot(i, depth=4), [ints(0, 3, 1, 7, -1)], lambda i: one_hot_reference(i, 4), grad=False),
    Case("one_hot_matrix_int_dynamic", lambda i: I.one_hot(i, depth=3, dtype="int32"), [np.array([[2, 0], [1, 1]])],
         lambda i: one_hot_reference(i, 3, np.int32), dynamic=True, grad=False),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)




def _take_second(a, i):
    counts = np.bincount(i, minlength=a.shape[0])[:, None]
    return counts * np.exp(a)


SECOND_ORDER = [
    Case("slice_2nd", second_order(lambda x: R.sum(E.exp(I.slice(x, starts=1, steps=2)))), [r(5)],
         lambda a: np.where(np.arange(5) % 2 == 1, np.exp(a), 0).astype(np.float32), rtol=1e-4),
    Case("set_subtensor_2nd", second_order(lambda x, y: R.sum(E.exp(I.set_subtensor(x, E.mul(y, y), stops=2)))),
         [r(4), r(2)], lambda a, b: np.where(np.arange(4) >= 2, np.exp(a), 0).astype(np.float32), rtol=1e-4),
    Case("dynamic_slice_2nd", second_order(lambda x, a, b: R.sum(E.exp(I.dynamic_slice(x, a, b, step=2)))),
         [r(6), np.int64(1), np.int64(6)], lambda x, a, b: np.where(np.arange(6) % 2 == 1, np.exp(x), 0).astype(
             np.float32), rtol=1e-4),
    Case("take_2nd", second_order(lambda x, i: R.sum(E.exp(I.take(x, i, axis=0)))), [r(3, 2), ints(0, 2, 2)],
         _take_second, rtol=1e-4),
    Case("advanced_index_2nd", second_order(lambda x, i: R.sum(E.exp(I.advanced_index(x, i)))),
         [r(3, 2), ints(0, 2, 2)], _take_second, rtol=1e-4),
    Case("pad_reflect_2nd", second_order(lambda x: R.sum(E.exp(I.pad(x, pads=(2, 1), mode="reflect")))), [r(3)],
         lambda a: np.exp(a) * np.array([1, 3, 2], np.float32), rtol=1e-4),
]


@pytest.mark.parametrize("case", SECOND_ORDER, ids=repr)
def test_second_derivatives(case, backend):
    check_case(case, backend)
    check_grad(case, backend)


def _sym(*shape, dtype="float32"):
    return input_value(TensorType(shape, dtype))


@pytest.mark.parametrize("build", [
    lambda: I.slice(_sym(2, 3), starts=(0, 0, 0)),
    lambda: I.slice(_sym(2, 3), steps=0),
    lambda: I.slice(_sym(2, 3), starts=(0, 1), stops=(1,)),
    lambda: I.set_subtensor(_sym(4, 3), _sym(3, 3), starts=1, stops=3),
    lambda: I.take(_sym(4), _sym(2)),
    lambda: I.advanced_index(_sym(4), _sym(2, dtype="int64"), _sym(2, dtype="int64")),
    lambda: I.pad(_sym(2, 3), pads=(1, 1)),
    lambda: I.pad(_sym(0, 3), pads=(1, 1, 0, 0), mode="edge"),
    lambda: I.one_hot(_sym(3), depth=2),
], ids=["slice_rank", "slice_step", "slice_lengths", "set_subtensor", "take_dtype", "advanced_rank", "pad_length",
        "pad_empty", "one_hot_dtype"])
def test_bad_shapes_name_the_user_line(build):
    with pytest.raises(ShapeError) as info:
        build()
    assert "test_indexing.py" in str(info.value)


def test_scatter_add_accumulates_repeats():
    target = np.zeros(3)
    I.scatter_add(np, target, np.array([0, 2, 0, 0]), np.array([1.0, 2.0, 3.0, 4.0]))
    np.testing.assert_array_equal(target, [8.0, 0.0, 2.0])


def test_set_subtensor_runs_in_place():
    x, y = _sym(6, 4), _sym(4)
    f = cgvm.compile([x, y], E.exp(I.set_subtensor(E.exp(x), y, starts=2, stops=3)))
    xv, yv = r(6, 4), r(4)
    np.testing.assert_allclose(f(xv, yv), np.exp(replaced(np.exp(xv), np.s_[2:3], yv)), rtol=1e-6)
    (plan,) = f.memory_plans().values()
    assert plan.inplace, "set_subtensor should overwrite its dying input"
