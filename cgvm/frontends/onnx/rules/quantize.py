"""Linear quantization: QuantizeLinear and DequantizeLinear (per tensor, per axis, blocked; integer
targets of every width cgvm knows, int4/uint4/int2/uint2 and float8 included)."""
from __future__ import annotations

import numpy as np

from cgvm.ops import elementwise as E
from cgvm.ops import shape as shp

from ..translate import np_dtype, rule
from .common import axis_of, const

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
