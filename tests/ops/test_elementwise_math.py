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


def per_element(fn):
    """A reference: the Python float function ``fn`` on every element (in float64), cast to the input's float type."""
    def ref(*arrays):
        bs = np.broadcast_arrays(*[np.asarray(a, np.float64) for a in arrays])
        vals = [fn(*items) for items in zip(*(b.ravel().tolist() for b in bs))]
        dtype = np.result_type(*arrays) if np.result_type(*arrays).kind == "f" else np.float64
        return np.array(vals).reshape(bs[0].shape).astype(dtype)
    return ref


def digamma_by_differences(x):
    """psi = (log Gamma)' by a 4-point central difference of math.lgamma (about 1e-11 relative)."""
    h = 1e-3 * max(1.0, abs(x))
    f = math.lgamma
    return (8 * (f(x + h) - f(x - h)) - (f(x + 2 * h) - f(x - 2 * h))) / (12 * h)


def trigamma_by_series(x):
    """psi_1(x) = sum_k 1/(x+k)^2 for x > 0: 2000 terms and the Euler-Maclaurin tail."""
    terms = 2000
    head = math.fsum(1.0 / (x + k) ** 2 for k in range(terms))
    z = x + terms
    return head + 1 / z + 1 / (2 * z * z) + 1 / (6 * z ** 3) - 1 / (30 * z ** 5)


def erfinv_by_bisection(y):
    """The x with math.erf(x) = y, by bisection to the last bit (on math.erfc beyond 1/2, where erf is flat)."""
    if abs(y) >= 1 or y == 0:
        return math.copysign(math.inf, y) if abs(y) == 1 else y
    a = abs(y)
    too_small = (lambda x: math.erfc(x) > 1 - a) if a > 0.5 else (lambda x: math.erf(x) < a)
    lo, hi = 0.0, 6.0
    while True:
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            return math.copysign(hi if abs(math.erf(hi) - a) < abs(math.erf(lo) - a) else lo, y)
        lo, hi = (mid, hi) if too_small(mid) else (lo, mid)


def away_from_zero(*shape):
    v = r(*shape)
    return (np.sign(v) * (np.abs(v) + 0.5)).astype(np.float32)


def inside_unit(*shape, dtype=np.float32):
    return rng.uniform(-0.95, 0.95, shape).astype(dtype)


def gamma_points(*shape, dtype=np.float32):
    """Positive values and negative non-integers (at least 0.15 from a pole)."""
    v = rng.uniform(-3.5, 5.0, shape)
    frac = v - np.round(v)
    v = np.where((v < 0.2) & (np.abs(frac) < 0.15), np.round(v) + np.copysign(0.3, frac + 1e-9), v)
    return np.where(np.abs(v) < 0.15, 0.4, v).astype(dtype)


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
    Case("log2", E.log2, [positive(3, 4)], per_element(math.log2)),
    Case("log2_int", E.log2, [np.array([1, 2, 8, 1024], np.int32)], lambda a: np.array([0.0, 1.0, 3.0, 10.0]),
         grad=False),
    Case("log10", E.log10, [positive(3, 4)], per_element(math.log10)),
    Case("tan", E.tan, [inside_unit(3, 4)], per_element(math.tan)),
    Case("arcsin", E.arcsin, [inside_unit(3, 4)], per_element(math.asin)),
    Case("arccos", E.arccos, [inside_unit(3, 4)], per_element(math.acos)),
    Case("arctan", E.arctan, [r(3, 4) * 3], per_element(math.atan)),
    Case("arctan2", E.arctan2, [r(3, 4), r(4)], per_element(math.atan2)),
    Case("arctan2_every_quadrant_and_axis", E.arctan2, [np.array([1.0, 1.0, -1.0, -1.0, 0.0, 0.0, -0.0, 2.0]),
                                                        np.array([1.0, -1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 0.0])],
         per_element(math.atan2), grad=False),
    Case("arctan2_int_gives_float64", E.arctan2, [ints(4), ints(4) + 7], per_element(math.atan2), grad=False),
    Case("sinh", E.sinh, [r(3, 4) * 2], per_element(math.sinh)),
    Case("sinh_small_keeps_digits", E.sinh, [np.array([1e-10, -3e-9, 2e-300])], per_element(math.sinh), rtol=1e-15,
         atol=0, grad=False),
    Case("cosh", E.cosh, [r(3, 4) * 2], per_element(math.cosh)),
    Case("arcsinh", E.arcsinh, [r(3, 4) * 3], per_element(math.asinh)),
    Case("arcsinh_large_negative", E.arcsinh, [np.array([-1e8, -1e300, -1e-12])], per_element(math.asinh),
         rtol=1e-15, atol=0, grad=False),
    Case("arccosh", E.arccosh, [positive(3, 4) + 1.0], per_element(math.acosh)),
    Case("arctanh", E.arctanh, [inside_unit(3, 4)], per_element(math.atanh)),
    Case("arctanh_small_keeps_digits", E.arctanh, [np.array([1e-12, -2e-9])], per_element(math.atanh), rtol=1e-15,
         atol=0, grad=False),
    Case("gamma", E.gamma, [gamma_points(3, 4)], per_element(math.gamma), rtol=2e-6),
    Case("gamma_float64", E.gamma, [gamma_points(12, dtype=np.float64)], per_element(math.gamma), rtol=1e-13, atol=0,
         grad=False),
    Case("gamma_int", E.gamma, [np.array([1, 2, 5, 10], np.int32)], lambda a: np.array([1.0, 1.0, 24.0, 362880.0]),
         grad=False),
    Case("gammaln", E.gammaln, [gamma_points(3, 4)], per_element(math.lgamma)),
    Case("gammaln_float64", E.gammaln, [np.concatenate([gamma_points(12, dtype=np.float64), [30.5, 1e5, -40.3]])],
         per_element(math.lgamma), rtol=1e-13, atol=1e-15, grad=False),
    Case("digamma", E.digamma, [gamma_points(3, 4)], per_element(digamma_by_differences), rtol=1e-5, atol=1e-5),
    Case("digamma_float64", E.digamma, [np.abs(gamma_points(10, dtype=np.float64)) + 0.5],
         per_element(digamma_by_differences), rtol=1e-9, atol=1e-10, grad=False),
    Case("trigamma", lambda x: E.polygamma(x, n=1), [positive(3, 4)], per_element(trigamma_by_series)),
    Case("trigamma_float64", lambda x: E.polygamma(x, n=1), [np.array([0.05, 0.5, 1.0, 3.3, 9.9, 10.1, 250.0])],
         per_element(trigamma_by_series), rtol=1e-13, atol=0, grad=False),
    Case("erfinv", E.erfinv, [inside_unit(3, 4)], per_element(erfinv_by_bisection)),
    Case("erfinv_float64", E.erfinv, [np.array([0.0, 1e-300, -1e-8, 0.3, -0.5, 0.51, 0.9, -0.999, 1 - 2.0 ** -52])],
         per_element(erfinv_by_bisection), rtol=1e-14, atol=0, grad=False),
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
    Case("log2_2nd", second_derivative(E.log2), [positive(4)], lambda a: 1 / (a * np.log(2))),
    Case("tan_2nd", second_derivative(E.tan), [inside_unit(4)], lambda a: 1 / np.cos(a) ** 2),
    Case("arcsin_2nd", second_derivative(E.arcsin), [inside_unit(4)], lambda a: 1 / np.sqrt(1 - a * a)),
    Case("arccos_2nd", second_derivative(E.arccos), [inside_unit(4)], lambda a: -1 / np.sqrt(1 - a * a)),
    Case("arctan_2nd", second_derivative(E.arctan), [r(4)], lambda a: 1 / (1 + a * a)),
    Case("arctan2_2nd", lambda y, x: cgvm.grad(R.sum(E.arctan2(y, x)), [y, x]), [r(4), away_from_zero(4)],
         lambda y, x: (x / (x * x + y * y), -y / (x * x + y * y)), grad_inputs=[0, 1]),
    Case("sinh_2nd", second_derivative(E.sinh), [r(4)], np.cosh),
    Case("cosh_2nd", second_derivative(E.cosh), [r(4)], np.sinh),
    Case("arcsinh_2nd", second_derivative(E.arcsinh), [r(4)], lambda a: 1 / np.sqrt(a * a + 1)),
    Case("arccosh_2nd", second_derivative(E.arccosh), [positive(4) + 1.0], lambda a: 1 / np.sqrt(a * a - 1)),
    Case("arctanh_2nd", second_derivative(E.arctanh), [inside_unit(4)], lambda a: 1 / (1 - a * a)),
    Case("gamma_2nd", second_derivative(E.gamma), [gamma_points(5)],
         lambda a: per_element(lambda v: math.gamma(v) * digamma_by_differences(v))(a), rtol=1e-4, atol=1e-4),
    Case("gammaln_2nd", second_derivative(E.gammaln), [gamma_points(5)], per_element(digamma_by_differences),
         rtol=1e-4, atol=1e-4),
    Case("digamma_2nd", second_derivative(E.digamma), [positive(5)], per_element(trigamma_by_series)),
    Case("polygamma_2nd", second_derivative(lambda x: E.polygamma(x, n=1)), [positive(5) + 1.0],
         per_element(lambda v: -2 * math.fsum(1.0 / (v + k) ** 3 for k in range(20000)) - 1 / (v + 20000) ** 2),
         rtol=1e-4),
    Case("erfinv_2nd", second_derivative(E.erfinv), [inside_unit(5)],
         per_element(lambda v: math.sqrt(math.pi) / 2 * math.exp(erfinv_by_bisection(v) ** 2))),
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


def _run_float64(op, x, backend="numpy"):
    xs = input_value(TensorType(x.shape, "float64"), "x")
    ws = cgvm.Workspace(backend)
    f = cgvm.compile([xs], op(xs), workspace=ws)
    return ws.backend.to_numpy(f(ws.backend.asarray(x)))


def _wide_range(seed=3):
    """Float64 points from 1e-300 to 170 and down to -170, integers and their immediate neighbours left out."""
    g = np.random.default_rng(seed)
    x = np.concatenate([g.uniform(-30, 30, 3000), g.uniform(-170, 171, 2000), 10.0 ** g.uniform(-300, 2, 500),
                        -(10.0 ** g.uniform(-300, 2, 500)), np.linspace(0.01, 12, 1200),
                        1 + 10.0 ** -g.uniform(1, 15, 60), 2 - 10.0 ** -g.uniform(1, 15, 60)])
    return x[np.abs(x - np.rint(x)) > 1e-9]


def _assert_relative(x, got, want, rtol, floor=0.0, what=""):
    """|got - want| <= rtol * max(|want|, floor) at every point x, and the same points finite."""
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want), err_msg=what)
    ok = np.isfinite(want)
    exact = ok & (want == 0) & (floor == 0)
    np.testing.assert_array_equal(got[exact], want[exact], err_msg=what)
    ok &= ~exact
    err = np.abs(got[ok] - want[ok]) / np.maximum(np.abs(want[ok]), floor)
    assert err.max() <= rtol, f"{what}: worst relative error {err.max():.2e} at x = {x[ok][err.argmax()]!r}"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_gamma_and_gammaln_match_math_over_a_wide_range(backend):
    x = _wide_range()
    x = x[x > -170]                      # below, Gamma underflows into subnormals
    want = np.array([math.gamma(v) if v < 171.6 else math.inf for v in x])
    _assert_relative(x, _run_float64(E.gamma, x, backend), want, 1e-13, what="gamma")
    # math.lgamma is only absolutely accurate where log Gamma crosses zero (1 and 2): measure against 1 there
    want = np.array([math.lgamma(v) for v in x])
    _assert_relative(x, _run_float64(E.gammaln, x, backend), want, 1e-13, floor=1.0, what="gammaln")


def test_special_functions_match_scipy_over_a_wide_range(backend):
    special = pytest.importorskip("scipy.special")
    x = _wide_range(4)
    with np.errstate(all="ignore"):
        _assert_relative(x, _run_float64(E.gamma, x, backend), special.gamma(x), 1e-13, what="gamma")
        # scipy's gammaln, like math.lgamma, is only absolutely accurate near 1 and 2
        _assert_relative(x, _run_float64(E.gammaln, x, backend), special.gammaln(x), 1e-13, floor=1.0,
                         what="gammaln")
        small = x[np.abs(x) < 1e6]
        _assert_relative(small, _run_float64(E.digamma, small, backend), special.psi(small), 1e-12, floor=1.0,
                         what="psi")
        for n in (1, 2, 3):
            _assert_relative(small, _run_float64(lambda v: E.polygamma(v, n=n), small, backend),
                             special.polygamma(n, small), 1e-12, floor=1e-300, what=f"polygamma({n})")
        y = np.concatenate([np.linspace(-1, 1, 2001)[1:-1], 1 - 10.0 ** -np.linspace(1, 15.9, 300),
                            10.0 ** -np.linspace(1, 300, 300)])
        _assert_relative(y, _run_float64(E.erfinv, y, backend), special.erfinv(y), 1e-14, what="erfinv")


def test_gammaln_keeps_relative_accuracy_at_its_zeros_1_and_2(backend):
    mpmath = pytest.importorskip("mpmath")
    offsets = 10.0 ** -np.linspace(1, 15, 40)
    x = np.concatenate([1 - offsets, 1 + offsets, 2 - offsets, 2 + offsets, [0.5, 2.5]])
    with mpmath.workdps(40):
        want = np.array([float(mpmath.loggamma(mpmath.mpf(float(v)))) for v in x])
    _assert_relative(x, _run_float64(E.gammaln, x, backend), want, 1e-14, what="gammaln near 1 and 2")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_special_values_at_poles_zeros_and_infinities(backend):
    nan, inf = math.nan, math.inf
    x = np.array([0.0, -0.0, -1.0, -7.0, inf, -inf, nan, 1.0, 2.0, 180.0])
    got = _run_float64(E.gamma, x, backend)
    np.testing.assert_array_equal(got, [inf, -inf, nan, nan, inf, nan, nan, 1.0, 1.0, inf])
    assert np.signbit(got[1])
    np.testing.assert_array_equal(_run_float64(E.gammaln, x, backend)[[0, 1, 2, 3, 4, 6, 7, 8]],
                                  [inf, inf, inf, inf, inf, nan, 0.0, 0.0])
    np.testing.assert_array_equal(_run_float64(E.digamma, x, backend)[[0, 1, 2, 3, 4, 6]],
                                  [-inf, inf, nan, nan, inf, nan])
    np.testing.assert_array_equal(_run_float64(lambda v: E.polygamma(v, n=1), x, backend)[[0, 1, 2, 4, 6]],
                                  [inf, inf, inf, 0.0, nan])
    np.testing.assert_array_equal(_run_float64(lambda v: E.polygamma(v, n=2), x, backend)[[0, 1, 2, 4]],
                                  [-inf, inf, nan, 0.0])
    y = np.array([1.0, -1.0, 1.5, -2.0, nan, 0.0, -0.0])
    got = _run_float64(E.erfinv, y, backend)
    np.testing.assert_array_equal(got, [inf, -inf, nan, nan, nan, 0.0, -0.0])
    assert np.signbit(got[-1])


def test_polygamma_order_zero_is_refused_toward_digamma():
    x = input_value(TensorType((3,), "float32"), "x")
    with pytest.raises(GraphBuildError, match="digamma.*test_elementwise_math.py"):
        E.polygamma(x, n=0)


def test_ufunc_functions_fuse_and_keep_their_values():
    x = input_value(TensorType((None,), "float64"), "x")
    chain = E.log10(E.cosh(E.arctan2(E.arcsinh(E.tan(E.arcsin(E.mul(x, 0.5)))), 2.0)))
    chain = E.arctanh(E.mul(E.sinh(E.arccos(E.log2(E.add(E.arctan(chain), 1.5)))), 0.3))
    fused = cgvm.compile([x], chain)
    bare = cgvm.compile([x], chain, passes=[])
    assert [n.op.name for n in fused.graph.nodes] == ["fused_elementwise"]
    v = np.linspace(-1.9, 1.9, 11)
    np.testing.assert_allclose(fused(v), bare(v), rtol=1e-14)
    with np.errstate(all="ignore"):   # the one-element path on Python floats hands domain errors to NumPy
        for point in (0.7, 2.5, -2.5, np.nan):
            np.testing.assert_array_equal(fused(np.array([point])), bare(np.array([point])))


def test_bitwise_chain_fuses_exactly():
    i = input_value(TensorType((None,), "int32"), "i")
    j = input_value(TensorType((None,), "int32"), "j")
    y = E.bitwise_xor(E.invert(E.bitwise_or(E.bitwise_and(i, 0x5A5A), 3)), j)
    fused = cgvm.compile([i, j], y)
    assert [n.op.name for n in fused.graph.nodes] == ["fused_elementwise"]
    a, b = np.arange(-50, 50, dtype=np.int32) * 977, np.arange(100, dtype=np.int32)
    np.testing.assert_array_equal(fused(a, b), ~((a & 0x5A5A) | 3) ^ b)


def test_cuda_source_of_the_new_functions():
    from cgvm.ops import fused as F

    body = F.cuda_operation((("arcsin", (0,)), ("arctan2", ("acc", 1)), ("log2", ("acc",))), "float64")
    assert "asin(((double)x0))" in body and "atan2(((double)acc), ((double)x1))" in body and "log2(" in body
    assert "acc = (bool)(!((bool)x0));" in F.cuda_operation((("invert", (0,)),), "bool")   # ~True is not True
    assert "acc = (int)(~((int)x0));" in F.cuda_operation((("invert", (0,)),), "int32")
    assert "(((int)x0) & ((int)x1))" in F.cuda_operation((("bitwise_and", (0, 1)),), "int32")
    assert F.cuda_operation((("arcsin", (0,)),), "int32") is None     # float functions need a float result


@pytest.mark.parametrize("op", [E.sigmoid, E.softplus, E.rsqrt, E.elu, E.erf, E.relu, E.exp, E.gamma, E.gammaln,
                                E.digamma, E.erfinv],
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
