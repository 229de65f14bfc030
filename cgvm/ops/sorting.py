"""Sorting ops: sort, argsort, the along-axis gather/scatter pair that differentiates them, and
the along-axis scatter that combines (scatter_reduce: add, mul, max, min, as ONNX's ScatterElements
and torch's scatter_reduce with the input included).

``sort`` is a gather of its input by ``argsort``, so its gradient scatters the output gradient
back to the positions the values came from (``scatter_along_axis``). Ties are broken by a
stable sort, so the gradient of tied values is well defined.
"""
from __future__ import annotations

from ..backend import scatter_reduce as _scatter_reduce_into
from ..ir.attrs import Int, Str
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


# --------------------------------------------------------------------------- scatter_reduce

REDUCTIONS = ("add", "mul", "max", "min")


def _scatter_reduce_infer(types, axis, reduction):
    x, idx, upd = types
    if not idx.dtype.is_int:
        raise TypeError(f"scatter_reduce: indices must be integers, got {idx!r}")
    if idx.ndim != x.ndim or upd.ndim != x.ndim:
        raise ValueError(f"scatter_reduce: indices {idx!r} and updates {upd!r} need the rank of {x!r}")
    if any(a is not None and b is not None and a != b for a, b in zip(idx.shape, upd.shape)):
        raise ValueError(f"scatter_reduce: indices {idx!r} and updates {upd!r} differ in shape")
    if upd.dtype is not x.dtype:
        raise TypeError(f"scatter_reduce: updates of dtype {upd.dtype.name} for a tensor of {x.dtype.name}")
    normalize_axis(axis, x.ndim)
    return x


scatter_reduce = defop("scatter_reduce", num_inputs=3, pattern=OPAQUE, inplace=((0, 0),),
                       attrs={"axis": Int(0), "reduction": Str(choices=REDUCTIONS)}, infer=_scatter_reduce_infer,
                       doc="A copy of x with each update combined (add, mul, max, min) into the entry its "
                           "index names along axis (the other coordinates its own); repeated indices all combine.")


@scatter_reduce.kernel
def _(xp, x, indices, updates, *, axis, reduction, out=None):
    if out is None:
        out = x.copy()
    elif out is not x:
        out[...] = x
    _scatter_reduce_into(xp, out, _full_index(xp, indices, axis), updates, reduction)
    return out


@scatter_reduce.grad
def _(node, g):
    x, idx, upd = node.inputs
    axis, reduction = node.attrs["axis"], node.attrs["reduction"]
    if reduction == "add":
        return [g, None, take_along_axis(g, idx, axis=axis)]
    gx, gu = scatter_reduce_grad(g, x, idx, upd, node.outputs[0], axis=axis, reduction=reduction)
    return [gx, None, gu]


scatter_reduce_grad = defop("scatter_reduce_grad", num_inputs=5, num_outputs=2, pattern=OPAQUE, differentiable=False,
                            writes_out=False, attrs={"axis": Int(0), "reduction": Str(choices=REDUCTIONS[1:])},
                            infer=lambda types, axis, reduction: [types[1], types[3]],
                            doc="(gradient wrt x, wrt updates) of scatter_reduce mul/max/min, given its result.")


@scatter_reduce_grad.kernel
def _(xp, g, x, indices, updates, result, *, axis, reduction):
    at = _full_index(xp, indices, axis)
    if reduction in ("max", "min"):
        # the entries equal to the result share its gradient evenly (ties split, as torch does)
        won_x = (x == result).astype(g.dtype)
        won_u = (updates == result[at]).astype(g.dtype)
        ties = won_x.copy()
        _scatter_reduce_into(xp, ties, at, won_u, "add")
        return g * won_x / ties, g[at] * won_u / ties[at]
    # mul: each factor's gradient is the product of the other factors, zeros counted so none is divided by
    zero_x, zero_u = x == 0, updates == 0
    zeros = zero_x.astype(xp.int64)
    _scatter_reduce_into(xp, zeros, at, zero_u.astype(xp.int64), "add")
    nonzero_product = xp.where(zero_x, xp.ones_like(x), x)
    _scatter_reduce_into(xp, nonzero_product, at, xp.where(zero_u, xp.ones_like(updates), updates), "mul")
    safe_x, safe_u = xp.where(zero_x, xp.ones_like(x), x), xp.where(zero_u, xp.ones_like(updates), updates)
    others_x = xp.where(zero_x, xp.where(zeros == 1, nonzero_product, 0),
                        xp.where(zeros == 0, nonzero_product / safe_x, 0))
    zeros_u, product_u = zeros[at], nonzero_product[at]
    others_u = xp.where(zero_u, xp.where(zeros_u == 1, product_u, 0), xp.where(zeros_u == 0, product_u / safe_u, 0))
    return (g * others_x).astype(g.dtype, copy=False), (g[at] * others_u).astype(g.dtype, copy=False)
