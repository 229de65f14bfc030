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
from ...ops import selection as sel
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
                out = _dynamic_slice(out, axis, item, x)
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
                if axis != 0 or squeeze_axes:
                    raise IndexError("a boolean mask index must come first (x[mask], x[mask, 1:3]); here it is "
                                     f"at position {axis}")
                out = _masked(out, idx, x)
                axis = 1
                continue
            if not idx.value.dtype.is_int:
                raise IndexError(f"index must be an integer, got {idx.type!r}")
            out = _mark(ix.take(out.value, idx.value, axis=axis), out, "take", (axis, idx), x)
            axis += idx.ndim
    if squeeze_axes:
        out = _mark(shp.squeeze(out.value, axis=tuple(squeeze_axes)), out, "squeeze", tuple(squeeze_axes), x)
    return out


def _masked(x: TensorVariable, mask: TensorVariable, root: TensorVariable) -> TensorVariable:
    """``x[mask]`` for a boolean mask over x's leading ``mask.ndim`` axes: the selected entries in
    row-major order, one axis in place of the masked ones (NumPy's and PyTensor's rule)."""
    from . import shapes

    k = mask.ndim
    if k == 0 or k > x.ndim:
        raise IndexError(f"a boolean mask of rank {k} cannot index a tensor of rank {x.ndim}")
    for d, (a, b) in enumerate(zip(mask.value.shape, x.value.shape)):
        if a is not None and b is not None and a != b:
            raise IndexError(f"boolean mask of shape {mask.value.shape} does not match axis {d} of {x!r} "
                             f"(length {b})")
    rest = shapes._dims(x)[k:]
    rows = shapes.reshape(x, [-1] + list(rest)) if k != 1 else x
    flat = shapes.flatten(mask, 1) if k != 1 else mask
    out = wrap(sel.filter_rows(rows.value, flat.value))
    out._sub_step = _Step(x, "mask", (rows, flat), x is not root)
    return out


def _is_array_index(i: Any) -> bool:
    if isinstance(i, TensorVariable):
        return i.ndim > 0 or i.value.kind != CONST
    if isinstance(i, (list, np.ndarray)):
        return np.asarray(i).ndim > 0
    return False


def _advanced(x: TensorVariable, index: Tuple[Any, ...]) -> TensorVariable:
    """Several integer arrays (integers count as 0-d arrays), NumPy's rule for where results go.

    The indexed axes are brought to the front, indexed pointwise there, and the broadcast index
    dimensions moved back to where the indexed axes were when those were adjacent (else they stay
    in front). Other axes take full slices.
    """
    if any(i is None for i in index):
        raise IndexError("advanced indexing with several index arrays does not combine with newaxis here")
    index = tuple(index) + (slice(None),) * (x.ndim - len(index))
    adv = [k for k, i in enumerate(index) if not isinstance(i, slice)]
    if any(not (isinstance(i, slice) and i == slice(None)) for i in index if isinstance(i, slice)):
        raise IndexError("advanced indexing with several index arrays takes full slices (:) on its other axes; "
                         "slice first, then index")
    idx = []
    for k in adv:
        i = index[k]
        v = as_tensor_variable(i) if not _is_int(i) else constant(int(i), dtype="int64")
        if not v.value.dtype.is_int:
            raise IndexError(f"index must be an integer, got {v.type!r}")
        idx.append(v)
    others = [k for k in range(x.ndim) if k not in adv]
    src = x
    if adv != list(range(len(adv))):
        perm = tuple(adv + others)
        src = _mark(shp.transpose(x.value, perm=perm), x, "transpose", perm, x)
    out = _mark(ix.advanced_index(src.value, *[v.value for v in idx]), src, "advanced", tuple(idx), x)
    nb = out.ndim - len(others)
    first = adv[0]
    if adv == list(range(first, first + len(adv))) and first > 0:
        perm2 = tuple(list(range(nb, nb + first)) + list(range(nb)) + list(range(nb + first, out.ndim)))
        out = _mark(shp.transpose(out.value, perm=perm2), out, "transpose", perm2, x)
    return out


def _dynamic_slice(x: TensorVariable, axis: int, s: slice, root: TensorVariable) -> TensorVariable:
    """``x[s]`` along ``axis`` for bounds known only at run time: a view (dynamic_slice), as NumPy's.
    Absent bounds are the ends (Python clamps the largest int64 there). Writing through it
    (set/inc_subtensor) goes by the positions it selects; nothing computes them otherwise."""
    step = _slice_step(s)
    big = np.iinfo(np.int64).max

    def bound(b: Any, default: int) -> TensorVariable:
        if b is None:
            return constant(default, dtype="int64")
        return B.cast(as_tensor_variable(b) if not _is_int(b) else constant(int(b), dtype="int64"), "int64")

    start, stop = (bound(s.start, 0), bound(s.stop, big)) if step > 0 else (bound(s.start, big),
                                                                           bound(s.stop, -big - 1))
    view = ix.dynamic_slice(x.value, start.value, stop.value, axis=axis, step=step)
    return _mark(view, x, "take", (axis, _slice_indices(x, axis, s)), root)


def _slice_step(s: slice) -> int:
    step = _const_scalar(s.step) if s.step is not None else 1
    if step is None:
        raise IndexError("a slice step must be known when the graph is built")
    if step == 0:
        raise ValueError("slice step cannot be zero")
    return int(step)


def _slice_indices(x: TensorVariable, axis: int, s: slice) -> TensorVariable:
    """The positions ``s`` selects along ``axis``, for bounds known only at run time (Python's rules)."""
    from . import shapes

    n = shapes._dims(x)[axis]
    step = _slice_step(s)

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
    if step.kind == "transpose":
        inverse = tuple(int(k) for k in np.argsort(step.params))
        val = shp.transpose(shp.broadcast_like(val, sub.value), perm=inverse)
        if step.chained:
            return _write(parent, wrap(val), increment)
        return wrap(ew.add(pv, val)) if increment else wrap(val)
    if step.kind in ("squeeze", "newaxis"):
        full = shp.broadcast_like(val, sub.value)
        val = (shp.expand_dims(full, axis=step.params) if step.kind == "squeeze"
               else shp.squeeze(full, axis=(step.params,)))
        if step.chained:
            return _write(parent, wrap(val), increment)
        return wrap(ew.add(pv, val)) if increment else wrap(shp.broadcast_like(val, pv))
    if increment and step.chained:
        # an increment composes through the chain: the region's delta (zeros elsewhere) goes up as an
        # increment, so repeated indices anywhere in the chain accumulate (Theano's inc_subtensor)
        return _write(parent, wrap(_delta(step, pv, val, sub)), increment=True)
    if step.kind == "slice":
        op = ix.inc_subtensor if increment else ix.set_subtensor
        new_parent = wrap(op(pv, val, **step.params))
    elif increment:
        new_parent = wrap(ew.add(pv, _delta(step, pv, val, sub)))
    elif step.kind == "take":  # assignment: with repeated indices the last write wins, as in NumPy
        axis, idx = step.params
        new_parent = wrap(ix.take_set(pv, shp.broadcast_like(val, sub.value), idx.value, axis=axis))
    elif step.kind == "mask":
        rows, mask = step.params
        kept = sel.unfilter_rows(shp.broadcast_like(val, sub.value), mask.value, rows.value)
        hit = sel.unfilter_rows(shp.ones_like(sub.value), mask.value, rows.value)
        new_rows = ew.where(ew.gt(hit, 0), kept, rows.value)
        new_parent = wrap(shp.reshape_like(new_rows, pv))
    else:  # advanced
        idx = [i.value for i in step.params]
        new_parent = wrap(ix.advanced_set(pv, shp.broadcast_like(val, sub.value), *idx))
    if step.chained:
        return _write(parent, new_parent, increment=False)
    return new_parent


def _delta(step: _Step, pv: Any, val: Any, sub: TensorVariable) -> Any:
    """Zeros shaped like the parent with ``val`` added at the region ``step`` selected (repeats add up)."""
    full = shp.broadcast_like(val, sub.value)
    if step.kind == "slice":
        return ix.inc_subtensor(shp.zeros_like(pv), val, **step.params)
    if step.kind == "take":
        axis, idx = step.params
        return ix.take_grad(full, pv, idx.value, axis=axis)
    if step.kind == "mask":
        rows, mask = step.params
        return shp.reshape_like(sel.unfilter_rows(full, mask.value, rows.value), pv)
    return ix.advanced_index_grad(full, pv, *[i.value for i in step.params])


def take(a: Any, indices: Any, axis: Optional[int] = None, mode: str = "raise") -> TensorVariable:
    av = as_tensor_variable(a)
    idx = as_tensor_variable(indices)
    return wrap(ix.take(av.value, B.cast(idx, "int64").value if not idx.value.dtype.is_int else idx.value,
                        axis=axis))
