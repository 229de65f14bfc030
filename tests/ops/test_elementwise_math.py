"""Elementwise math functions and activations against NumPy/math references, first and second derivatives."""
import math

import numpy as np
import pytest

import cgvm
from cgvm.errors import GraphBuildError
from cgvm.ir import TensorType, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R
from harness import Case, check_case, check_grad

rng = np.random.default_rng(7)


def r(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def positive(*shape, dtype=np.float32):
    return (np.abs(rng.standard_normal(shape)) + 0.5).astype(dtype)


def ints(*shape, dtype=np.int32):
    return rng.integers(-5, 6, size=shape).astype(dtype)


def erf_ref(a):
    return np.array([math.erf(v) for v in np.asarray(a, np.float64).ravel()]).reshape(np.shape(a)).astype(a.dtype)


def sigmoid_ref(a):
    return np.array([1 / (1 + math.exp(-v)) if v >= 0 else math.exp(v) / (1 + math.exp(v))
                     for v in np.asarray(a, np.float64).ravel()]).reshape(a.shape).astype(a.dtype)


def softplus_ref(a):
    return np.array([max(v, 0.0) + math.log1p(math.exp(-abs(v))) for v in np.asarray(a, np.float64).ravel()]
                    ).reshape(a.shape).astype(a.dtype)


def elu_ref(a, alpha=1.0):
    return np.where(a > 0, a, alpha * np.expm1(np.minimum(a, 0))).astype(a.dtype)


def second_derivative(op):
    """build(x) -> grad(sum(op(x)), x): check_grad on it checks the second derivative."""
    return lambda x: cgvm.grad(R.sum(op(x)), x)


# erf over all three of Cody's ranges (|x| < 0.46875, < 4, beyond), both signs and the borders
ERF_POINTS = np.array([0.0, -0.0, 1e-12, 0.1, -0.3, 0.46875, -0.46875, 0.47, 1.0, -2.2, 3.99, 4.0, -4.0, 4.01,
                       5.5, -6.3, 9.0, 27.0, -40.0])

VALUES = [
    Case("exp", E.exp, [r(3, 3)], np.exp),
    Case("exp_int_gives_float64", E.exp, [ints(4)], np.exp, grad=False),
    Case("exp_int8_gives_float16", E.exp, [ints(4, dtype=np.int8)], np.exp, grad=False, rtol=1e-3),
    Case("expm1", E.expm1, [r(3, 3) * 1e-3], np.expm1),
    Case("log", E.log, [positive(3, 4)], np.log),
    Case("log_dynamic", E.log, [positive(2, 3)], np.log, dynamic=True),
    Case("log1p", E.log1p, [positive(3, 2) - 0.4], np.log1p),
    Case("sqrt", E.sqrt, [positive(3, 2)], np.sqrt),
    Case("rsqrt", E.rsqrt, [positive(3, 2)], lambda a: 1 / np.sqrt(a)),
    Case("rsqrt_int", E.rsqrt, [np.array([1, 4, 9], np.int32)], lambda a: 1 / np.sqrt(a), grad=False),
    Case("rsqrt_0d", E.rsqrt, [np.array(4.0, np.float32)], lambda a: np.float32(0.5)),
    Case("sin", E.sin, [r(3, 4)], np.sin),
    Case("cos", E.cos, [r(3, 4)], np.cos),
    Case("tanh", E.tanh, [r(3, 3)], np.tanh),
    Case("sigmoid", E.sigmoid, [r(3, 4) * 3], sigmoid_ref),
    Case("sigmoid_extreme", E.sigmoid, [np.array([-800.0, -40.0, 0.0, 40.0, 800.0], np.float32)], sigmoid_ref,
         grad=False),
    Case("sigmoid_0d", E.sigmoid, [np.array(0.3, np.float32)], sigmoid_ref),
    Case("sigmoid_int", E.sigmoid, [ints(5)], lambda a: sigmoid_ref(a.astype(np.float64)), grad=False),
    Case("softplus", E.softplus, [r(3, 4) * 3], softplus_ref),
    Case("softplus_extreme", E.softplus, [np.array([-800.0, -30.0, 0.0, 30.0, 800.0], np.float32)], softplus_ref,
         grad=False),
    Case("relu", E.relu, [r(4, 5)], lambda a: np.maximum(a, 0)),
    Case("relu_leaky", lambda x: E.relu(x, negative_slope=0.1), [r(4, 5)], lambda a: np.where(a > 0, a, 0.1 * a)),
    Case("relu_int", E.relu, [ints(6)], lambda a: np.maximum(a, 0), grad=False),
    Case("elu", E.elu, [r(4, 5)], elu_ref),
    Case("elu_alpha", lambda x: E.elu(x, alpha=0.3), [r(4, 5)], lambda a: elu_ref(a, 0.3)),
    Case("elu_large", E.elu, [np.array([-1000.0, 1000.0, 2.0], np.float32)], elu_ref, grad=False),
    Case("erf", E.erf, [r(3, 4) * 2], erf_ref),
    Case("erf_ranges_float64", E.erf, [ERF_POINTS], erf_ref, rtol=2e-15, atol=0, grad=False),
    Case("erf_ranges_float32", E.erf, [ERF_POINTS.astype(np.float32)], erf_ref, rtol=1e-6, atol=1e-7, grad=False),
    Case("erf_float16", E.erf, [ERF_POINTS.astype(np.float16)], erf_ref, rtol=1e-3, atol=1e-3, grad=False),
    Case("erf_gradient_every_range", E.erf, [np.array([0.2, -0.45, 0.5, -1.7, 3.9, 4.2, -4.5])], erf_ref),
]

SECOND = [
    Case("exp_2nd", second_derivative(E.exp), [r(4)], np.exp),
    Case("expm1_2nd", second_derivative(E.expm1), [r(4)], np.exp),
    Case("log_2nd", second_derivative(E.log), [positive(4)], lambda a: 1 / a),
    Case("log1p_2nd", second_derivative(E.log1p), [positive(4)], lambda a: 1 / (1 + a)),
    Case("sqrt_2nd", second_derivative(E.sqrt), [positive(4)], lambda a: 0.5 / np.sqrt(a)),
    Case("rsqrt_2nd", second_derivative(E.rsqrt), [positive(4)], lambda a: -0.5 * a ** -1.5),
    Case("sin_2nd", second_derivative(E.sin), [r(4)], np.cos),
    Case("cos_2nd", second_derivative(E.cos), [r(4)], lambda a: -np.sin(a)),
    Case("tanh_2nd", second_derivative(E.tanh), [r(4)], lambda a: 1 - np.tanh(a) ** 2),
    Case("sigmoid_2nd", second_derivative(E.sigmoid), [r(4)], lambda a: sigmoid_ref(a) * (1 - sigmoid_ref(a))),
    Case("softplus_2nd", second_derivative(E.softplus), [r(4)], sigmoid_ref),
    Case("elu_2nd", second_derivative(lambda x: E.elu(x, alpha=0.7)), [r(6)],
         lambda a: np.where(a > 0, 1, 0.7 * np.exp(a)).astype(a.dtype)),
    Case("erf_2nd", second_derivative(E.erf), [r(5)], lambda a: 2 / np.sqrt(np.pi) * np.exp(-a * a)),
]

CASES = VALUES + SECOND


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)


def test_erf_matches_math_erf_densely(backend):
    x = np.concatenate([np.linspace(-7, 7, 4001), [np.inf, -np.inf]])
    xs = input_value(TensorType(x.shape, "float64"), "x")
    ws = cgvm.Workspace(backend)
    f = cgvm.compile([xs], E.erf(xs), workspace=ws)
    got = ws.backend.to_numpy(f(x))
    want = np.array([math.erf(v) for v in x])
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-300)
    assert np.isnan(ws.backend.to_numpy(f(np.full(x.shape, np.nan)))).all()


@pytest.mark.parametrize("op", [E.sigmoid, E.softplus, E.rsqrt, E.elu, E.erf, E.relu, E.exp],
                         ids=lambda op: op.name)
def test_multi_step_kernels_in_place(op, backend):
    """f(a + b) with the sum dying there: the op may write over its input's buffer."""
    a, b = positive(3, 4), positive(3, 4)
    xs = [input_value(TensorType(v.shape, v.dtype), n) for v, n in zip((a, b), "ab")]
    y = E.mul(op(E.add(xs[0], xs[1])), 2.0)
    ws = cgvm.Workspace(backend)
    f = cgvm.compile(xs, [y], workspace=ws, passes=[p for p in cgvm.compiler.pass_names() if p != "fuse"])
    got = ws.backend.to_numpy(f(ws.backend.asarray(a), ws.backend.asarray(b))[0])
    plain = cgvm.compile(xs, [y], workspace=ws, plan=False)
    want = ws.backend.to_numpy(plain(ws.backend.asarray(a), ws.backend.asarray(b))[0])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    (plan,) = f.memory_plans().values()
    assert plan.inplace, plan.summary()


def test_bad_attribute_names_the_source():
    x = input_value(TensorType((3,), "float32"), "x")
    with pytest.raises(GraphBuildError, match="alpha.*test_elementwise_math.py"):
        E.elu(x, alpha="big")
