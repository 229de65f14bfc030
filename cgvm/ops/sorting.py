"""Sorting ops: sort, argsort, and the along-axis gather/scatter pair that differentiates them.

``sort`` is a gather of its input by ``argsort``, so its gradient scatters the output gradient
back to the positions the values came from (``scatter_along_axis``). Ties are broken by a
stable sort, so the gradient of tied values is well defined.
"""
from __future__ import annotations

from ..ir.attrs import Int
from ..ir.types import TensorType, int64
from . import indexing as ix
from .registry import OPAQUE, defop
from .rules import normalize_axis


def _sort_infer(types, axis):
    t = types[0]
    if t.ndim == 0:
        raise ValueError("sort needs a tensor of rank 1 or more")
    normalize_axis(axis, t.ndim)
    return t


sort = defop("sort", pattern=OPAQUE, attrs={"axis": Int(-1)}, infer=_sort_infer,
             doc="Values sorted ascending along axis (stable).")


@sort.kernel
def _(xp, x, *, axis, out=None):
    r = xp.sort(x, axis=axis, kind="stable")
    if out is None:
        return r
    out[...] = r
    return out


@sort.grad
def _(node, g):
    x = node.inputs[0]
    axis = node.attrs["axis"]
    return [scatter_along_axis(g, x, argsort(x, axis=axis), axis=axis)]


argsort = defop("argsort", pattern=OPAQUE, differentiable=False, attrs={"axis": Int(-1)},
                infer=lambda types, axis: _sort_infer(types, axis).with_dtype(int64),
                doc="int64 positions that sort x ascending along axis (stable).")


@argsort.kernel
def _(xp, x, *, axis, out=None):
    r = xp.argsort(x, axis=axis, kind="stable").astype(xp.int64, copy=False)
    if out is None:
        return r
    out[...] = r
    return out


def _along_infer(types, axis):
    x, idx = types[0], types[-1]
    if not idx.dtype.is_int:
        raise TypeError(f"indices must be integers, got {idx!r}")
    if idx.ndim != x.ndim:
        raise ValueError(f"indices of rank {idx.ndim} for a tensor of rank {x.ndim}")
    normalize_axis(axis, x.ndim)
    return TensorType(idx.shape, x.dtype)


take_along_axis = defop("take_along_axis", num_inputs=2, attrs={"axis": Int(-1)},
                        infer=_along_infer, doc="numpy.take_along_axis(x, indices, axis)")


@take_along_axis.kernel
def _(xp, x, indices, *, axis, out=None):
    r = xp.take_along_axis(x, indices, axis=axis)
    if out is None:
        return r
    out[...] = r
    return out


@take_along_axis.grad
def _(node, g):
    x, idx = node.inputs
    return [scatter_along_axis(g, x, idx, axis=node.attrs["axis"]), None]


def _full_index(xp, indices, axis: int) -> tuple:
    """Index arrays addressing, for every entry of ``indices``, its position with ``axis`` replaced."""
    ndim = indices.ndim
    axis = axis % ndim
    index = []
    for d in range(ndim):
        if d == axis:
            index.append(indices)
        else:
            shape = [1] * ndim
            shape[d] = indices.shape[d]
            index.append(xp.arange(indices.shape[d]).reshape(shape))
    return tuple(index)


scatter_along_axis = defop("scatter_along_axis", num_inputs=3, pattern=OPAQUE, attrs={"axis": Int(-1)},
                           infer=lambda types, axis: TensorType(types[1].shape, types[0].dtype),
                           doc="Zeros shaped like x with g added at the along-axis indices (take_along_axis' adjoint).")


@scatter_along_axis.kernel
def _(xp, g, x, indices, *, axis, out=None):
    if out is None:
        out = xp.zeros(x.shape, dtype=g.dtype)
    else:
        out.fill(0)
    ix.scatter_add(xp, out, _full_index(xp, indices, axis), g)
    return out


@scatter_along_axis.grad
def _(node, gg):
    return [take_along_axis(gg, node.inputs[2], axis=node.attrs["axis"]), None, None]
