"""Special functions as elementwise ops: gamma, gammaln, digamma (psi), polygamma and erfinv.

NumPy has no ufunc for these, so each kernel is a short vectorized algorithm written with the
array module's own functions (NumPy and CuPy alike). They compute in float64 whatever the input
(float16/float32 results are rounded back); integers give the float type NumPy's ``exp`` would.

* gamma: Stirling's series for x >= 10, with x^(x - 1/2) formed as two half powers so that nothing
  overflows before the result does; Gamma(x) = Gamma(x + 10) / (x (x+1) ... (x+9)) on [0.5, 10);
  below 0.5 the reflection Gamma(x) Gamma(1 - x) = pi / sin(pi x).
* gammaln (log |Gamma|): Stirling's series for log Gamma from 10 up; on [0.5, 2.5], around its
  zeros at 1 and 2, the Taylor series of log Gamma at 2 (coefficients from zeta(k) - 1); the log
  of the above in between; log(pi / |sin(pi x)|) - log Gamma(1 - x) below 0.5.
* digamma and polygamma(n): psi_n(x) = psi_n(x + N) - (-1)^n n! sum_k 1 / (x + k)^(n+1), the
  asymptotic series at x + N, and below 0.5 the reflection
  psi_n(x) = (-1)^n psi_n(1 - x) - pi^(n+1) P_n(cot(pi x)), where the n-th derivative of cot(u) is
  the polynomial P_n of cot(u) (P_0(c) = c, P_(k+1)(c) = -(1 + c^2) P_k'(c)).
* erfinv: Winitzki's closed-form approximation refined by three Halley steps on erf, or on
  erfc for |y| > 1/2, where 1 - |y| is exact and erf itself has no digits left to compare.

sin(pi x) and cot(pi x) are taken of x minus its nearest integer (an exact subtraction), so the
reflection keeps its accuracy for large negative x. Accuracy in float64, checked against
scipy.special and mpmath: within about 1e-14 relative, except near a zero of the function away
from 1 and 2 (digamma at 1.4616..., gammaln at -2.457...), where the error is a few 1e-16 absolute.
"""
from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Callable, List

from ..ir.attrs import Int
from . import elementwise as ew
from .elementwise import _assign
from .elementwise_math import _ERF_SMALL, _as_float, _erf_small, _erfc_tail, _exp_minus_square, _float_rule
from .registry import ELEMWISE, defop


def _bernoulli(m: int) -> Fraction:
    """The Bernoulli number B_m, exactly (Akiyama-Tanigawa; B_1 = +1/2, unused here)."""
    a = [Fraction(0)] * (m + 1)
    for i in range(m + 1):
        a[i] = Fraction(1, i + 1)
        for j in range(i, 0, -1):
            a[j - 1] = j * (a[j - 1] - a[j])
    return a[0]


_TERMS = 12                                                   # B_2 ... B_24 in the asymptotic series
_B2K = [_bernoulli(2 * k) for k in range(1, _TERMS + 1)]
_STIRLING_FROM = 10.0                                         # Stirling's series is used from here up
_GAMMA_MAX_ARG = 200.0                                        # Gamma overflows from 171.62 on
_LOG_GAMMA_SERIES = [float(b / (2 * k * (2 * k - 1))) for k, b in enumerate(_B2K[:8], 1)]
_DIGAMMA_SERIES = [float(b / (2 * k)) for k, b in enumerate(_B2K[:8], 1)]
_EULER_GAMMA = 0.57721566490153286061


def _zeta_minus_one(k: int, cut: int = 10) -> float:
    """zeta(k) - 1 for k >= 2: the sum up to ``cut`` plus the Euler-Maclaurin tail, in exact fractions."""
    total = sum(Fraction(1, n ** k) for n in range(2, cut))
    total += Fraction(1, (k - 1) * cut ** (k - 1)) + Fraction(1, 2 * cut ** k)
    rising = k   # k (k+1) ... (k + 2j - 2), the factor of the (2j-1)-th derivative of n^-k
    for j, b in enumerate(_B2K[:8], 1):
        total += b / math.factorial(2 * j) * rising / Fraction(cut ** (k + 2 * j - 1))
        rising *= (k + 2 * j - 1) * (k + 2 * j)
    return float(total)


# log Gamma(2 + z) = (1 - gamma) z + sum_k>=2 (-1)^k (zeta(k) - 1) z^k / k, used for |z| <= 1/2, where log
# Gamma crosses zero (at 1 and 2) and log of a computed Gamma would have no relative accuracy left
_LOG_GAMMA_AT_2 = [0.0, 1.0 - _EULER_GAMMA] + [(-1) ** k * _zeta_minus_one(k) / k for k in range(2, 30)]
_FACTORIALS = [float(math.factorial(n)) for n in range(23)]    # 0! ... 22!, exact in float64
_SQRT_2PI = math.sqrt(2 * math.pi)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_LOG_PI = math.log(math.pi)


def _horner(coeffs: List[float], t):
    """sum_i coeffs[i] * t**i."""
    acc = coeffs[-1]
    for c in reversed(coeffs[:-1]):
        acc = acc * t + c
    return acc


def _float64_kernel(compute: Callable) -> Callable:
    """A kernel running ``compute(xp, x64)`` in float64 and giving the result in the op's float type."""
    def kernel(xp, x, out=None):
        x = _as_float(x)
        r = compute(xp, x if x.dtype == xp.float64 else x.astype(xp.float64))
        return _assign(xp, out, r if r.dtype == x.dtype else r.astype(x.dtype))
    return kernel


def _reduced(xp, x):
    """x minus its nearest integer (exact), and whether that integer is odd."""
    k = xp.rint(x)
    return x - k, (k - 2.0 * xp.floor(k * 0.5)) == 1.0


def _sin_pi(xp, x):
    """sin(pi x) with no error from rounding pi x."""
    r, odd = _reduced(xp, x)
    s = xp.sin(math.pi * r)
    return xp.where(odd, -s, s)


# --------------------------------------------------------------------------- gamma and log gamma

def _gamma_from_half(xp, x):
    """Gamma(x) for x >= 0.5 (inf and NaN pass through)."""
    shifted = x < _STIRLING_FROM
    z = xp.minimum(xp.where(shifted, x + _STIRLING_FROM, x), _GAMMA_MAX_ARG)
    base = xp.where(shifted, x, 1.0)   # the lanes that need no shift multiply finite numbers
    product = base
    for k in range(1, int(_STIRLING_FROM)):
        product = product * (base + k)
    half_power = xp.power(z, (z - 0.5) * 0.5)
    w = 1.0 / z
    g = (_SQRT_2PI * half_power) * (half_power * xp.exp(-z)) * xp.exp(w * _horner(_LOG_GAMMA_SERIES, w * w))
    return xp.where(shifted, g / product, g)


def _log_gamma_from_half(xp, x):
    """log Gamma(x) for x >= 0.5 (inf and NaN pass through)."""
    large = (x >= _STIRLING_FROM) & (x < math.inf)
    z = xp.where(large, x, _STIRLING_FROM)
    w = 1.0 / z
    stirling = (z - 0.5) * xp.log(z) - z + _HALF_LOG_2PI + w * _horner(_LOG_GAMMA_SERIES, w * w)
    below = xp.log(_gamma_from_half(xp, xp.where(large, 1.0, x)))
    # near the zeros at 1 and 2: the series at 2, and log Gamma(x) = log Gamma(x + 1) - log x below 1.5
    near_one = x < 1.5
    offset = xp.where(near_one, x - 1.0, x - 2.0)   # exact: Sterbenz
    offset = xp.where(x <= 2.5, offset, 0.0)
    series = _horner(_LOG_GAMMA_AT_2, offset) - xp.where(near_one, xp.log1p(offset), 0.0)
    below = xp.where(x <= 2.5, series, below)
    return xp.where(large, stirling, xp.where(x == math.inf, math.inf, below))


def _one_minus(xp, x):
    """1 - x as a float and the rounding error it left (TwoSum): the reflected argument and its correction."""
    z = 1.0 - x
    back = z - 1.0
    return z, (1.0 - (z - back)) - (x + back)


def _approx_digamma(xp, z):
    """psi(z) to about 1% for z >= 0.5: enough to carry a rounding error of z into log Gamma(z)."""
    return xp.log(z) - 0.5 / z


def _gamma_values(xp, x):
    reflect = x < 0.5
    x_low = xp.where(reflect, x, 0.5)   # lanes without reflection see harmless numbers
    z, dz = _one_minus(xp, x_low)
    core = _gamma_from_half(xp, xp.where(reflect, z, x))
    s = _sin_pi(xp, x_low)
    pole = reflect & (s == 0)   # 0 and the negative integers
    # Gamma(1 - x) = Gamma(z + dz) ~ Gamma(z) (1 + psi(z) dz): 1 - x is inexact where it crosses a power of 2
    reflected = math.pi / (xp.where(pole, 1.0, s) * (core * (1.0 + _approx_digamma(xp, z) * dz)))
    at_pole = xp.where(x == 0, xp.copysign(math.inf, x), math.nan)
    result = xp.where(pole, at_pole, xp.where(reflect, reflected, core))
    # Gamma(n) = (n-1)! exactly while that fits in a double's 53 bits, as math.gamma gives it
    whole = (x == xp.rint(x)) & (x >= 1) & (x <= len(_FACTORIALS))
    index = xp.where(whole, x - 1, 0).astype(xp.int64)
    return xp.where(whole, xp.asarray(_FACTORIALS)[index], result)


def _log_gamma_values(xp, x):
    reflect = x < 0.5
    x_low = xp.where(reflect, x, 0.5)
    z, dz = _one_minus(xp, x_low)
    core = _log_gamma_from_half(xp, xp.where(reflect, z, x))
    s = xp.abs(_sin_pi(xp, x_low))
    pole = reflect & (s == 0)
    core = core + xp.where(reflect, _approx_digamma(xp, z) * dz, 0.0)   # as for gamma: 1 - x was rounded
    reflected = _LOG_PI - xp.log(xp.where(pole, 1.0, s)) - core   # log of a subnormal sin is still finite
    return xp.where(pole, math.inf, xp.where(reflect, reflected, core))


gamma = defop("gamma", pattern=ELEMWISE, infer=_float_rule, inplace=((0, 0),),
              doc="The gamma function; +-inf at +-0, NaN at the negative integers.")
gamma.kernel(_float64_kernel(_gamma_values))


@gamma.grad
def _(node, g):
    return [ew.mul(g, ew.mul(node.outputs[0], digamma(node.inputs[0])))]


gammaln = defop("gammaln", pattern=ELEMWISE, infer=_float_rule, inplace=((0, 0),),
                doc="log |Gamma(x)|; inf at 0 and the negative integers.")
gammaln.kernel(_float64_kernel(_log_gamma_values))


@gammaln.grad
def _(node, g):
    return [ew.mul(g, digamma(node.inputs[0]))]


# --------------------------------------------------------------------------- digamma and polygamma

@functools.lru_cache(maxsize=None)
def _cot_derivative_polynomial(n: int) -> List[float]:
    """Coefficients (lowest power first) of P_n with d^n/du^n cot(u) = P_n(cot u)."""
    p = [0, 1]
    for _ in range(n):
        d = [(i + 1) * p[i + 1] for i in range(len(p) - 1)] + [0, 0]
        p = [-(d[i] + (d[i - 2] if i >= 2 else 0)) for i in range(len(d))]
    return [float(c) for c in p]


@functools.lru_cache(maxsize=None)
def _polygamma_series(n: int) -> List[float]:
    """B_2k (2k + n - 1)! / (2k)!: the coefficients of w^(2k + n) in psi_n's asymptotic series (n >= 1)."""
    return [float(b * math.factorial(2 * k + n - 1) / math.factorial(2 * k)) for k, b in enumerate(_B2K, 1)]


def _polygamma_asymptotic(xp, z, n: int):
    """psi_n(z) from its asymptotic series; accurate for z >= 10 + 2n."""
    w = 1.0 / z
    if n == 0:
        return xp.log(z) - 0.5 * w - (w * w) * _horner(_DIGAMMA_SERIES, w * w)
    inner = math.factorial(n - 1) + (0.5 * math.factorial(n)) * w + (w * w) * _horner(_polygamma_series(n), w * w)
    return (1.0 if n % 2 else -1.0) * (xp.power(w, n) * inner)


def _polygamma_from_half(xp, x, n: int):
    """psi_n(x) for x >= 0.5: shifted up by N steps (a sum of same-signed terms), then the series."""
    steps = 10 + 2 * n
    total = None
    for k in range(steps):
        t = 1.0 / (x + k)
        term = t if n == 0 else xp.power(t, n + 1)
        total = term if total is None else total + term
    shift = (-1.0) ** n * math.factorial(n)
    return _polygamma_asymptotic(xp, x + steps, n) - shift * total


def _polygamma_values(xp, x, n: int):
    reflect = x < 0.5
    core = _polygamma_from_half(xp, xp.where(reflect, 1.0 - x, x), n)
    r, _ = _reduced(xp, xp.where(reflect, x, 0.5))
    pole = reflect & (r == 0)
    angle = math.pi * xp.where(pole, 0.5, r)
    cot = xp.cos(angle) / xp.sin(angle)
    reflected = (-1.0) ** n * core - math.pi ** (n + 1) * _horner(_cot_derivative_polynomial(n), cot)
    # at a pole psi_n ~ -(-1)^n n! / (x + m)^(n+1): +inf for odd n; for even n the sign flips across it
    at_pole = math.inf if n % 2 else xp.where(x == 0, -xp.copysign(math.inf, x), math.nan)
    return xp.where(pole, at_pole, xp.where(reflect, reflected, core))


digamma = defop("digamma", pattern=ELEMWISE, infer=_float_rule, inplace=((0, 0),),
                doc="psi(x) = Gamma'(x) / Gamma(x); -inf at +0, +inf at -0, NaN at the negative integers.")
digamma.kernel(_float64_kernel(lambda xp, x: _polygamma_values(xp, x, 0)))


@digamma.grad
def _(node, g):
    return [ew.mul(g, polygamma(node.inputs[0], n=1))]


def _polygamma_infer(types, n):
    if n < 1:
        raise ValueError(f"polygamma takes an order n >= 1 (n = 0 is digamma), got {n}")
    return _float_rule(types)


polygamma = defop("polygamma", pattern=ELEMWISE, infer=_polygamma_infer, inplace=((0, 0),), attrs={"n": Int(1)},
                  doc="psi_n(x), the n-th derivative of digamma (n >= 1; n = 1 is trigamma).")


@polygamma.kernel_factory
def _(xp, n):
    return functools.partial(_float64_kernel(lambda xp_, x: _polygamma_values(xp_, x, n)), xp)


@polygamma.grad
def _(node, g):
    return [ew.mul(g, polygamma(node.inputs[0], n=node.attrs["n"] + 1))]


# --------------------------------------------------------------------------- erfinv

_WINITZKI_A = 0.147
_HALLEY_STEPS = 3


def _erfinv_values(xp, y):
    a = xp.abs(y)
    inside = a < 1.0
    a = xp.where(inside, a, 0.0)
    q = 1.0 - a   # exact for a >= 0.5, the lanes whose residual is taken against it
    log_1_minus_a2 = xp.log(q) + xp.log1p(a)
    t = 2.0 / (math.pi * _WINITZKI_A) + 0.5 * log_1_minus_a2
    x = xp.sqrt(xp.sqrt(t * t - log_1_minus_a2 / _WINITZKI_A) - t)
    upper = a > 0.5
    for _ in range(_HALLEY_STEPS):
        small = x <= _ERF_SMALL
        erf_small = _erf_small(xp, x)
        erfc_tail = _erfc_tail(xp, x)
        erf_x = xp.where(small, erf_small, (0.5 - erfc_tail) + 0.5)
        erfc_x = xp.where(small, (0.5 - erf_small) + 0.5, erfc_tail)
        residual = xp.where(upper, q - erfc_x, erf_x - a)
        slope = (2.0 / math.sqrt(math.pi)) * _exp_minus_square(xp, x)
        u = residual / slope
        x = x - u / (1.0 + x * u)   # Halley's step: erf'' = -2x erf'
    x = xp.where(inside, x, xp.where(xp.abs(y) == 1.0, math.inf, math.nan))
    return xp.copysign(x, y)


erfinv = defop("erfinv", pattern=ELEMWISE, infer=_float_rule, inplace=((0, 0),),
               doc="The inverse of erf on (-1, 1); +-inf at +-1, NaN outside.")
erfinv.kernel(_float64_kernel(_erfinv_values))


@erfinv.grad
def _(node, g):
    x = node.outputs[0]
    return [ew.mul(g, ew.mul(ew.exp(ew.square(x)), math.sqrt(math.pi) / 2))]
