"""Theano's elementwise math, comparisons, casts and reductions, each one cgvm op (or a few).

Dtypes follow NumPy's promotion of Theano's constants for Python numbers (``fvector * 0.5`` stays
float32, ``fvector * 0.1`` is float64 unless floatX is float32, as in Theano). Comparisons return bool (PyTensor's choice; Theano 1.0 gave int8).
Functions without a cgvm op of their own are written from ones that have one
(``erfc = 1 - erf``, ``isnan = x != x``). ``and_``/``or_``/``xor``/``invert`` (and the operators
``& | ^ ~``) are bitwise on integers and logical on bools, as in NumPy and PyTensor.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

import numpy as np

from ...ir.builder import as_value
from ...ir.graph import CONST, Value
from ...ir.types import DType
from ...ops import elementwise as ew
from ...ops import reduce as red
from ...ops import shape as shp
from .config import config
from .var import TensorVariable, as_tensor_variable, wrap

Axis = Union[None, int, Sequence[int]]


def _v(x: Any) -> Any:
    """An op argument: the Value of a variable; a Python number becomes Theano's constant for it.

    Theano's autocast: an int takes the smallest int type holding it, a float ``floatX`` when that
    is float32, else float32 if it holds the value exactly and float64 otherwise; then NumPy's
    promotion applies (``fvector * 0.5`` is float32, ``fvector * 0.1`` float64 under the default
    floatX, ``bvector + 300`` int16).
    """
    if isinstance(x, TensorVariable):
        return x.value
    if isinstance(x, (bool, Value, np.bool_)):
        return x
    return as_tensor_variable(x).value


def _like(x: Any, ref: Value) -> Value:
    """``x`` as a Value, a Python scalar taking ``ref``'s dtype where it fits."""
    v = _v(x)
    return v if isinstance(v, Value) else as_value(v, ref)


def _dtype_name(dtype: Any) -> str:
    return config.floatX if dtype in ("floatX", None) else DType(dtype).name


# --------------------------------------------------------------------------- arithmetic

def add(a, b, *rest):
    out = wrap(ew.add(_v(a), _v(b)))
    for r in rest:
        out = add(out, r)
    return out


def sub(a, b): return wrap(ew.sub(_v(a), _v(b)))


def mul(a, b, *rest):
    out = wrap(ew.mul(_v(a), _v(b)))
    for r in rest:
        out = mul(out, r)
    return out


def true_div(a, b):
    """a / b; integer / integer gives float64 (Theano's rule)."""
    return wrap(ew.div(_v(a), _v(b)))


def int_div(a, b):
    """a // b, flooring as Python does."""
    return wrap(ew.floordiv(_v(a), _v(b)))


floor_div = int_div


def mod(a, b): return wrap(ew.mod(_v(a), _v(b)))
def pow(a, b): return wrap(ew.pow(_v(a), _v(b)))
def neg(x): return wrap(ew.neg(_v(x)))
def abs(x): return wrap(ew.abs(_v(x)))


abs_ = abs


def sqr(x): return wrap(ew.square(_v(x)))


square = sqr


def sqrt(x): return wrap(ew.sqrt(_v(x)))
def exp(x): return wrap(ew.exp(_v(x)))
def exp2(x): return pow(2.0, x)
def log(x):
    """Natural log; log(softmax(x)) and log(sigmoid(x)) are built in their stable forms."""
    from .nnet import stable_log

    xv = _v(x)
    if isinstance(xv, Value):
        stable = stable_log(xv)
        if stable is not None:
            return wrap(stable)
    return wrap(ew.log(xv))


def log1p(x):
    """log(1 + x); log1p(exp(z)) is built as softplus(z), stable with a stable gradient."""
    v = _v(x)
    if isinstance(v, Value) and v.node is not None and v.node.op.name == "exp":
        return wrap(ew.softplus(v.node.inputs[0]))
    return wrap(ew.log1p(v))


def expm1(x): return wrap(ew.expm1(_v(x)))
def log2(x): return wrap(ew.log2(_v(x)))
def log10(x): return wrap(ew.log10(_v(x)))
def sin(x): return wrap(ew.sin(_v(x)))
def cos(x): return wrap(ew.cos(_v(x)))
def tan(x): return wrap(ew.tan(_v(x)))
def arcsin(x): return wrap(ew.arcsin(_v(x)))
def arccos(x): return wrap(ew.arccos(_v(x)))
def arctan(x): return wrap(ew.arctan(_v(x)))


def arctan2(a, b):
    """The angle of the point (b, a), in [-pi, pi] (NumPy's arctan2(y, x))."""
    return wrap(ew.arctan2(_v(a), _v(b)))


def tanh(x): return wrap(ew.tanh(_v(x)))
def sinh(x): return wrap(ew.sinh(_v(x)))
def cosh(x): return wrap(ew.cosh(_v(x)))
def arcsinh(x): return wrap(ew.arcsinh(_v(x)))
def arccosh(x): return wrap(ew.arccosh(_v(x)))
def arctanh(x): return wrap(ew.arctanh(_v(x)))
def sgn(x): return wrap(ew.sign(_v(x)))


sign = sgn


def floor(x): return wrap(ew.floor(_v(x)))
def ceil(x): return wrap(ew.ceil(_v(x)))


def round(x, mode: Optional[str] = None):
    """Round; ``mode`` 'half_to_even' (default, as NumPy) or 'half_away_from_zero' (Theano 1.0's default)."""
    if mode in (None, "half_to_even"):
        return wrap(ew.round(_v(x)))
    if mode == "half_away_from_zero":
        return mul(sgn(x), floor(add(abs(x), 0.5)))
    raise ValueError(f"round: mode must be 'half_to_even' or 'half_away_from_zero', got {mode!r}")


def iround(x, mode: Optional[str] = None): return cast(round(x, mode), "int64")
def trunc(x): return cast(cast(x, "int64"), as_tensor_variable(x).dtype)
def maximum(a, b): return wrap(ew.maximum(_v(a), _v(b)))
def minimum(a, b): return wrap(ew.minimum(_v(a), _v(b)))
def erf(x): return wrap(ew.erf(_v(x)))
def erfc(x): return sub(1.0, erf(x))
def erfinv(x): return wrap(ew.erfinv(_v(x)))
def gamma(x): return wrap(ew.gamma(_v(x)))
def gammaln(x): return wrap(ew.gammaln(_v(x)))


def psi(x):
    """The digamma function Gamma'(x) / Gamma(x) (PyTensor also calls it ``digamma``)."""
    return wrap(ew.digamma(_v(x)))


digamma = psi


def tri_gamma(x): return wrap(ew.polygamma(_v(x), n=1))


def polygamma(n: int, x):
    """The n-th derivative of digamma (PyTensor's argument order: the order first)."""
    n = int(n)
    return psi(x) if n == 0 else wrap(ew.polygamma(_v(x), n=n))


def inv(x): return true_div(1.0, x)


reciprocal = inv


def sigmoid(x): return wrap(ew.sigmoid(_v(x)))
def softplus(x): return wrap(ew.softplus(_v(x)))


def clip(x, a_min, a_max):
    """x limited to [a_min, a_max]; bounds may be numbers or tensors."""
    if not isinstance(a_min, TensorVariable) and not isinstance(a_max, TensorVariable):
        return wrap(ew.clip(_v(x), lo=float(a_min), hi=float(a_max)))
    xv = _v(x)
    return wrap(ew.clip(xv, _like(a_min, xv), _like(a_max, xv)))


# --------------------------------------------------------------------------- comparison and logic

def eq(a, b): return wrap(ew.eq(_v(a), _v(b)))
def neq(a, b): return wrap(ew.ne(_v(a), _v(b)))
def lt(a, b): return wrap(ew.lt(_v(a), _v(b)))
def le(a, b): return wrap(ew.le(_v(a), _v(b)))
def gt(a, b): return wrap(ew.gt(_v(a), _v(b)))
def ge(a, b): return wrap(ew.ge(_v(a), _v(b)))


def and_(a, b):
    """a & b: bitwise on integers, logical on bools (as NumPy and PyTensor); floats have no such op."""
    return wrap(ew.bitwise_and(_v(a), _v(b)))


def or_(a, b): return wrap(ew.bitwise_or(_v(a), _v(b)))
def xor(a, b): return wrap(ew.bitwise_xor(_v(a), _v(b)))
def invert(x): return wrap(ew.invert(_v(x)))


bitwise_and, bitwise_or, bitwise_xor, bitwise_not = and_, or_, xor, invert


def isnan(x):
    xv = _v(x)
    return neq(x, x) if xv.dtype.is_float else wrap(shp.zeros_like(xv, dtype="bool"))


def isinf(x):
    xv = _v(x)
    return eq(abs(x), math.inf) if xv.dtype.is_float else wrap(shp.zeros_like(xv, dtype="bool"))


def isclose(a, b, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False):
    close = le(abs(sub(a, b)), add(atol, mul(rtol, abs(b))))
    return or_(close, and_(isnan(a), isnan(b))) if equal_nan else close


def allclose(a, b, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False):
    return all(isclose(a, b, rtol, atol, equal_nan))


def switch(cond, ift, iff):
    """Elementwise selection; both branches are computed (use ``ifelse`` for a lazy choice)."""
    c = _v(cond)
    a, b = _v(ift), _v(iff)
    if not isinstance(a, Value) and isinstance(b, Value):
        a = as_value(a, b)
    elif not isinstance(b, Value) and isinstance(a, Value):
        b = as_value(b, a)
    elif not isinstance(a, Value):
        a, b = as_tensor_variable(a).value, as_tensor_variable(b).value
    return wrap(ew.where(c, a, b))


where = switch


def largest(*args):
    out = as_tensor_variable(args[0])
    for a in args[1:]:
        out = maximum(out, a)
    return out


def smallest(*args):
    out = as_tensor_variable(args[0])
    for a in args[1:]:
        out = minimum(out, a)
    return out


def cast(x, dtype):
    """``x`` converted to ``dtype`` (floats truncate toward zero into integers)."""
    xv = _v(x) if isinstance(x, TensorVariable) else as_tensor_variable(x).value
    name = _dtype_name(dtype)
    if xv.dtype.name == name:
        return wrap(xv)
    return wrap(ew.cast(xv, dtype=name))


def tensor_copy(x):
    xv = _v(x)
    return wrap(ew.cast(xv, dtype=xv.dtype))


# --------------------------------------------------------------------------- reductions

def _axes(axis: Axis, ndim: int) -> Optional[tuple]:
    if axis is None:
        return None
    if isinstance(axis, TensorVariable):
        if axis.value.kind != CONST:
            raise TypeError("the axis of a reduction must be known when the graph is built")
        axis = axis.value.data.tolist()
    if isinstance(axis, (int, np.integer)):
        return (int(axis),)
    return tuple(int(a) for a in axis)


def _reduce(op, x, axis, keepdims, dtype=None):
    xv = as_tensor_variable(x).value
    if dtype is not None:
        xv = cast(xv, dtype).value
    return wrap(op(xv, axis=_axes(axis, xv.ndim), keepdims=bool(keepdims)))


def sum(x, axis: Axis = None, dtype=None, keepdims: bool = False, acc_dtype=None):
    return _reduce(red.sum, x, axis, keepdims, dtype)


def prod(x, axis: Axis = None, dtype=None, keepdims: bool = False, acc_dtype=None, no_zeros_in_input=False):
    return _reduce(red.prod, x, axis, keepdims, dtype)


def mean(x, axis: Axis = None, dtype=None, keepdims: bool = False, acc_dtype=None):
    """Mean; integer input gives float64 (Theano's rule)."""
    return _reduce(red.mean, x, axis, keepdims, dtype)


def max(x, axis: Axis = None, keepdims: bool = False):
    return _reduce(red.max, x, axis, keepdims)


def min(x, axis: Axis = None, keepdims: bool = False):
    return _reduce(red.min, x, axis, keepdims)


def _arg(op, x, axis, keepdims):
    xv = as_tensor_variable(x).value
    axes = _axes(axis, xv.ndim)
    if axes is not None and len(axes) > 1:
        raise ValueError("argmax/argmin take a single axis or None")
    return wrap(op(xv, axis=None if axes is None else axes[0], keepdims=bool(keepdims)))


def argmax(x, axis: Axis = None, keepdims: bool = False): return _arg(red.argmax, x, axis, keepdims)
def argmin(x, axis: Axis = None, keepdims: bool = False): return _arg(red.argmin, x, axis, keepdims)
def max_and_argmax(x, axis: Axis = None, keepdims: bool = False):
    return max(x, axis, keepdims), argmax(x, axis, keepdims)


def var(x, axis: Axis = None, ddof: int = 0, keepdims: bool = False, corrected: bool = False):
    xv = as_tensor_variable(x).value
    return wrap(red.var(xv, axis=_axes(axis, xv.ndim), keepdims=bool(keepdims), ddof=1 if corrected else ddof))


def std(x, axis: Axis = None, ddof: int = 0, keepdims: bool = False, corrected: bool = False):
    xv = as_tensor_variable(x).value
    return wrap(red.std(xv, axis=_axes(axis, xv.ndim), keepdims=bool(keepdims), ddof=1 if corrected else ddof))


def all(x, axis: Axis = None, keepdims: bool = False):
    return _reduce(red.min, neq(x, 0), axis, keepdims)


def any(x, axis: Axis = None, keepdims: bool = False):
    return _reduce(red.max, neq(x, 0), axis, keepdims)


def logsumexp(x, axis: Axis = None, keepdims: bool = False):
    return _reduce(red.logsumexp, x, axis, keepdims)


def norm(x, L, axis: Axis = None, keepdims: bool = False):
    if L == 1:
        return sum(abs(x), axis, keepdims=keepdims)
    if L == 2:
        return sqrt(sum(sqr(x), axis, keepdims=keepdims))
    return pow(sum(pow(abs(x), L), axis, keepdims=keepdims), 1.0 / L)


def cumsum(x, axis: Optional[int] = None):
    """Running sums along ``axis``; ``None`` flattens first (as NumPy)."""
    return wrap(red.cumsum(as_tensor_variable(x).value, axis=axis))
