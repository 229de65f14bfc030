"""Elementwise arithmetic, comparison, logic, selection, rounding and cast ops against NumPy, and their gradients.

Math functions and activations are tested in test_elementwise_math.py.
"""
import numpy as np
import pytest

import cgvm
from cgvm.errors import GraphBuildError, ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R
from harness import Case, check_case, check_grad

rng = np.random.default_rng(42)


def r(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def ints(*shape, lo=-9, hi=10, dtype=np.int32):
    return rng.integers(lo, hi, size=shape).astype(dtype)


def nonzero_ints(*shape, dtype=np.int32):
    v = ints(*shape, dtype=dtype)
    return np.where(v == 0, 3, v).astype(dtype)


def away_from_zero(*shape):
    """Floats with |x| >= 0.5, safe as divisors."""
    v = r(*shape)
    return (np.sign(v) * (np.abs(v) + 0.5)).astype(np.float32)


def positive(*shape):
    return (np.abs(r(*shape)) + 0.5).astype(np.float32)


def small_ints_as_float(*shape):
    """Integer-valued floats, so comparisons meet equal entries."""
    return ints(*shape, lo=-2, hi=3).astype(np.float32)


def bools(*shape):
    return rng.random(shape) > 0.5


def per_element(fn):
    """A reference applying the Python function ``fn`` to each broadcast tuple of elements (ints and bools)."""
    def ref(*arrays):
        bs = np.broadcast_arrays(*arrays)
        dtype = np.result_type(*arrays)
        vals = [fn(*(v.item() for v in items)) for items in zip(*(b.ravel() for b in bs))]
        return np.array(vals, dtype=dtype).reshape(bs[0].shape)
    return ref


def second_derivative(op):
    """build(*xs) -> grad(sum(op(*xs)), xs): check_grad on it checks the second derivative."""
    def build(*xs):
        out = cgvm.grad(R.sum(op(*xs)), list(xs))
        return out
    return build


# --------------------------------------------------------------------------- arithmetic

ARITHMETIC = [
    Case("add", E.add, [r(3, 4), r(4)], lambda a, b: a + b),
    Case("add_dynamic", E.add, [r(2, 1, 4), r(3, 1)], lambda a, b: a + b, dynamic=True),
    Case("add_int", E.add, [ints(3, 4), ints(4)], lambda a, b: a + b, grad=False),
    Case("add_int_float", E.add, [ints(3, 4), r(3, 4)], lambda a, b: a + b),
    Case("add_scalar", lambda x: E.add(x, 2.5), [r(3)], lambda a: a + np.float32(2.5)),
    Case("sub", E.sub, [r(3, 4), r(3, 1)], lambda a, b: a - b),
    Case("sub_dynamic", E.sub, [r(1, 4), r(3, 1)], lambda a, b: a - b, dynamic=True),
    Case("mul", E.mul, [r(2, 3), r(2, 3)], lambda a, b: a * b),
    Case("mul_broadcast", E.mul, [r(2, 1, 3), r(4, 1)], lambda a, b: a * b),
    Case("div", E.div, [r(3, 4), away_from_zero(4)], lambda a, b: a / b),
    Case("div_dynamic", E.div, [r(2, 3), away_from_zero(2, 1)], lambda a, b: a / b, dynamic=True),
    Case("div_int_gives_float64", E.div, [ints(2, 3), nonzero_ints(3)], lambda a, b: np.true_divide(a, b),
         grad=False),
    Case("floordiv_float", E.floordiv, [r(3, 4) * 4, away_from_zero(4)], lambda a, b: np.floor_divide(a, b),
         grad=False),
    Case("floordiv_int_negative", E.floordiv, [ints(3, 4), nonzero_ints(3, 4)], lambda a, b: a // b, grad=False),
    Case("mod_float", E.mod, [r(3, 4) * 4, away_from_zero(3, 1)], lambda a, b: np.remainder(a, b)),
    Case("mod_int_negative", E.mod, [ints(3, 4), nonzero_ints(4)], lambda a, b: a % b, grad=False),
    Case("neg", E.neg, [r(5)], lambda a: -a),
    Case("neg_int", E.neg, [ints(5)], lambda a: -a, grad=False),
    Case("pow", E.pow, [positive(3, 4), r(4)], lambda a, b: a ** b, rtol=1e-4),
    Case("pow_dynamic", E.pow, [positive(2, 3), r(2, 1)], lambda a, b: a ** b, dynamic=True, rtol=1e-4),
    Case("pow_integer_exponent_negative_base", lambda x: E.pow(x, 3), [r(2, 3)], lambda a: a ** np.float32(3)),
    Case("pow_int", E.pow, [ints(2, 3), ints(2, 3, lo=0, hi=4)], lambda a, b: a ** b, grad=False),
    Case("square", E.square, [r(3, 2)], np.square),
    Case("square_int", E.square, [ints(4)], np.square, grad=False),
    Case("reciprocal", E.reciprocal, [away_from_zero(3, 2)], np.reciprocal),
    Case("abs", E.abs, [r(3, 4)], np.abs),
    Case("abs_int", E.abs, [ints(6)], np.abs, grad=False),
    Case("sign", E.sign, [np.array([-2.0, 0.0, 3.5], np.float32)], np.sign, grad=False),
]

# --------------------------------------------------------------------------- maximum, minimum, clip, where

SELECTION = [
    Case("maximum", E.maximum, [r(3, 4), r(4)], np.maximum),
    Case("maximum_dynamic", E.maximum, [r(2, 1), r(1, 3)], np.maximum, dynamic=True),
    Case("minimum", E.minimum, [r(3, 4), r(3, 1)], np.minimum),
    Case("minimum_int", E.minimum, [ints(3, 4), ints(4)], np.minimum, grad=False),
    Case("clip", lambda x: E.clip(x, lo=-0.5, hi=0.7), [r(4, 5)], lambda a: np.clip(a, -0.5, 0.7)),
    Case("clip_lo_only", lambda x: E.clip(x, lo=0.1), [r(4, 3)], lambda a: np.maximum(a, np.float32(0.1))),
    Case("clip_hi_only", lambda x: E.clip(x, hi=0.2), [r(4, 3)], lambda a: np.minimum(a, np.float32(0.2))),
    Case("clip_no_bounds", E.clip, [r(3)], lambda a: a),
    Case("clip_int_fractional_bounds", lambda x: E.clip(x, lo=-2.5, hi=3.5), [ints(10)],
         lambda a: np.clip(a, -2, 3), grad=False),
    Case("clip_int_bounds_beyond_dtype", lambda x: E.clip(x, lo=-1e30, hi=4), [ints(10, dtype=np.int8)],
         lambda a: np.minimum(a, np.int8(4)), grad=False),
    Case("clip_tensor_bounds", E.clip, [r(3, 4), r(4) - 0.5, r(3, 1) + 0.5],
         lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi)),
    Case("clip_tensor_bounds_dynamic", E.clip, [r(3, 4), r(4) - 0.5, r(3, 1) + 0.5],
         lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi), dynamic=True),
    Case("where", E.where, [bools(3, 4), r(3, 4), r(4)], lambda c, a, b: np.where(c, a, b)),
    Case("where_dynamic", E.where, [bools(3, 1), r(1, 4), r(3, 4)], lambda c, a, b: np.where(c, a, b), dynamic=True),
    Case("where_int_condition", E.where, [ints(5, lo=0, hi=2), r(5), r(5)], lambda c, a, b: np.where(c, a, b)),
    Case("where_mixed_dtypes", E.where, [bools(4), ints(4), r(4)], lambda c, a, b: np.where(c, a, b), grad=False),
]

# --------------------------------------------------------------------------- comparisons, logic, rounding, cast

_cmp = [small_ints_as_float(3, 4), small_ints_as_float(4)]
LOGIC = [
    Case("eq", E.eq, _cmp, np.equal, grad=False),
    Case("ne", E.ne, _cmp, np.not_equal, grad=False),
    Case("lt", E.lt, _cmp, np.less, grad=False),
    Case("le", E.le, _cmp, np.less_equal, grad=False),
    Case("gt", E.gt, _cmp, np.greater, grad=False),
    Case("ge", E.ge, _cmp, np.greater_equal, grad=False),
    Case("ge_dynamic", E.ge, [small_ints_as_float(3, 1), small_ints_as_float(1, 2)], np.greater_equal,
         dynamic=True, grad=False),
    Case("lt_int_float", E.lt, [ints(5), r(5)], np.less, grad=False),
    Case("logical_and", E.logical_and, [bools(3, 4), bools(4)], np.logical_and, grad=False),
    Case("logical_or", E.logical_or, [bools(3, 4), bools(3, 1)], np.logical_or, grad=False),
    Case("logical_xor", E.logical_xor, [bools(3, 4), bools(3, 4)], np.logical_xor, grad=False),
    Case("logical_not", E.logical_not, [bools(5)], np.logical_not, grad=False),
    Case("logical_and_of_numbers", E.logical_and, [small_ints_as_float(6), ints(6, lo=0, hi=2)],
         np.logical_and, grad=False),
    Case("bitwise_and_int", E.bitwise_and, [ints(3, 4, lo=-64, hi=64), ints(4, lo=-64, hi=64)],
         per_element(lambda a, b: a & b), grad=False),
    Case("bitwise_or_int8_int32", E.bitwise_or, [ints(5, lo=-100, hi=100, dtype=np.int8), ints(5, lo=-900, hi=900)],
         per_element(lambda a, b: a | b), grad=False),
    Case("bitwise_xor_int64", E.bitwise_xor,
         [ints(2, 3, lo=-2**40, hi=2**40, dtype=np.int64), ints(2, 1, dtype=np.int64)],
         per_element(lambda a, b: a ^ b), grad=False),
    Case("bitwise_and_bool_is_logical", E.bitwise_and, [bools(3, 4), bools(4)], per_element(lambda a, b: a and b),
         grad=False),
    Case("bitwise_or_bool_is_logical", E.bitwise_or, [bools(3, 4), bools(3, 1)], per_element(lambda a, b: a or b),
         grad=False),
    Case("bitwise_xor_bool_is_logical", E.bitwise_xor, [bools(6), bools(6)], per_element(lambda a, b: a != b),
         grad=False),
    Case("invert_int", E.invert, [ints(7)], per_element(lambda a: -a - 1), grad=False),
    Case("invert_uint8", E.invert, [ints(6, lo=0, hi=256, dtype=np.uint8)], per_element(lambda a: 255 - a),
         grad=False),
    Case("invert_bool_is_logical_not", E.invert, [bools(6)], per_element(lambda a: not a), grad=False),
    Case("floor", E.floor, [r(3, 4) * 3], np.floor, grad=False),
    Case("ceil", E.ceil, [r(3, 4) * 3], np.ceil, grad=False),
    Case("floor_int", E.floor, [ints(4)], np.floor, grad=False),
    Case("round_half_to_even", E.round, [np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49, 2.51], np.float32)],
         lambda a: np.array([0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 0.0, 3.0], np.float32), grad=False),
    Case("round_decimals", lambda x: E.round(x, decimals=1), [r(6) * 10], lambda a: np.round(a, 1), grad=False),
    Case("round_int_negative_decimals", lambda x: E.round(x, decimals=-1), [ints(6, lo=-99, hi=99)],
         lambda a: np.round(a, -1), grad=False),
    Case("cast_int", lambda x: E.cast(x, dtype="int32"), [r(3) * 10], lambda a: a.astype(np.int32), grad=False),
    Case("cast_float64", lambda x: E.cast(x, dtype="float64"), [r(3, 2)], lambda a: a.astype(np.float64)),
]

# --------------------------------------------------------------------------- second derivatives

SECOND = [
    Case("mul_2nd", second_derivative(E.mul), [r(3), r(3)], lambda a, b: (b, a), grad_inputs=[0, 1]),
    Case("div_2nd", second_derivative(E.div), [r(3), away_from_zero(3)], lambda a, b: (1 / b, -a / (b * b))),
    Case("pow_2nd", second_derivative(E.pow), [positive(4), r(4)],
         lambda a, b: (b * a ** (b - 1), a ** b * np.log(a)), rtol=1e-4),
    Case("square_2nd", second_derivative(E.square), [r(4)], lambda a: 2 * a),
    Case("reciprocal_2nd", second_derivative(E.reciprocal), [away_from_zero(4)], lambda a: -1 / (a * a)),
]

CASES = ARITHMETIC + SELECTION + LOGIC + SECOND


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)


def _grads(build, inputs, backend):
    """cgvm.grad of sum(build(*xs)) with respect to every input, as NumPy arrays."""
    xs = [input_value(TensorType(a.shape, a.dtype), f"x{i}") for i, a in enumerate(inputs)]
    ws = cgvm.Workspace(backend)
    f = cgvm.compile(xs, cgvm.grad(R.sum(build(*xs)), xs), workspace=ws)
    return [ws.backend.to_numpy(g) for g in f(*[ws.backend.asarray(a) for a in inputs])]


@pytest.mark.parametrize("op,larger", [(E.maximum, True), (E.minimum, False)], ids=["maximum", "minimum"])
def test_maximum_minimum_split_ties(op, larger, backend):
    a = np.array([1.0, 2.0, 3.0, -1.0])
    b = np.array([1.0, 0.0, 5.0, -1.0])
    ga, gb = _grads(op, [a, b], backend)
    a_wins = (a > b) if larger else (a < b)
    np.testing.assert_array_equal(ga, np.where(a == b, 0.5, a_wins.astype(float)))
    np.testing.assert_array_equal(gb, 1 - ga)


def test_clip_gradient_includes_bounds(backend):
    x = np.array([-1.0, -0.5, 0.0, 0.5, 1.0])
    (gx,) = _grads(lambda v: E.clip(v, lo=-0.5, hi=0.5), [x], backend)
    np.testing.assert_array_equal(gx, [0.0, 1.0, 1.0, 1.0, 0.0])


def test_kernels_run_in_place(backend):
    """A chain whose intermediates die at once reuses their buffers (in-place pairs are declared)."""
    a, b, c = r(4, 5), r(4, 5), r(4, 5)
    xs = [input_value(TensorType(v.shape, v.dtype), n) for v, n in zip((a, b, c), "abc")]
    t = E.where(E.gt(xs[2], 0), E.mul(xs[0], xs[1]), xs[2])
    t = E.clip(E.abs(E.add(t, xs[0])), hi=0.5)
    y = E.mul(E.sub(t, xs[1]), 2.0)
    ws = cgvm.Workspace(backend)
    f = cgvm.compile(xs, [y], workspace=ws, debug=True, passes=[p for p in cgvm.compiler.pass_names() if p != "fuse"])
    got = ws.backend.to_numpy(f(*[ws.backend.asarray(v) for v in (a, b, c)])[0])
    want = (np.minimum(np.abs(np.where(c > 0, a * b, c) + a), np.float32(0.5)) - b) * 2
    np.testing.assert_allclose(got, want, rtol=1e-6)
    (plan,) = f.memory_plans().values()
    assert len(plan.inplace) >= 3, plan.summary()


def test_broadcast_mismatch_names_the_source():
    a = input_value(TensorType((3, 4), "float32"), "a")
    b = input_value(TensorType((5,), "float32"), "b")
    with pytest.raises(ShapeError, match="test_elementwise.py"):
        E.add(a, b)


def test_boolean_subtract_is_refused_as_numpy_does():
    a = input_value(TensorType((3,), "bool"), "a")
    with pytest.raises(ShapeError, match=r"subtract.*test_elementwise\.py"):
        E.sub(a, a)


def test_clip_with_two_inputs_is_refused():
    a = input_value(TensorType((3,), "float32"), "a")
    with pytest.raises(ShapeError, match="clip.*test_elementwise.py"):
        E.clip(a, a)


def test_bad_attribute_names_the_source():
    a = input_value(TensorType((3,), "float32"), "a")
    with pytest.raises(GraphBuildError, match="decimals.*test_elementwise.py"):
        E.round(a, decimals=1.5)


@pytest.mark.parametrize("op", [E.bitwise_and, E.bitwise_or, E.bitwise_xor, lambda a, b: E.invert(a)],
                         ids=["and", "or", "xor", "invert"])
def test_bitwise_ops_refuse_floats_as_numpy_does(op):
    a = input_value(TensorType((3,), "float32"), "a")
    with pytest.raises(ShapeError, match=r"(bitwise|invert).*test_elementwise\.py"):
        op(a, a)
