"""bit_shift, cumprod, einsum, det and bitcast (the ops added for ONNX) against plain NumPy/Python
references, and the gradients of cumprod (zeros included) and einsum by central differences."""
import itertools

import numpy as np
import pytest

from cgvm.errors import GraphBuildError
from cgvm.ir import TensorType, input_value
from cgvm.ops import tensor_math as TM
from harness import Case, check_case, check_grad

rng = np.random.default_rng(5)


def r(*shape):
    return rng.standard_normal(shape).astype(np.float64)


def shift_ref(x, y, direction):
    """Bit by bit in Python: a shift outside [0, bits) moves every bit out (sign fill to the right)."""
    bits = x.dtype.itemsize * 8
    out = np.empty_like(x)
    for i in np.ndindex(x.shape):
        a, s = int(x[i]), int(np.broadcast_to(y, x.shape)[i])
        if 0 <= s < bits:
            v = a << s if direction == "left" else a >> s
        else:
            v = 0 if direction == "left" or a >= 0 else -1
        out[i] = np.array(v).astype(np.int64).astype(x.dtype) if direction == "right" else \
            np.array(v & ((1 << bits) - 1), dtype=np.uint64).astype(x.dtype)
    return out


def cumprod_ref(a, axis, reverse=False):
    moved = np.moveaxis(a, axis, 0)
    out = np.empty_like(moved)
    order = range(moved.shape[0] - 1, -1, -1) if reverse else range(moved.shape[0])
    acc = np.ones(moved.shape[1:], a.dtype)
    for i in order:
        acc = acc * moved[i]
        out[i] = acc
    return np.moveaxis(out, 0, axis)


def matmul_loops(a, b):
    out = np.zeros((a.shape[0], b.shape[1]))
    for i, j, k in itertools.product(range(a.shape[0]), range(b.shape[1]), range(a.shape[1])):
        out[i, j] += a[i, k] * b[k, j]
    return out


def det_ref(m):
    """Laplace expansion (small matrices only)."""
    if m.shape[0] == 1:
        return m[0, 0]
    return sum((-1) ** j * m[0, j] * det_ref(np.delete(m[1:], j, axis=1)) for j in range(m.shape[0]))


with_zero = r(2, 4)
with_zero[1, 2] = 0.0

CASES = [
    Case("bit_shift_left_uint8", lambda x, y: TM.bit_shift(x, y, direction="left"),
         [np.array([1, 3, 200, 7], np.uint8), np.array([1, 2, 1, 9], np.uint8)],
         lambda x, y: shift_ref(x, y, "left"), grad=False),
    Case("bit_shift_right_int32_out_of_range", lambda x, y: TM.bit_shift(x, y, direction="right"),
         [np.array([-8, 4, -1, 64], np.int32), np.array([32, 33, -1, 3], np.int32)],
         lambda x, y: shift_ref(x, y, "right"), grad=False),
    Case("cumprod_axis1", lambda x: TM.cumprod(x, axis=1), [r(2, 4)], lambda a: cumprod_ref(a, 1)),
    Case("cumprod_reverse_axis0", lambda x: TM.cumprod(x, axis=0, reverse=True), [r(3, 2)],
         lambda a: cumprod_ref(a, 0, True)),
    Case("cumprod_with_a_zero", lambda x: TM.cumprod(x, axis=1), [with_zero], lambda a: cumprod_ref(a, 1)),
    Case("einsum_matmul", lambda a, b: TM.einsum(a, b, equation="ij,jk->ik"), [r(2, 3), r(3, 4)], matmul_loops),
    Case("einsum_batch_ellipsis", lambda a, b: TM.einsum(a, b, equation="...ij,...jk"), [r(2, 2, 3), r(2, 3, 2)],
         lambda a, b: np.stack([matmul_loops(a[i], b[i]) for i in range(2)])),
    Case("einsum_trace_free_sum", lambda a: TM.einsum(a, equation="ij->j"), [r(3, 4)], lambda a: a.sum(axis=0)),
    Case("det_batch", TM.det, [r(2, 3, 3)], lambda m: np.array([det_ref(m[0]), det_ref(m[1])]), grad=False),
    Case("bitcast_float32_int32", lambda x: TM.bitcast(x, dtype="int32"), [np.array([1.0, -2.5], np.float32)],
         lambda x: np.frombuffer(x.tobytes(), np.int32), grad=False),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)


def test_type_rules_refuse_what_does_not_fit():
    x = input_value(TensorType((2, 3), "float32"))
    with pytest.raises(GraphBuildError, match="element sizes differ"):
        TM.bitcast(x, dtype="int64")
    with pytest.raises(GraphBuildError, match="square matrices"):
        TM.det(x)
    with pytest.raises(GraphBuildError, match="bit_shift takes integers"):
        TM.bit_shift(x, x)
    with pytest.raises(GraphBuildError, match="index 'j' is 3 and 4"):
        TM.einsum(x, input_value(TensorType((4, 2), "float32")), equation="ij,jk->ik")
