"""Tensors made from attributes alone or from run-time sizes: zeros/ones/full, arange, eye, alloc.

Ops without inputs are folded to constants at compile time when small; ``alloc`` takes its
sizes from integer scalar tensors (Theano's alloc), with the sizes known at build time kept
as a static hint in the type.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from ..errors import DTypeError
from ..ir.attrs import AttrKind, DTypeAttr, Float, Int, Ints
from ..ir.graph import CONST, Value, const_value
from ..ir.types import TensorType, float32, int64
from . import reduce as red
from .registry import defop
from .shape import OptionalInts, check_broadcastable_to


def _fill_infer(types, shape, dtype, value=0.0):
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    return TensorType(shape, dtype)


def _shaped_filler(fill):
    def factory(xp, shape, dtype, value=None):
        v = fill if value is None else value

        def kernel(out=None):
            if out is None:
                return xp.full(shape, v, dtype=dtype.np)
            out.fill(v)
            return out
        return kernel
    return factory


zeros = defop("zeros", num_inputs=0, differentiable=False, infer=_fill_infer,
              attrs={"shape": Ints(), "dtype": DTypeAttr(float32)})
ones = defop("ones", num_inputs=0, differentiable=False, infer=_fill_infer,
             attrs={"shape": Ints(), "dtype": DTypeAttr(float32)})
full = defop("full", num_inputs=0, differentiable=False, infer=_fill_infer,
             attrs={"shape": Ints(), "value": Float(), "dtype": DTypeAttr(float32)})
zeros.kernel_factory(_shaped_filler(0))
ones.kernel_factory(_shaped_filler(1))
full.kernel_factory(_shaped_filler(None))


class Number(AttrKind):
    """An int or a float, kept as given (so ``arange(stop=5)`` can default to an integer dtype)."""

    kind = "number"

    def convert(self, value):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"expected a number, got {value!r}")
        return int(value) if isinstance(value, (int, np.integer)) else float(value)


def _arange_dtype(start, stop, step, dtype):
    if dtype is not None:
        return dtype
    return int64 if all(isinstance(v, int) for v in (start, stop, step)) else float32


def _arange_infer(types, start, stop, step, dtype):
    if step == 0:
        raise ValueError("arange: step must not be zero")
    return TensorType((max(0, math.ceil((stop - start) / step)),), _arange_dtype(start, stop, step, dtype))


arange = defop("arange", num_inputs=0, differentiable=False, infer=_arange_infer,
               attrs={"start": Number(0), "stop": Number(), "step": Number(1), "dtype": DTypeAttr(None)},
               doc="Evenly spaced values in [start, stop); int64 when all bounds are ints, else float32.")


@arange.kernel_factory
def _(xp, start, stop, step, dtype):
    npd = _arange_dtype(start, stop, step, dtype).np
    n = max(0, math.ceil((stop - start) / step))

    def kernel(out=None):
        # computed in float64 and cast, so the length always agrees with the type rule
        r = (xp.arange(n, dtype=xp.float64) * step + start).astype(npd)
        if out is None:
            return r
        out[...] = r
        return out
    return kernel


def _eye_infer(types, n, m, k, dtype):
    if n < 0 or (m is not None and m < 0):
        raise ValueError(f"eye: negative size n={n}, m={m}")
    return TensorType((n, n if m is None else m), dtype)


eye = defop("eye", num_inputs=0, differentiable=False, infer=_eye_infer,
            attrs={"n": Int(), "m": Int(None), "k": Int(0), "dtype": DTypeAttr(float32)},
            doc="An n x m matrix with ones on diagonal k.")


@eye.kernel
def _(xp, *, n, m, k, dtype, out=None):
    r = xp.eye(n, m, k, dtype=dtype.np)
    if out is None:
        return r
    out[...] = r
    return out


def _alloc_infer(types, shape):
    value, dims = types[0], types[1:]
    for i, t in enumerate(dims):
        if t.ndim != 0 or not t.dtype.is_int:
            raise DTypeError(f"alloc: dimension {i} must be an integer scalar, got {t!r}")
    hints = shape if shape is not None else (None,) * len(dims)
    if len(hints) != len(dims):
        raise ValueError(f"alloc: {len(hints)} static dimensions for {len(dims)} dimension inputs")
    check_broadcastable_to(value.shape, hints, "alloc")
    return TensorType(hints, value.dtype)


alloc_op = defop("alloc", num_inputs=(1, None), infer=_alloc_infer,
                 attrs={"shape": OptionalInts(None)},
                 doc="Theano's alloc: the first input broadcast to the shape given by integer scalar inputs; "
                     "`shape` holds the dimensions known when the graph is built (None where not).")


@alloc_op.kernel
def _(xp, value, *dims, shape, out=None):
    if out is None:
        out = xp.empty(tuple(int(d) for d in dims), dtype=value.dtype)
    out[...] = value
    return out


@alloc_op.grad
def _(node, g):
    return [red.sum_to_like(g, node.inputs[0])] + [None] * (len(node.inputs) - 1)


def _static_dim(d: Any) -> Optional[int]:
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        return int(d)
    if isinstance(d, Value) and d.kind == CONST and d.data.ndim == 0 and d.dtype.is_int:
        return int(d.data)
    return None


def alloc(value: Any, *dims: Any, name: Optional[str] = None) -> Value:
    """``value`` broadcast to the shape ``dims`` (ints or integer scalar tensors), as Theano's alloc."""
    dim_values = [const_value(d, "int64") if isinstance(d, (int, np.integer)) else d for d in dims]
    return alloc_op(value, *dim_values, shape=tuple(_static_dim(d) for d in dims), name=name)
