"""Elementwise math functions and activations: exp, log, sqrt, trigonometry, hyperbolic functions, sigmoid,
softplus, relu, elu, erf.

Part of the elementwise family (``cgvm.ops.elementwise`` re-exports every op here; the special
functions gamma, gammaln, digamma, polygamma and erfinv are in ``elementwise_special``). Integer
inputs give the float dtype NumPy's ``exp`` would (int8 -> float16, int32 -> float64); ops that
are one NumPy ufunc run it directly (the ``ufunc=`` fast path). Kernels that take several steps
read their input completely before the first write into ``out``, so they may run in place.
"""
from __future__ import annotations

import math

from ..ir.attrs import Float
from ..ir.types import DType
from . import elementwise as ew
from .elementwise import _assign, ufunc_result_dtype, ufunc_rule
from .registry import ELEMWISE, defop
from .ufunc_steps import ACC, float_in_and_out, lit

_float_rule = ufunc_rule("exp")  # same shape; integers become the float type NumPy's exp gives


def _as_float(x):
    """``x`` itself if it is a float array, else ``x`` converted as NumPy's ``exp`` would convert it."""
    if x.dtype.kind == "f":
        return x
    return x.astype(ufunc_result_dtype("exp", (DType(x.dtype),)).np)


def _out_for(xp, x, out):
    """The planned buffer, or a fresh one like ``x``: multi-step kernels then always work in arrays
    (a ufunc on a 0-d array hands back a scalar, which cannot take ``out=``)."""
    return xp.empty(x.shape, x.dtype) if out is None else out


def _unary(name: str, ufunc: str, **kwargs):
    return defop(name, pattern=ELEMWISE, infer=ufunc_rule(ufunc), inplace=((0, 0),), ufunc=ufunc, **kwargs)


# --------------------------------------------------------------------------- exponentials and logarithms

exp = _unary("exp", "exp", nonnegative=True)


@exp.grad
def _(node, g):
    return [ew.mul(g, node.outputs[0])]


expm1 = _unary("expm1", "expm1", doc="exp(x) - 1, accurate for small x.")


@expm1.grad
def _(node, g):
    return [ew.mul(g, exp(node.inputs[0]))]


log = _unary("log", "log")


@log.grad
def _(node, g):
    return [ew.div(g, node.inputs[0])]


log1p = _unary("log1p", "log1p", doc="log(1 + x), accurate for small x.")


@log1p.grad
def _(node, g):
    return [ew.div(g, ew.add(node.inputs[0], 1))]


log2 = _unary("log2", "log2")


@log2.grad
def _(node, g):
    return [ew.div(g, ew.mul(node.inputs[0], math.log(2.0)))]


log10 = _unary("log10", "log10")


@log10.grad
def _(node, g):
    return [ew.div(g, ew.mul(node.inputs[0], math.log(10.0)))]


sqrt = _unary("sqrt", "sqrt", nonnegative=True)


@sqrt.grad
def _(node, g):
    return [ew.div(g, ew.mul(node.outputs[0], 2))]


rsqrt = defop("rsqrt", pattern=ELEMWISE, infer=_float_rule, inplace=((0, 0),), doc="1 / sqrt(x).")


@rsqrt.lowering
def _(node):
    return [("sqrt", (0,)), ("reciprocal", (ACC,))] if float_in_and_out(node) else None


@rsqrt.kernel
def _(xp, x, out=None):
    x = _as_float(x)
    out = _out_for(xp, x, out)
    xp.sqrt(x, out=out)
    return xp.reciprocal(out, out=out)


@rsqrt.grad
def _(node, g):
    y = node.outputs[0]
    return [ew.mul(g, ew.mul(ew.mul(y, ew.mul(y, y)), -0.5))]


# --------------------------------------------------------------------------- trigonometry

sin = _unary("sin", "sin")


@sin.grad
def _(node, g):
    return [ew.mul(g, cos(node.inputs[0]))]


cos = _unary("cos", "cos")


@cos.grad
def _(node, g):
    return [ew.neg(ew.mul(g, sin(node.inputs[0])))]


tan = _unary("tan", "tan")


@tan.grad
def _(node, g):
    y = node.outputs[0]  # tan' = 1 / cos^2 = 1 + tan^2
    return [ew.mul(g, ew.add(ew.mul(y, y), 1))]


arcsin = _unary("arcsin", "arcsin")


@arcsin.grad
def _(node, g):
    x = node.inputs[0]
    return [ew.div(g, sqrt(ew.sub(1, ew.mul(x, x))))]


arccos = _unary("arccos", "arccos")


@arccos.grad
def _(node, g):
    x = node.inputs[0]
    return [ew.neg(ew.div(g, sqrt(ew.sub(1, ew.mul(x, x)))))]


arctan = _unary("arctan", "arctan")


@arctan.grad
def _(node, g):
    x = node.inputs[0]
    return [ew.div(g, ew.add(ew.mul(x, x), 1))]


arctan2 = ew._binary("arctan2", "arctan2", doc="The angle of the point (x, y) for arctan2(y, x), in [-pi, pi].")


@arctan2.grad
def _(node, g):
    y, x = node.inputs
    g_over_r2 = ew.div(g, ew.add(ew.mul(x, x), ew.mul(y, y)))
    return [ew._unbroadcast(ew.mul(g_over_r2, x), y), ew._unbroadcast(ew.neg(ew.mul(g_over_r2, y)), x)]


# --------------------------------------------------------------------------- hyperbolic functions

sinh = _unary("sinh", "sinh")


@sinh.grad
def _(node, g):
    return [ew.mul(g, cosh(node.inputs[0]))]


cosh = _unary("cosh", "cosh")


@cosh.grad
def _(node, g):
    return [ew.mul(g, sinh(node.inputs[0]))]


tanh = _unary("tanh", "tanh", activation="tanh")


@tanh.grad
def _(node, g):
    y = node.outputs[0]
    return [ew.mul(g, ew.sub(1, ew.mul(y, y)))]


arcsinh = _unary("arcsinh", "arcsinh")


@arcsinh.grad
def _(node, g):
    x = node.inputs[0]
    return [ew.div(g, sqrt(ew.add(ew.mul(x, x), 1)))]


arccosh = _unary("arccosh", "arccosh")


@arccosh.grad
def _(node, g):
    x = node.inputs[0]  # 1 / sqrt(x^2 - 1), factored so that x near 1 loses no digits to the subtraction
    return [ew.div(g, ew.mul(sqrt(ew.sub(x, 1)), sqrt(ew.add(x, 1))))]


arctanh = _unary("arctanh", "arctanh")


@arctanh.grad
def _(node, g):
    x = node.inputs[0]
    return [ew.div(g, ew.sub(1, ew.mul(x, x)))]


# --------------------------------------------------------------------------- activations

sigmoid = defop("sigmoid", pattern=ELEMWISE, infer=_float_rule, inplace=((0, 0),), nonnegative=True,
                activation="sigmoid",
                doc="1 / (1 + exp(-x)), computed as 0.5 tanh(x / 2) + 0.5: no overflow for any x.")


@sigmoid.lowering
def _(node):   # as the kernel computes it: 0.5 tanh(x / 2) + 0.5
    if not float_in_and_out(node):
        return None
    half = lit(0.5, node.outputs[0].dtype)
    return [("multiply", (0, half)), ("tanh", (ACC,)), ("multiply", (ACC, half)), ("add", (ACC, half))]


@sigmoid.kernel
def _(xp, x, out=None):
    x = _as_float(x)
    out = _out_for(xp, x, out)
    xp.multiply(x, 0.5, out=out)
    xp.tanh(out, out=out)
    xp.multiply(out, 0.5, out=out)
    return xp.add(out, 0.5, out=out)


@sigmoid.grad
def _(node, g):
    y = node.outputs[0]
    return [ew.mul(g, ew.mul(y, ew.sub(1, y)))]


softplus = defop("softplus", pattern=ELEMWISE, infer=_float_rule, inplace=((0, 0),), nonnegative=True,
                 doc="log(1 + exp(x)), computed as max(x, 0) + log1p(exp(-|x|)): no overflow for any x.")


@softplus.kernel
def _(xp, x, out=None):
    x = _as_float(x)
    out = _out_for(xp, x, out)
    tail = xp.log1p(xp.exp(-xp.abs(x)))
    xp.maximum(x, 0, out=out)  # x is read here for the last time, so out may be x itself
    return xp.add(out, tail, out=out)


@softplus.grad
def _(node, g):
    return [ew.mul(g, sigmoid(node.inputs[0]))]


relu = defop("relu", pattern=ELEMWISE, infer=lambda types, negative_slope: types[0], inplace=((0, 0),),
             activation=lambda node: "relu" if node.attrs["negative_slope"] == 0.0 else None,
             nonnegative=lambda node: node.attrs["negative_slope"] == 0.0,
             attrs={"negative_slope": Float(0.0)}, doc="max(x, 0); with negative_slope, leaky: slope * x for x < 0.")


@relu.lowering
def _(node):
    dtype = node.outputs[0].dtype
    if node.attrs["negative_slope"] != 0.0 or dtype.is_bool:
        return None
    return [("maximum", (0, lit(0, dtype)))]


@relu.kernel_factory
def _(xp, negative_slope):
    if negative_slope == 0.0:
        def relu0(x, out=None):
            r = xp.maximum(x, 0, out=out)
            return r if out is not None else xp.asarray(r)
        return relu0

    def leaky(x, out=None):
        return _assign(xp, out, xp.where(x > 0, x, x * xp.asarray(negative_slope, x.dtype)))
    return leaky


@relu.grad
def _(node, g):
    # for slope >= 0, y > 0 exactly where x > 0: reading the output lets relu run in place in training
    slope = node.attrs["negative_slope"]
    return [relu_grad(g, node.outputs[0] if slope >= 0 else node.inputs[0], negative_slope=slope)]


relu_grad = defop("relu_grad", num_inputs=2, pattern=ELEMWISE, infer=lambda types, negative_slope: types[0],
                  inplace=((0, 0),), attrs={"negative_slope": Float(0.0)},
                  doc="g where x > 0, else negative_slope * g (the gradient of relu, linear in g).")


@relu_grad.kernel_factory
def _(xp, negative_slope):
    if negative_slope == 0.0:
        def relu0_grad(g, x, out=None):  # one masked multiply: no where, no temporary for g * 0
            return xp.multiply(g, x > 0, out=out)
        return relu0_grad

    def leaky_grad(g, x, out=None):
        return _assign(xp, out, xp.where(x > 0, g, g * xp.asarray(negative_slope, g.dtype)))
    return leaky_grad


@relu_grad.grad
def _(node, gg):
    g, x = node.inputs
    return [relu_grad(gg, x, negative_slope=node.attrs["negative_slope"]), None]


elu = defop("elu", pattern=ELEMWISE, infer=_float_rule, inplace=((0, 0),), attrs={"alpha": Float(1.0)},
            doc="x for x > 0, else alpha * (exp(x) - 1).")


@elu.kernel
def _(xp, x, *, alpha, out=None):
    x = _as_float(x)
    negative_part = xp.expm1(xp.minimum(x, 0)) * alpha  # the clamp keeps exp finite where x is taken
    return _assign(xp, out, xp.where(x > 0, x, negative_part))


@elu.grad
def _(node, g):
    x, y = node.inputs[0], node.outputs[0]
    # for x <= 0, d/dx alpha (exp(x) - 1) = alpha exp(x) = y + alpha
    return [ew.where(ew.gt(x, 0), g, ew.mul(g, ew.add(y, node.attrs["alpha"])))]


# --------------------------------------------------------------------------- erf
# W. J. Cody, "Rational Chebyshev approximations for the error function", Math. Comp. 23 (1969),
# coefficients as in his CALERF (netlib specfun): relative error below 1e-16 in float64.

_ERF_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02, 3.20937758913846947e03,
          1.85777706184603153e-1)
_ERF_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03, 2.84423683343917062e03)
_ERF_C = (5.64188496988670089e-1, 8.88314979438837594e00, 6.61191906371416295e01, 2.98635138197400131e02,
          8.81952221241769090e02, 1.71204761263407058e03, 2.05107837782607147e03, 1.23033935479799725e03,
          2.15311535474403846e-8)
_ERF_D = (1.57449261107098347e01, 1.17693950891312499e02, 5.37181101862009858e02, 1.62138957456669019e03,
          3.29079923573345963e03, 4.36261909014324716e03, 3.43936767414372164e03, 1.23033935480374942e03)
_ERF_P = (3.05326634961232344e-1, 3.60344899949804439e-1, 1.25781726111229246e-1, 1.60837851487422766e-2,
          6.58749161529837803e-4, 1.63153871373020978e-2)
_ERF_Q = (2.56852019228982242e00, 1.87295284992346725e00, 5.27905102951428412e-1, 6.05183413124413191e-2,
          2.33520497626869185e-3)
_ERF_SMALL = 0.46875     # below: erf by a rational function of x**2
_ERF_MID = 4.0           # below: erfc by a rational function of |x|; above: of 1 / x**2
_ERF_BIG = 30.0          # erfc(x) underflows long before: clamping keeps inf out of the arithmetic
_INV_SQRT_PI = 0.56418958354775628695
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _exp_minus_square(xp, y):
    """exp(-y*y) without the rounding error of forming y*y: split y at a multiple of 1/16."""
    head = xp.trunc(y * 16.0) / 16.0
    return xp.exp(-head * head) * xp.exp(-(y - head) * (y + head))


def _erf_small(xp, x):
    """erf(x) for |x| <= 0.46875: x times a rational function of x**2 (clamped, so any x is harmless)."""
    ys = xp.minimum(xp.abs(x), _ERF_SMALL)
    ys = ys * ys
    num, den = _ERF_A[4] * ys, ys
    for a, b in zip(_ERF_A[:3], _ERF_B[:3]):
        num, den = (num + a) * ys, (den + b) * ys
    return x * (num + _ERF_A[3]) / (den + _ERF_B[3])


def _erfc_tail(xp, y):
    """erfc(y) for y >= 0.46875 (smaller y are clamped): rational functions of y up to 4, of 1/y**2 beyond."""
    ym = xp.minimum(xp.maximum(y, _ERF_SMALL), _ERF_MID)
    num, den = _ERF_C[8] * ym, ym
    for c, d in zip(_ERF_C[:7], _ERF_D[:7]):
        num, den = (num + c) * ym, (den + d) * ym
    erfc_mid = _exp_minus_square(xp, ym) * ((num + _ERF_C[7]) / (den + _ERF_D[7]))

    yb = xp.minimum(xp.maximum(y, _ERF_MID), _ERF_BIG)  # NaN passes through both
    inv = 1.0 / (yb * yb)
    num, den = _ERF_P[5] * inv, inv
    for p, q in zip(_ERF_P[:4], _ERF_Q[:4]):
        num, den = (num + p) * inv, (den + q) * inv
    tail = inv * (num + _ERF_P[4]) / (den + _ERF_Q[4])
    erfc_big = _exp_minus_square(xp, yb) * ((_INV_SQRT_PI - tail) / yb)
    return xp.where(y <= _ERF_MID, erfc_mid, erfc_big)


def _erf_values(xp, x):
    """erf of a float32/float64 array by Cody's three rational approximations, selected per element."""
    y = xp.abs(x)
    small = _erf_small(xp, x)
    erf_abs = (0.5 - _erfc_tail(xp, y)) + 0.5
    return xp.where(y <= _ERF_SMALL, small, xp.where(x < 0, -erf_abs, erf_abs))


erf = defop("erf", pattern=ELEMWISE, infer=_float_rule, inplace=((0, 0),),
            doc="The error function 2/sqrt(pi) * integral_0^x exp(-t^2) dt (Cody's approximations).")


@erf.kernel
def _(xp, x, out=None):
    x = _as_float(x)
    work = x if x.dtype.itemsize >= 4 else x.astype(xp.float32)  # float16 has too little range for it
    r = _erf_values(xp, work)
    return _assign(xp, out, r if r.dtype == x.dtype else r.astype(x.dtype))


@erf.grad
def _(node, g):
    x = node.inputs[0]
    return [ew.mul(g, ew.mul(exp(ew.neg(ew.square(x))), _TWO_OVER_SQRT_PI))]
