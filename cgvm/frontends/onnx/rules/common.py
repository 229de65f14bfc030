"""Helpers the rules share: typed constants, axis normalization, ONNX's broadcasting checks."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from cgvm.ir import Value
from cgvm.ir.graph import const_value
from cgvm.ops import elementwise as E


def const(x: Any, like: Optional[Value] = None, dtype: Any = None) -> Value:
    """A constant of ``like``'s dtype (or ``dtype``)."""
    d = dtype if dtype is not None else (like.dtype.np if like is not None else None)
    return const_value(np.asarray(x, dtype=d))


def axis_of(axis: int, ndim: int) -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ValueError(f"axis {axis} is out of range for rank {ndim}")
    return axis + ndim if axis < 0 else axis


def axes_of(axes: Sequence[int], ndim: int) -> tuple:
    return tuple(sorted(axis_of(int(a), ndim) for a in axes))


def cast_to(v: Value, dtype: Any) -> Value:
    return v if v.dtype.np == np.dtype(dtype) else E.cast(v, dtype=np.dtype(dtype))


def ints(a: Any) -> list:
    return [int(x) for x in np.asarray(a).reshape(-1)]
