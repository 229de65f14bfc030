"""Shape ops and fills (cgvm.ops.shape, cgvm.ops.creation) against NumPy references, and their gradients."""
import numpy as np
import pytest

import cgvm
from cgvm.errors import GraphBuildError, ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import creation as C
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R
from cgvm.ops import join as J
from cgvm.ops import shape as S
from harness import Case, check_case, check_grad, second_order

rng = np.random.default_rng(7)


def r(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def ints(*values):
    return np.array(values, dtype=np.int64)


def first(outputs):
    return outputs[0]


def tile_reference(x, reps):
    """np.tile written out: index the output with each position modulo the input's extent."""
    n = max(x.ndim, len(reps))
    x = x.reshape((1,) * (n - x.ndim) + x.shape)
    reps = (1,) * (n - len(reps)) + tuple(reps)
    out_shape = tuple(d * k for d, k in zip(x.shape, reps))
    grids = np.indices(out_shape)
    return x[tuple(g % d for g, d in zip(grids, x.shape))]


CASES = [
    # expand / squeeze / broadcast_like / reshape_like (existing ops, kept covered)
    Case("expand_dims", lambda x: S.expand_dims(x, axis=(0, -1)), [r(2, 3)], lambda a: a[None, :, :, None]),
    Case("squeeze", lambda x: S.squeeze(x, axis=1), [r(2, 1, 3)], lambda a: a[:, 0]),
    Case("broadcast_like", S.broadcast_like, [r(3, 1), r(2, 3, 4)], lambda a, b: np.broadcast_to(a, b.shape),
         grad_inputs=[0]),
    Case("reshape_like_dynamic", S.reshape_like, [r(2, 6), r(3, 4)], lambda a, b: a.reshape(3, 4),
         dynamic=True, grad_inputs=[0]),
    # reshape: 0 copies the input dimension, -1 is inferred
    Case("reshape", lambda x: S.reshape(x, shape=(6, 4)), [r(2, 3, 4)], lambda a: a.reshape(6, 4)),
    Case("reshape_minus1", lambda x: S.reshape(x, shape=(-1, 2)), [r(2, 3, 4)], lambda a: a.reshape(12, 2)),
    Case("reshape_zero_copies", lambda x: S.reshape(x, shape=(0, -1)), [r(2, 3, 4)], lambda a: a.reshape(2, 12)),
    Case("reshape_zero_middle", lambda x: S.reshape(x, shape=(-1, 0, 2, 2)), [r(2, 3, 4)],
         lambda a: a.reshape(2, 3, 2, 2)),
    Case("reshape_dynamic", lambda x: S.reshape(x, shape=(0, -1)), [r(2, 3, 4)], lambda a: a.reshape(2, 12),
         dynamic=True),
    Case("reshape_of_transpose", lambda x: S.reshape(S.transpose(x), shape=(-1,)), [r(3, 4)],
         lambda a: a.T.reshape(-1)),
    Case("reshape_dyn_const", lambda x: S.reshape_dyn(x, ints(4, -1)), [r(2, 3, 4)], lambda a: a.reshape(4, 6),
         dynamic=True),
    Case("reshape_dyn_input", S.reshape_dyn, [r(2, 3, 4), ints(0, 2, -1)], lambda a, s: a.reshape(2, 2, 6)),
    Case("reshape_dyn_flat", lambda x: S.reshape_dyn(x, ints(-1)), [r(2, 3)], lambda a: a.reshape(-1)),
    Case("reshape_dyn_shape_of", lambda x, y: S.reshape_dyn(x, S.shape_of(y)), [r(2, 6), r(3, 4)],
         lambda a, b: a.reshape(3, 4), grad_inputs=[0], dynamic=True),
    Case("flatten", S.flatten, [r(2, 3, 4, 5)], lambda a: a.reshape(2, 60)),
    Case("flatten_axis0", lambda x: S.flatten(x, axis=0), [r(2, 3, 4)], lambda a: a.reshape(24)),
    Case("flatten_range", lambda x: S.flatten(x, axis=1, end_axis=2), [r(2, 3, 4, 5)],
         lambda a: a.reshape(2, 12, 5)),
    Case("flatten_negative_dynamic", lambda x: S.flatten(x, axis=-3, end_axis=-2), [r(2, 3, 4, 5)],
         lambda a: a.reshape(2, 12, 5), dynamic=True),
    # transpose
    Case("transpose_default", S.transpose, [r(2, 3, 4)], lambda a: a.transpose()),
    Case("transpose_perm", lambda x: S.transpose(x, perm=(1, 2, 0)), [r(2, 3, 4)], lambda a: a.transpose(1, 2, 0)),
    Case("transpose_negative_dynamic", lambda x: S.transpose(x, perm=(0, -1, -2)), [r(2, 3, 4)],
         lambda a: a.transpose(0, 2, 1), dynamic=True),
    # broadcast_to
    Case("broadcast_to", lambda x: S.broadcast_to(x, shape=(2, 3, 4)), [r(3, 1)],
         lambda a: np.broadcast_to(a, (2, 3, 4))),
    Case("broadcast_to_dynamic", lambda x: S.broadcast_to(x, shape=(2, 3, 4)), [r(4)],
         lambda a: np.broadcast_to(a, (2, 3, 4)), dynamic=True),
    # concat / split / stack
    Case("concat", lambda a, b, c: J.concat(a, b, c, axis=1), [r(2, 1, 3), r(2, 4, 3), r(2, 2, 3)],
         lambda a, b, c: np.concatenate([a, b, c], axis=1)),
    Case("concat_negative_dynamic", lambda a, b: J.concat(a, b, axis=-1), [r(2, 3), r(2, 5)],
         lambda a, b: np.concatenate([a, b], axis=-1), dynamic=True),
    Case("concat_one", lambda a: J.concat(a, axis=0), [r(3, 2)], lambda a: a.copy()),
    Case("split_sizes", lambda x: J.split(x, axis=1, sizes=(1, 3, 2)), [r(2, 6)],
         lambda a: (a[:, :1], a[:, 1:4], a[:, 4:])),
    Case("split_sections_dynamic", lambda x: J.split(x, axis=-1, sections=3), [r(2, 6)],
         lambda a: (a[:, :2], a[:, 2:4], a[:, 4:]), dynamic=True),
    Case("split_one_output_used", lambda x: first(J.split(x, axis=0, sizes=(2, 1))), [r(3, 2)],
         lambda a: a[:2]),
    Case("split_single", lambda x: J.split(x, axis=0, sections=1), [r(3, 2)], lambda a: a.copy()),
    Case("stack", lambda a, b, c: J.stack(a, b, c), [r(2, 3), r(2, 3), r(2, 3)], lambda *xs: np.stack(xs)),
    Case("stack_last_dynamic", lambda a, b: J.stack(a, b, axis=-1), [r(2, 3), r(2, 3)],
         lambda a, b: np.stack([a, b], axis=-1), dynamic=True),
    # tile
    Case("tile", lambda x: J.tile(x, reps=(2, 3)), [r(2, 3)], lambda a: tile_reference(a, (2, 3))),
    Case("tile_more_reps", lambda x: J.tile(x, reps=(2, 1, 2)), [r(2, 3)], lambda a: tile_reference(a, (2, 1, 2))),
    Case("tile_fewer_reps_dynamic", lambda x: J.tile(x, reps=(3,)), [r(2, 2)], lambda a: tile_reference(a, (3,)),
         dynamic=True),
    # shape_of and fills
    Case("shape_of", S.shape_of, [r(2, 3, 4)], lambda a: np.array(a.shape, np.int64), grad=False, dynamic=True),
    Case("shape_of_scalar", S.shape_of, [r()], lambda a: np.zeros(0, np.int64), grad=False),
    Case("zeros_like_int", lambda x: S.zeros_like(x, dtype="int32"), [r(2, 3)], lambda a: np.zeros((2, 3), np.int32),
         grad=False),
    Case("full_like", lambda x: S.full_like(x, value=2.5), [r(2, 3)], lambda a: np.full((2, 3), 2.5, np.float32),
         grad=False),
    Case("zeros", lambda: C.zeros(shape=(2, 3)), [], lambda: np.zeros((2, 3), np.float32), grad=False),
    Case("ones_int", lambda: C.ones(shape=(4,), dtype="int32"), [], lambda: np.ones(4, np.int32), grad=False),
    Case("full", lambda: C.full(shape=(2, 2), value=-1.5, dtype="float64"), [],
         lambda: np.full((2, 2), -1.5), grad=False),
    Case("arange_int", lambda: C.arange(stop=5), [], lambda: np.arange(5), grad=False),
    Case("arange_negative_step", lambda: C.arange(start=5, stop=-4, step=-3), [], lambda: np.arange(5, -4, -3),
         grad=False),
    Case("arange_float", lambda: C.arange(start=0.0, stop=1.0, step=0.3), [],
         lambda: np.arange(0.0, 1.0, 0.3).astype(np.float32), grad=False),
    Case("arange_empty", lambda: C.arange(start=3, stop=1), [], lambda: np.arange(3, 1), grad=False),
    Case("arange_in_graph", lambda x: E.add(x, C.arange(stop=3, dtype="float32")), [r(2, 3)],
         lambda a: a + np.arange(3, dtype=np.float32)),
    Case("eye", lambda: C.eye(n=3), [], lambda: np.eye(3, dtype=np.float32), grad=False),
    Case("eye_rect_k", lambda: C.eye(n=3, m=5, k=-1, dtype="int64"), [], lambda: np.eye(3, 5, -1, dtype=np.int64),
         grad=False),
    Case("alloc_static", lambda v: C.alloc(v, 2, 3), [r(3)], lambda v: np.broadcast_to(v, (2, 3)).copy()),
    Case("alloc_tensor_dims", lambda v, n, m: C.alloc(v, n, m), [r(1), np.array(3), np.array(2)],
         lambda v, n, m: np.broadcast_to(v, (int(n), int(m))).copy()),
    Case("alloc_scalar_dynamic", lambda v, n: C.alloc(v, n, 4), [r(), np.array(2)],
         lambda v, n: np.full((2, 4), v, np.float32), dynamic=True),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)




SECOND_ORDER = [
    Case("reshape_transpose_2nd", second_order(
        lambda x: R.sum(E.mul(E.exp(S.reshape(S.transpose(x), shape=(-1,))), S.flatten(S.transpose(x), axis=0)))),
        [r(2, 3)], lambda a: np.exp(a) * (1 + a), rtol=1e-4),
    Case("concat_split_2nd", second_order(
        lambda x: R.sum(E.exp(first(J.split(J.concat(x, x, axis=0), axis=0, sizes=(3, 1)))))),
        [r(2, 2)], lambda a: np.exp(a) * np.array([[2.0], [1.0]]), rtol=1e-4),
    Case("tile_stack_2nd", second_order(lambda x: R.sum(E.exp(J.stack(J.tile(x, reps=(2,)), J.concat(x, x))))),
         [r(3)], lambda a: np.exp(a) * 4, rtol=1e-4),
]


@pytest.mark.parametrize("case", SECOND_ORDER, ids=repr)
def test_second_derivatives(case, backend):
    check_case(case, backend)
    check_grad(case, backend)


def _sym(*shape, dtype="float32"):
    return input_value(TensorType(shape, dtype))


@pytest.mark.parametrize("build", [
    lambda: S.reshape(_sym(2, 3), shape=(4, 2)),
    lambda: S.reshape(_sym(2, 3), shape=(-1, -1)),
    lambda: S.reshape(_sym(2, 3), shape=(0, 0, 0)),
    lambda: S.transpose(_sym(2, 3), perm=(0, 0)),
    lambda: S.broadcast_to(_sym(3, 2), shape=(3, 3)),
    lambda: J.concat(_sym(2, 3), _sym(3, 3), axis=1),
    lambda: J.split(_sym(2, 6), axis=1, sizes=(2, 3)),
    lambda: J.split(_sym(2, 6), axis=1, sections=4),
    lambda: J.stack(_sym(2, 3), _sym(2, 4)),
    lambda: S.flatten(_sym(2, 3, 4), axis=2, end_axis=1),
    lambda: S.reshape_dyn(_sym(2, 3), _sym(None, dtype="int64")),
    lambda: C.alloc(_sym(3), 2, 4),
    lambda: C.arange(stop=3, step=0),
], ids=["reshape_size", "reshape_two_minus1", "reshape_zero_rank", "transpose_perm", "broadcast_to",
        "concat", "split_sizes", "split_sections", "stack", "flatten", "reshape_dyn_rank", "alloc", "arange"])
def test_bad_shapes_name_the_user_line(build):
    with pytest.raises(ShapeError) as info:
        build()
    assert "test_shape.py" in str(info.value)


def test_bad_attribute_names_the_user_line():
    with pytest.raises(GraphBuildError) as info:
        J.split(_sym(2, 6), axis=1, sections=2.5)
    assert "test_shape.py" in str(info.value)


def test_unknown_dim_checked_at_run_time():
    x = _sym(None)
    f = cgvm.compile([x], S.broadcast_to(x, shape=(2, 3)))
    np.testing.assert_array_equal(f(np.ones(3, np.float32)), np.ones((2, 3)))
    with pytest.raises(ShapeError) as info:
        f(np.ones(4, np.float32))
    assert "test_shape.py" in str(info.value)


def test_split_outputs_survive_later_calls(backend):
    """Every output of a multi-output view aliases its input: none may sit in a buffer reused later."""
    ws = cgvm.Workspace(backend)
    xp = ws.backend.xp
    x = _sym(4, 3)
    top, bottom = J.split(E.exp(x), axis=0, sections=2)
    later = E.exp(top)
    f = cgvm.compile([x], [bottom, E.add(later, later)], workspace=ws)
    data = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    kept = f(xp.asarray(data))[0]
    f(xp.asarray(data * 2))
    np.testing.assert_allclose(ws.backend.to_numpy(kept), np.exp(data[2:]), rtol=1e-6)
