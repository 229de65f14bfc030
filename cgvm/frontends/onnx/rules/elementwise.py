"""Elementwise ONNX ops: arithmetic, comparisons, logic, bit operations, rounding, casts, math."""
from __future__ import annotations

import numpy as np

from cgvm.ops import elementwise as E
from cgvm.ops import shape as shp

from ..translate import np_dtype, rule
from .common import cast_to, const

_BINARY = {"Add": E.add, "Sub": E.sub, "Mul": E.mul, "Equal": E.eq, "Greater": E.gt, "Less": E.lt,
           "GreaterOrEqual": E.ge, "LessOrEqual": E.le, "And": E.logical_and, "Or": E.logical_or,
           "Xor": E.logical_xor, "BitwiseAnd": E.bitwise_and, "BitwiseOr": E.bitwise_or,
           "BitwiseXor": E.bitwise_xor}

_UNARY = {"Abs": E.abs, "Neg": E.neg, "Exp": E.exp, "Log": E.log, "Sqrt": E.sqrt, "Floor": E.floor,
          "Ceil": E.ceil, "Sin": E.sin, "Cos": E.cos, "Tan": E.tan, "Asin": E.arcsin, "Acos": E.arccos,
          "Atan": E.arctan, "Sinh": E.sinh, "Cosh": E.cosh, "Asinh": E.arcsinh, "Acosh": E.arccosh,
          "Atanh": E.arctanh, "Erf": E.erf, "Sign": E.sign, "Sigmoid": E.sigmoid, "Tanh": E.tanh,
          "Not": E.logical_not, "BitwiseNot": E.invert, "Reciprocal": E.reciprocal}


def _binary(fn):
    return lambda n: fn(n.input(0), n.input(1))


def _unary(fn):
    return lambda n: fn(n.input(0))


for _name, _fn in _BINARY.items():
    rule(_name)(_binary(_fn))
for _name, _fn in _UNARY.items():
    rule(_name)(_unary(_fn))


@rule("Div")
def _div(n):
    a, b = n.input(0), n.input(1)
    if a.dtype.is_float:
        return E.div(a, b)
    # integer division truncates toward zero (C semantics), NumPy's // floors
    q = E.floordiv(a, b)
    if a.dtype.np.kind == "u":
        return q
    inexact = E.ne(E.mod(a, b), const(0, a))
    signs_differ = E.ne(E.lt(a, const(0, a)), E.lt(b, const(0, b)))
    return E.where(E.logical_and(inexact, signs_differ), E.add(q, const(1, q)), q)


@rule("Mod")
def _mod(n):
    a, b = n.input(0), n.input(1)
    if not n.attr("fmod", 0):
        return E.mod(a, b)
    # fmod: the sign of the dividend, |a| mod |b|
    r = E.mod(E.abs(a), E.abs(b))
    return E.where(E.lt(a, const(0, a)), E.neg(r), r) if a.dtype.np.kind != "u" else r


@rule("Pow")
def _pow(n):
    a, b = n.input(0), n.input(1)
    if a.dtype.is_float:
        return E.pow(a, cast_to(b, a.dtype.np))
    if b.dtype.is_float:
        return cast_to(E.pow(cast_to(a, b.dtype.np), b), a.dtype.np)
    return E.pow(a, cast_to(b, a.dtype.np))


@rule("BitShift")
def _bitshift(n):
    from cgvm.ops import tensor_math as TM

    return TM.bit_shift(n.input(0), n.input(1), direction=n.attr("direction").lower())


def _variadic(fn):
    def apply(n):
        acc = n.input(0)
        for i in range(1, len(n.inputs)):
            acc = fn(acc, n.input(i))
        return acc
    return apply


rule("Max")(_variadic(E.maximum))
rule("Min")(_variadic(E.minimum))
rule("Sum")(_variadic(E.add))


@rule("Mean")
def _mean(n):
    total = _variadic(E.add)(n)
    return E.div(total, const(len(n.inputs), total))


@rule("Round")
def _round(n):
    return E.round(n.input(0))


_SATURATING = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")


def _onnx_cast(n, x, to):
    """Cast ``x`` to ``to``; to a float8 format with ``saturate`` (the default) out-of-range values,
    infinities included, become the format's largest finite value."""
    to = np.dtype(to)
    if to.name == "float8_e8m0fnu" and x.dtype.is_float:
        return _to_e8m0(x, n.attr("round_mode", "up"), bool(n.attr("saturate", 1)), to)
    if to.name in _SATURATING and n.attr("saturate", 1) and x.dtype.is_float:
        import ml_dtypes

        top = float(ml_dtypes.finfo(to).max)
        wide = x if x.dtype.np.itemsize >= 4 else E.cast(x, dtype="float32")
        x = E.minimum(E.maximum(wide, const(-top, wide)), const(top, wide))
    return cast_to(x, to)


def _to_e8m0(x, round_mode, saturate, to):
    """float8e8m0 (a power of two, stored as its biased exponent) the way ONNX rounds to it: float32's
    exponent field, incremented when the mantissa rounds up ("up": any fraction; "nearest": guard bit
    set and round, sticky or exponent's low bit; "down": never), NaN and infinity kept as 0xFF, the
    largest exponent not incremented past when saturating."""
    from cgvm.ops import tensor_math as TM

    u32 = np.uint32
    bits = TM.bitcast(cast_to(x, np.float32), dtype=u32)
    exponent = E.bitwise_and(TM.bit_shift(bits, const(23, dtype=u32), direction="right"), const(0xFF, dtype=u32))
    special = E.eq(exponent, const(0xFF, dtype=u32))

    def has(mask):
        return E.ne(E.bitwise_and(bits, const(mask, dtype=u32)), const(0, dtype=u32))

    if round_mode == "nearest":
        up = E.logical_and(has(0x400000), E.logical_or(E.logical_or(has(0x200000), has(0x1FFFFF)),
                                                       E.gt(exponent, const(0, dtype=u32))))
    elif round_mode == "up":
        up = has(0x7FFFFF)
    elif round_mode == "down":
        up = None
    else:
        raise ValueError(f"round_mode {round_mode!r} is not one of up, down, nearest")
    if up is not None:
        up = E.logical_and(up, E.logical_not(special))
        if saturate:
            up = E.logical_and(up, E.ne(exponent, const(0xFE, dtype=u32)))
        exponent = E.add(exponent, E.cast(up, dtype=u32))
    return TM.bitcast(E.cast(exponent, dtype=np.uint8), dtype=to)


@rule("Cast")
def _cast(n):
    return _onnx_cast(n, n.input(0), np_dtype(n.attr("to")))


@rule("CastLike")
def _castlike(n):
    return _onnx_cast(n, n.input(0), n.input(1).dtype.np)


@rule("IsNaN")
def _isnan(n):
    x = n.input(0)
    return E.ne(x, x)


@rule("IsInf")
def _isinf(n):
    x = n.input(0)
    pos, neg = n.attr("detect_positive", 1), n.attr("detect_negative", 1)
    inf = const(np.inf, x)
    hits = []
    if pos:
        hits.append(E.eq(x, inf))
    if neg:
        hits.append(E.eq(x, E.neg(inf)))
    if not hits:
        return shp.zeros_like(x, dtype="bool")
    return hits[0] if len(hits) == 1 else E.logical_or(*hits)


@rule("Where")
def _where(n):
    return E.where(n.input(0), n.input(1), n.input(2))


@rule("Clip")
def _clip(n):
    x = n.input(0)
    if n.opset < 11:
        lo, hi = n.attr("min", None), n.attr("max", None)
        lo = None if lo is None else const(lo, x)
        hi = None if hi is None else const(hi, x)
    else:
        lo = n.inputs[1] if n.has_input(1) else None
        hi = n.inputs[2] if n.has_input(2) else None
    y = x
    if lo is not None:
        y = E.maximum(y, lo)
    if hi is not None:
        y = E.minimum(y, hi)
    return y if y is not x else shp.contiguous(x)


@rule("BitCast")
def _bitcast(n):
    from cgvm.ops import tensor_math as TM

    return TM.bitcast(n.input(0), dtype=np_dtype(n.attr("to")))
