"""Linear quantization: QuantizeLinear and DequantizeLinear (per tensor, per axis, blocked; integer
targets of every width cgvm knows, int4/uint4/int2/uint2 and float8 included), and the integer
products: MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv.

The integer products subtract the zero points in int32 as ONNX defines; a matrix product runs in
int32 (cgvm's matmul takes integers), a convolution in float64 (cgvm's convolution kernels are
floating point; every int8 x int8 sum of the sizes an int32 result can hold is exact there) and is
cast back. Requantizing scales the int32 accumulator in float64, rounds half to even and
saturates, as ONNX's reference does.
"""
from __future__ import annotations

import numpy as np

from cgvm.ops import elementwise as E
from cgvm.ops import shape as shp

from ..translate import np_dtype, rule
from .common import axis_of, const, cast_to
from .nn import conv_of

_INT_RANGES = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}


def _along(n, v, x, axis, block):
    """Scale or zero point ``v`` shaped to broadcast against ``x`` (per tensor, per axis, blocked)."""
    if v.ndim == 0 or (v.ndim == 1 and v.shape[0] == 1 and block == 0):
        return v
    if block:
        # one value per block of `block` entries along axis: repeat them
        shape = n.shape(0)
        a = axis_of(axis, x.ndim)
        reps = np.repeat(np.arange(v.shape[a]), block)[: shape[a]]
        from cgvm.ir.graph import const_value
        from cgvm.ops import indexing as I

        return I.take(v, const_value(reps.astype(np.int64)), axis=a)
    a = axis_of(axis, x.ndim)
    return shp.reshape(v, shape=(1,) * a + (-1,) + (1,) * (x.ndim - a - 1))


@rule("QuantizeLinear")
def _quantize(n):
    x, scale = n.input(0), n.input(1)
    zp = n.inputs[2] if n.has_input(2) else None
    axis, block = n.attr("axis", 1), n.attr("block_size", 0)
    out = np_dtype(n.attr("output_dtype")) if n.attr("output_dtype") else (zp.dtype.np if zp is not None
                                                                            else np.dtype(np.uint8))
    work = np.float32 if x.dtype.np != np.float64 else np.float64
    xf = E.cast(x, dtype=work) if x.dtype.np != work else x
    s = _along(n, E.cast(scale, dtype=work) if scale.dtype.np != work else scale, x, axis, block)
    q = E.div(xf, s)
    if out.kind in "iu" or out.name in _INT_RANGES:
        q = E.round(q)
        if zp is not None:
            q = E.add(q, _along(n, E.cast(zp, dtype=work), x, axis, block))
        lo, hi = _INT_RANGES.get(out.name) or (np.iinfo(out).min, np.iinfo(out).max)
        q = E.minimum(E.maximum(q, const(lo, q)), const(hi, q))
        return E.cast(q, dtype=out)
    # float8 targets: no rounding to integers; out-of-range values saturate (the default)
    if zp is not None:
        q = E.add(q, _along(n, E.cast(zp, dtype=work), x, axis, block))
    if n.attr("saturate", 1):
        import ml_dtypes

        top = float(ml_dtypes.finfo(out).max)
        q = E.minimum(E.maximum(q, const(-top, q)), const(top, q))
    return E.cast(q, dtype=out)


@rule("DequantizeLinear")
def _dequantize(n):
    x, scale = n.input(0), n.input(1)
    zp = n.inputs[2] if n.has_input(2) else None
    axis, block = n.attr("axis", 1), n.attr("block_size", 0)
    out = np_dtype(n.attr("output_dtype")) if n.attr("output_dtype") else scale.dtype.np
    work = np.float32 if out != np.float64 else np.float64
    xf = E.cast(x, dtype=work)
    if zp is not None:
        xf = E.sub(xf, _along(n, E.cast(zp, dtype=work), x, axis, block))
    y = E.mul(xf, _along(n, E.cast(scale, dtype=work) if scale.dtype.np != work else scale, x, axis, block))
    return E.cast(y, dtype=out) if out != work else y


def _centered(v, zero_point, per_row_axis=None):
    """``v`` as int32 minus its zero point (a scalar, or one value per entry along ``per_row_axis``)."""
    x = cast_to(v, np.int32)
    if zero_point is None:
        return x
    zp = cast_to(zero_point, np.int32)
    if zp.ndim == 1 and per_row_axis is not None and (zp.shape[0] is None or zp.shape[0] > 1):
        zp = shp.reshape(zp, shape=(-1,) + (1,) * (v.ndim - 1 - per_row_axis))
    elif zp.ndim >= 1:
        zp = shp.reshape(zp, shape=()) if zp.shape == (1,) else zp
    return E.sub(x, zp)


def _optional(n, i):
    return n.inputs[i] if n.has_input(i) else None


@rule("MatMulInteger")
def _matmul_integer(n):
    from cgvm.ops import linalg as L

    a, b = n.input(0), n.input(1)
    # a's zero point may be one per row (the axis before the last), b's one per column (the last)
    return L.matmul(_centered(a, _optional(n, 2), per_row_axis=a.ndim - 2),
                    _centered(b, _optional(n, 3), per_row_axis=b.ndim - 1))


def _conv_integer(n, x, x_zp, w, w_zp, bias=None, w_input=1):
    """conv((x - x_zp), (w - w_zp)) + bias, exact, as int32 (w's zero point may be per output channel)."""
    n.spatial(0)
    xs = E.cast(_centered(x, x_zp), dtype=np.float64)
    ws = E.cast(_centered(w, w_zp, per_row_axis=0), dtype=np.float64)
    bf = E.cast(bias, dtype=np.float64) if bias is not None else None
    return E.cast(conv_of(n, xs, ws, bf, w_input=w_input), dtype=np.int32)


@rule("ConvInteger")
def _conv_integer_rule(n):
    return _conv_integer(n, n.input(0), _optional(n, 2), n.input(1), _optional(n, 3))


def _requantize(acc, factor, y_zp, out_dtype, round_op):
    """int32 ``acc`` times ``factor`` (scales combined in their own dtype), plus the zero point, rounded and
    saturated to ``out_dtype``: in float64 as ONNX's reference computes it."""
    y = E.mul(E.cast(acc, dtype=np.float64), cast_to(factor, np.float64))
    if y_zp is not None:
        y = E.add(y, cast_to(y_zp, np.float64))
    info = np.iinfo(out_dtype)
    y = E.minimum(E.maximum(round_op(y), const(info.min, y)), const(info.max, y))
    return E.cast(y, dtype=out_dtype)


@rule("QLinearMatMul")
def _qlinear_matmul(n):
    from cgvm.ops import linalg as L

    a, a_scale, a_zp, b, b_scale, b_zp, y_scale = (n.input(i) for i in range(7))
    y_zp = _optional(n, 7)
    acc = L.matmul(_centered(a, a_zp, per_row_axis=a.ndim - 2), _centered(b, b_zp, per_row_axis=b.ndim - 1))
    factor = E.div(E.mul(a_scale, b_scale), y_scale)
    return _requantize(acc, factor, y_zp, (y_zp.dtype if y_zp is not None else a.dtype).np, E.round)


@rule("QLinearConv")
def _qlinear_conv(n):
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale = (n.input(i) for i in range(7))
    y_zp, bias = _optional(n, 7), _optional(n, 8)
    acc = _conv_integer(n, x, x_zp, w, w_zp, bias, w_input=3)
    if w_scale.ndim == 1 and (w_scale.shape[0] is None or w_scale.shape[0] > 1):   # one scale per output channel
        w_scale = shp.reshape(w_scale, shape=(1, -1) + (1,) * (x.ndim - 2))
    factor = E.div(E.mul(x_scale, w_scale), y_scale)
    return _requantize(acc, factor, y_zp, (y_zp.dtype if y_zp is not None else x.dtype).np, E.round)
