"""Linear algebra (cgvm.ops.linalg) against references written with loops and einsum, and gradients."""
import numpy as np
import pytest

import cgvm
from cgvm.errors import ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import fused as F
from cgvm.ops import linalg as L
from cgvm.ops import reduce as R
from harness import Case, check_case, check_grad, second_order

rng = np.random.default_rng(3)


def r(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def matmul_reference(a, b):
    """NumPy's matmul rules spelled out: promote 1-D operands, broadcast batch axes, einsum, drop promoted axes."""
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    a3 = np.broadcast_to(a2, batch + a2.shape[-2:])
    b3 = np.broadcast_to(b2, batch + b2.shape[-2:])
    out = np.einsum("...ik,...kj->...ij", a3, b3)
    if a.ndim == 1:
        out = out[..., 0, :]
    if b.ndim == 1:
        out = out[..., 0]
    return out


def gemm_reference(a, b, c=None, trans_a=False, trans_b=False, alpha=1.0, beta=1.0):
    A = a.T if trans_a else a
    B = b.T if trans_b else b
    out = np.zeros((A.shape[0], B.shape[1]), np.result_type(a, b))
    for i in range(A.shape[0]):
        for j in range(B.shape[1]):
            out[i, j] = alpha * np.sum(A[i, :] * B[:, j])
    return out if c is None else out + beta * c


def tensordot_reference(a, b, axes_a, axes_b):
    """Sum over paired axes by loops over the output and contracted index spaces."""
    free_a = [i for i in range(a.ndim) if i not in axes_a]
    free_b = [j for j in range(b.ndim) if j not in axes_b]
    out = np.zeros([a.shape[i] for i in free_a] + [b.shape[j] for j in free_b], np.float64)
    inner = [a.shape[i] for i in axes_a]
    for pos in np.ndindex(*out.shape):
        ia, ib = [0] * a.ndim, [0] * b.ndim
        for k, i in enumerate(free_a):
            ia[i] = pos[k]
        for k, j in enumerate(free_b):
            ib[j] = pos[len(free_a) + k]
        total = 0.0
        for s in np.ndindex(*inner):
            for k in range(len(inner)):
                ia[axes_a[k]] = s[k]
                ib[axes_b[k]] = s[k]
            total += a[tuple(ia)] * b[tuple(ib)]
        out[pos] = total
    return out.astype(np.result_type(a, b))


def batched_dot_reference(a, b):
    return np.stack([np.dot(x, y) for x, y in zip(a, b)])


CASES = [
    # matmul: every rank combination, broadcast batch axes
    Case("matmul_2d", L.matmul, [r(3, 4), r(4, 2)], matmul_reference),
    Case("matmul_vec_mat", L.matmul, [r(4), r(4, 2)], matmul_reference),
    Case("matmul_mat_vec", L.matmul, [r(3, 4), r(4)], matmul_reference),
    Case("matmul_vec_vec", L.matmul, [r(4), r(4)], matmul_reference),
    Case("matmul_batched", L.matmul, [r(2, 3, 4), r(2, 4, 5)], matmul_reference),
    Case("matmul_broadcast_batch", L.matmul, [r(2, 1, 3, 4), r(5, 4, 2)], matmul_reference),
    Case("matmul_batch_times_matrix", L.matmul, [r(2, 3, 4), r(4, 2)], matmul_reference),
    Case("matmul_vec_batch", L.matmul, [r(4), r(2, 4, 3)], matmul_reference),
    Case("matmul_batch_vec", L.matmul, [r(2, 3, 4), r(4)], matmul_reference),
    Case("matmul_dynamic", L.matmul, [r(2, 1, 3, 4), r(3, 4, 2)], matmul_reference, dynamic=True),
    Case("matmul_vec_vec_dynamic", L.matmul, [r(5), r(5)], matmul_reference, dynamic=True),
    Case("matmul_int", L.matmul, [np.arange(6).reshape(2, 3), np.arange(3)], matmul_reference, grad=False),
    # dot (lowers to mul, matmul or tensordot)
    Case("dot_scalar", L.dot, [r(), r(2, 3)], lambda a, b: a * b),
    Case("dot_matrix", L.dot, [r(2, 3), r(3, 4)], lambda a, b: np.einsum("ik,kj->ij", a, b)),
    Case("dot_vectors", L.dot, [r(3), r(3)], lambda a, b: np.asarray(np.sum(a * b))),
    Case("dot_nd", L.dot, [r(2, 3, 4), r(5, 4, 2)], lambda a, b: tensordot_reference(a, b, [2], [1])),
    Case("dot_vec_nd", L.dot, [r(4), r(2, 4, 3)], lambda a, b: tensordot_reference(a, b, [0], [1])),
    # gemm
    Case("gemm", L.gemm, [r(3, 4), r(4, 2)], gemm_reference),
    Case("gemm_bias_row", lambda a, b, c: L.gemm(a, b, c, alpha=0.5, beta=2.0), [r(3, 4), r(4, 2), r(2)],
         lambda a, b, c: gemm_reference(a, b, c, alpha=0.5, beta=2.0)),
    Case("gemm_trans_a", lambda a, b, c: L.gemm(a, b, c, trans_a=True), [r(4, 3), r(4, 2), r(3, 2)],
         lambda a, b, c: gemm_reference(a, b, c, trans_a=True)),
    Case("gemm_trans_b", lambda a, b, c: L.gemm(a, b, c, trans_b=True, alpha=-1.5), [r(3, 4), r(2, 4), r(3, 1)],
         lambda a, b, c: gemm_reference(a, b, c, trans_b=True, alpha=-1.5)),
    Case("gemm_trans_both_dynamic", lambda a, b, c: L.gemm(a, b, c, trans_a=True, trans_b=True, beta=0.25),
         [r(4, 3), r(2, 4), r(2)], lambda a, b, c: gemm_reference(a, b, c, True, True, beta=0.25), dynamic=True),
    # tensordot
    Case("tensordot_default", L.tensordot, [r(2, 3, 4), r(3, 4, 2)],
         lambda a, b: tensordot_reference(a, b, [1, 2], [0, 1])),
    Case("tensordot_outer", lambda a, b: L.tensordot(a, b, axes=0), [r(2, 3), r(2)],
         lambda a, b: tensordot_reference(a, b, [], [])),
    Case("tensordot_unsorted_pairs", lambda a, b: L.tensordot(a, b, axes=((2, 0), (1, 3))),
         [r(2, 3, 4), r(5, 4, 3, 2)], lambda a, b: tensordot_reference(a, b, [2, 0], [1, 3])),
    Case("tensordot_negative_dynamic", lambda a, b: L.tensordot(a, b, axes=([-1], [0])), [r(2, 3), r(3, 4)],
         lambda a, b: tensordot_reference(a, b, [1], [0]), dynamic=True),
    # outer and batched_dot (functions over the ops)
    Case("outer", L.outer, [r(3), r(4)], lambda a, b: a[:, None] * b[None, :]),
    Case("outer_flattens", L.outer, [r(2, 2), r(3)], lambda a, b: a.reshape(-1, 1) * b),
    Case("batched_dot_vectors", L.batched_dot, [r(3, 4), r(3, 4)], batched_dot_reference),
    Case("batched_dot_mat_vec", L.batched_dot, [r(3, 2, 4), r(3, 4)], batched_dot_reference),
    Case("batched_dot_vec_mat", L.batched_dot, [r(3, 4), r(3, 4, 2)], batched_dot_reference),
    Case("batched_dot_matrices", L.batched_dot, [r(3, 2, 4), r(3, 4, 5)], batched_dot_reference),
    Case("batched_dot_scalars", L.batched_dot, [r(3), r(3, 2, 2)], batched_dot_reference),
    Case("batched_dot_scalars_right", L.batched_dot, [r(3, 2), r(3)], batched_dot_reference),
    Case("batched_dot_3d_items", L.batched_dot, [r(2, 2, 3, 4), r(2, 4, 5)], batched_dot_reference),
    Case("batched_dot_3d_right", L.batched_dot, [r(2, 3, 4), r(2, 2, 4, 5)], batched_dot_reference),
    Case("batched_dot_3d_vec", L.batched_dot, [r(2, 2, 3, 4), r(2, 4)], batched_dot_reference),
    Case("batched_dot_dynamic", L.batched_dot, [r(3, 2, 4), r(3, 4, 5)], batched_dot_reference, dynamic=True),
    # the fused accumulating product (made by the compiler after differentiation: no gradient); big
    # enough for the BLAS path, and broadcasting both ways as the add it replaces
    Case("gemm_accumulate", lambda a, b, c: F.gemm_accumulate(a, b, c, alpha=-0.5, beta=2.0),
         [r(40, 60), r(60, 50), r(40, 50)], lambda a, b, c: -0.5 * (a.astype(np.float64) @ b) + 2.0 * c,
         grad=False, rtol=1e-4, atol=1e-4),
    Case("gemm_accumulate_scale", lambda a, b, c, s: F.gemm_accumulate(a, b, c, s, alpha=-1.0),
         [r(40, 60), r(60, 50), r(40, 50), np.array(0.25, np.float32)],
         lambda a, b, c, s: c - s * (a.astype(np.float64) @ b), grad=False, rtol=1e-4, atol=1e-4),
    Case("gemm_accumulate_beta_scale", lambda a, b, c, s, t: F.gemm_accumulate(a, b, c, s, t, alpha=-1.0, beta=0.5),
         [r(40, 60), r(60, 50), r(40, 50), np.array(0.25, np.float32), np.array(0.998, np.float32)],
         lambda a, b, c, s, t: 0.5 * 0.998 * c.astype(np.float64) - 0.25 * (a.astype(np.float64) @ b), grad=False,
         rtol=1e-4, atol=1e-4),
    Case("gemm_accumulate_wider_c", lambda a, b, c: F.gemm_accumulate(a, b, c, beta=-1.0),
         [r(1, 6), r(6, 5), r(4, 5)], lambda a, b, c: a @ b - c, grad=False, dynamic=True),
    Case("gemm_accumulate_wider_product", lambda a, b, c: F.gemm_accumulate(a, b, c, alpha=3.0),
         [r(4, 6), r(6, 5), r(1, 5)], lambda a, b, c: 3.0 * (a @ b) + c, grad=False, dynamic=True),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)




def _squared(y):
    return R.sum(E.mul(y, y))


SECOND_ORDER = [
    # d/da sum((a b)^2) = 2 (a b) b^T
    Case("matmul_2nd", second_order(lambda a, b: _squared(L.matmul(a, b))), [r(2, 3), r(3, 2)],
         lambda a, b: 2 * (a @ b) @ b.T, rtol=1e-4),
    Case("matmul_vec_2nd", second_order(lambda a, b: _squared(L.matmul(a, b))), [r(3), r(2, 3, 2)],
         lambda a, b: np.einsum("bj,bkj->k", 2 * matmul_reference(a, b), b), rtol=1e-4),
    Case("gemm_2nd", second_order(lambda a, b, c: _squared(L.gemm(a, b, c, trans_a=True, trans_b=True, alpha=2.0))),
         [r(3, 2), r(2, 3), r(2)],
         lambda a, b, c: (2 * 2 * (gemm_reference(a, b, c, True, True, 2.0)) @ b).T, rtol=1e-4),
    Case("tensordot_2nd", second_order(lambda a, b: _squared(L.tensordot(a, b, axes=((0, 2), (2, 0))))),
         [r(2, 3, 4), r(4, 5, 2)],
         lambda a, b: np.einsum("jm,kmi->ijk", 2 * np.einsum("ijk,kmi->jm", a, b), b), rtol=1e-4),
]


@pytest.mark.parametrize("case", SECOND_ORDER, ids=repr)
def test_second_derivatives(case, backend):
    check_case(case, backend)
    check_grad(case, backend)


def _sym(*shape, dtype="float32"):
    return input_value(TensorType(shape, dtype))


@pytest.mark.parametrize("build", [
    lambda: L.matmul(_sym(2, 3), _sym(4, 2)),
    lambda: L.matmul(_sym(), _sym(2)),
    lambda: L.matmul(_sym(2, 3, 4), _sym(3, 4, 2)),
    lambda: L.gemm(_sym(2, 3, 4), _sym(4, 2)),
    lambda: L.gemm(_sym(2, 3), _sym(2, 3)),
    lambda: L.gemm(_sym(2, 3), _sym(3, 4), _sym(3)),
    lambda: L.tensordot(_sym(2, 3), _sym(2, 3), axes=((0,), (1,))),
    lambda: L.tensordot(_sym(2, 3), _sym(2, 3), axes=3),
    lambda: L.batched_dot(_sym(), _sym(3, 2)),
], ids=["matmul_inner", "matmul_scalar", "matmul_batch", "gemm_rank", "gemm_inner", "gemm_bias", "tensordot_dims",
        "tensordot_count", "batched_dot_scalar"])
def test_bad_shapes_name_the_user_line(build):
    with pytest.raises(ShapeError) as info:
        build()
    assert "test_linalg.py" in str(info.value)


def test_matmul_writes_into_planned_buffer():
    a, b = _sym(3, 4), _sym(4, 5)
    f = cgvm.compile([a, b], E.exp(L.matmul(E.exp(a), b)))
    av, bv = r(3, 4), r(4, 5)
    np.testing.assert_allclose(f(av, bv), np.exp(np.exp(av) @ bv), rtol=1e-5)
    (plan,) = f.memory_plans().values()
    assert plan.dynamic_slots == 0, plan.summary()
