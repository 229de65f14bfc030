"""Indexing: ``x[...]`` with Theano's rules, and ``set_subtensor`` / ``inc_subtensor``.

An index is applied as a chain of steps, each one cgvm op:

- constant slices and integers: ``slice`` (a view), then ``squeeze`` for the integers;
- ``None`` / ``numpy.newaxis``: ``expand_dims``;
- a symbolic integer or an integer array on one axis: ``take``; symbolic slice bounds: ``take``
  of a run-time ``arange`` (Theano's minibatch idiom ``data[i * n:(i + 1) * n]``);
- several integer arrays (``m[rows, cols]``): ``advanced_index`` (pointwise, NumPy's rule).

Every step remembers its source and how to invert it, so ``set_subtensor(x[i:j, k], v)`` walks
the chain back: a slice is written with the ``set_subtensor``/``inc_subtensor`` ops, a gather with
the scatter-add that is its adjoint (repeated indices accumulate for ``inc_subtensor``).
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from ...ir.graph import CONST
from ...ops import elementwise as ew
from ...ops import indexing as ix
from ...ops import shape as shp
from . import basic as B
from .var import TensorVariable, as_tensor_variable, constant, wrap


class _Step:
    """How a sub-tensor was taken from its parent (kind and parameters), to write back through it."""

    __slots__ = ("parent", "kind", "params", "chained")

    def __init__(self, parent: TensorVariable, kind: str, params: Any, chained: bool):
        self.parent = parent
        self.kind = kind
        self.params = params
        self.chained = chained  # the parent is an intermediate of the same indexing expression


def _mark(child: Any, parent: TensorVariable, kind: str, params: Any, root: TensorVariable) -> TensorVariable:
    out = wrap(child) if not isinstance(child, TensorVariable) else child
    out._sub_step = _Step(parent, kind, params, parent is not root)
    return out


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _const_scalar(x: Any) -> Optional[int]:
    if _is_int(x):
        return int(x)
    if isinstance(x, TensorVariable) and x.value.kind == CONST and x.value.data.ndim == 0 \
            and x.value.dtype.is_int:
        return int(x.value.data)
    return None


def _is_static_slice(s: slice) -> bool:
    return all(p is None or _const_scalar(p) is not None for p in (s.start, s.stop, s.step))


def getitem(x: TensorVariable, index: Any) -> TensorVariable:
    if not isinstance(index, tuple):
        index = (index,)
    if isinstance(x.value, type(None)):
        raise TypeError("cannot index")
    # expand Ellipsis
    n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
    if any(i is Ellipsis for i in index):
        k = next(j for j, i in enumerate(index) if i is Ellipsis)
        index = index[:k] + (slice(None),) * (x.ndim - n_real) + index[k + 1:]
    if n_real > x.ndim:
        raise IndexError(f"too many indices ({n_real}) for a tensor of rank {x.ndim}")
    arrays = [i for i in index if _is_array_index(i)]
    if len(arrays) > 1:
        return _advanced(x, index)
    out = x
    axis = 0
    squeeze_axes: List[int] = []
    for item in index:
        if item is None:
            out = _mark(shp.expand_dims(out.value, axis=(axis,)), out, "newaxis", axis, x)
            axis += 1
        elif isinstance(item, slice):
            if item == slice(None):
                axis += 1
                continue
            if _is_static_slice(item):
                attrs = dict(starts=(_const_scalar(item.start),), stops=(_const_scalar(item.stop),),
                             steps=(_const_scalar(item.step),), axes=(axis,))
                out = _mark(ix.slice(out.value, **attrs), out, "slice", attrs, x)
            else:
                idx = _slice_indices(out, axis, item)
                out = _mark(ix.take(out.value, idx.value, axis=axis), out, "take", (axis, idx), x)
            axis += 1
        elif _const_scalar(item) is not None and not _is_array_index(item):
            k = _const_scalar(item)
            n = out.value.shape[axis]
            if n is None:  # length known only at run time: a gather, whose kernel checks the bound
                idx = constant(k, dtype="int64")
                out = _mark(ix.take(out.value, idx.value, axis=axis), out, "take", (axis, idx), x)
                continue
            if not -n <= k < n:
                raise IndexError(f"index {k} is out of bounds for axis {axis} of {x!r} (length {n})")
            attrs = dict(starts=(k,), stops=(k + 1 if k != -1 else None,), steps=(None,), axes=(axis,))
            out = _mark(ix.slice(out.value, **attrs), out, "slice", attrs, x)
            squeeze_axes.append(axis)
            axis += 1
        else:
            idx = as_tensor_variable(item)
            if idx.value.dtype.is_bool:
                raise IndexError("boolean mask indexing is not supported; use T.switch or nonzero indices")
            if not idx.value.dtype.is_int:
                raise IndexError(f"index must be an integer, got {idx.type!r}")
            out = _mark(ix.take(out.value, idx.value, axis=axis), out, "take", (axis, idx), x)
            axis += idx.ndim
    if squeeze_axes:
        out = _mark(shp.squeeze(out.value, axis=tuple(squeeze_axes)), out, "squeeze", tuple(squeeze_axes), x)
    return out


def _is_array_index(i: Any) -> bool:
    if isinstance(i, TensorVariable):
        return i.ndim > 0 or i.value.kind != CONST
    if isinstance(i, (list, np.ndarray)):
        return np.asarray(i).ndim > 0
    return False


def _advanced(x: TensorVariable, index: Tuple[Any, ...]) -> TensorVariable:
    """Several integer arrays: pointwise on the leading axes (the common ``m[rows, cols]`` form)."""
    lead = []
    for i in index:
        if isinstance(i, slice) or i is None:
            break
        lead.append(i)
    rest = index[len(lead):]
    if any(not (isinstance(r, slice) and r == slice(None)) for r in rest):
        raise IndexError("advanced indexing with several index arrays is supported on the leading axes only "
                         "(e.g. m[rows, cols] or m[rows, cols, :])")
    idx = []
    for i in lead:
        v = as_tensor_variable(i) if not _is_int(i) else constant(int(i), dtype="int64")
        if not v.value.dtype.is_int:
            raise IndexError(f"index must be an integer, got {v.type!r}")
        idx.append(v)
    out = ix.advanced_index(x.value, *[v.value for v in idx])
    return _mark(out, x, "advanced", tuple(idx), x)


def _slice_indices(x: TensorVariable, axis: int, s: slice) -> TensorVariable:
    """The positions ``s`` selects along ``axis``, for bounds known only at run time (Python's rules)."""
    from . import shapes

    n = shapes._dims(x)[axis]
    step = _const_scalar(s.step) if s.step is not None else 1
    if step is None:
        raise IndexError("a slice step must be known when the graph is built")
    if step == 0:
        raise ValueError("slice step cannot be zero")

    def norm(b: Any, default: Any, lo: Any, hi: Any) -> Any:
        if b is None:
            return default
        b = B.cast(as_tensor_variable(b) if not _is_int(b) else constant(int(b), dtype="int64"), "int64")
        b = B.switch(B.lt(b, 0), B.add(b, n), b)
        return B.minimum(B.maximum(b, lo), hi)

    if step > 0:
        start, stop = norm(s.start, 0, 0, n), norm(s.stop, n, 0, n)
    else:
        start, stop = norm(s.start, B.sub(n, 1), -1, B.sub(n, 1)), norm(s.stop, -1, -1, B.sub(n, 1))
    return shapes.arange(start, stop, step)


# --------------------------------------------------------------------------- writing through an index

def set_subtensor(x: Any, y: Any, inplace: bool = False, tolerate_inplace_aliasing: bool = False) -> TensorVariable:
    """A copy of the tensor ``x`` was indexed from, with that region set to ``y``."""
    return _write(x, y, increment=False)


def inc_subtensor(x: Any, y: Any, inplace: bool = False, set_instead_of_inc: bool = False,
                  tolerate_inplace_aliasing: bool = False, ignore_duplicates: bool = False) -> TensorVariable:
    """A copy of the tensor ``x`` was indexed from, with ``y`` added to that region."""
    return _write(x, y, increment=not set_instead_of_inc)


def _write(sub: Any, y: Any, increment: bool) -> TensorVariable:
    step: Optional[_Step] = getattr(sub, "_sub_step", None)
    if step is None:
        raise TypeError("set_subtensor/inc_subtensor take an indexed tensor as first argument, e.g. "
                        "T.set_subtensor(x[2:5], v)")
    yv = as_tensor_variable(y) if isinstance(y, TensorVariable) else wrap(B._like(y, sub.value))
    if yv.dtype != sub.dtype:
        yv = B.cast(yv, sub.dtype)
    parent = step.parent
    pv, val = parent.value, yv.value
    if step.kind in ("squeeze", "newaxis"):
        full = shp.broadcast_like(val, sub.value)
        val = (shp.expand_dims(full, axis=step.params) if step.kind == "squeeze"
               else shp.squeeze(full, axis=(step.params,)))
        if step.chained:
            return _write(parent, wrap(val), increment)
        return wrap(ew.add(pv, val)) if increment else wrap(shp.broadcast_like(val, pv))
    if step.kind == "slice":
        op = ix.inc_subtensor if increment else ix.set_subtensor
        new_parent = wrap(op(pv, val, **step.params))
    elif step.kind == "take":
        axis, idx = step.params
        scattered = ix.take_grad(shp.broadcast_like(val, sub.value), pv, idx.value, axis=axis)
        new_parent = _combine(pv, scattered, increment,
                              lambda ones: ix.take_grad(ones, pv, idx.value, axis=axis), sub)
    else:  # advanced
        idx = [i.value for i in step.params]
        scattered = ix.advanced_index_grad(shp.broadcast_like(val, sub.value), pv, *idx)
        new_parent = _combine(pv, scattered, increment, lambda ones: ix.advanced_index_grad(ones, pv, *idx), sub)
    if step.chained:
        return _write(parent, new_parent, increment=False)
    return new_parent


def _combine(pv: Any, scattered: Any, increment: bool, scatter_ones: Any, sub: TensorVariable) -> TensorVariable:
    if increment:
        return wrap(ew.add(pv, scattered))
    hit = ew.gt(scatter_ones(shp.ones_like(sub.value)), 0)
    return wrap(ew.where(hit, scattered, pv))


def take(a: Any, indices: Any, axis: Optional[int] = None, mode: str = "raise") -> TensorVariable:
    av = as_tensor_variable(a)
    idx = as_tensor_variable(indices)
    return wrap(ix.take(av.value, B.cast(idx, "int64").value if not idx.value.dtype.is_int else idx.value,
                        axis=axis))
