"""Reductions over axes (sum, mean, max, ...), and sum_to_like, the adjoint of broadcasting."""
from __future__ import annotations

from ..ir.attrs import Bool, Ints
from ..ir.types import TensorType
from . import elementwise as ew
from . import shape as shp
from .registry import REDUCE, defop
from .rules import normalize_axes, reduce_shape


def _reduce_infer(types, axis, keepdims):
    t = types[0]
    return TensorType(reduce_shape(t.shape, axis, keepdims), t.dtype)


sum = defop("sum", pattern=REDUCE, attrs={"axis": Ints(None), "keepdims": Bool(False)}, infer=_reduce_infer)


@sum.kernel
def _(xp, x, *, axis, keepdims, out=None):
    return xp.sum(x, axis=axis, keepdims=keepdims, out=out)


@sum.grad
def _(node, g):
    x = node.inputs[0]
    if not node.attrs["keepdims"]:
        axes = normalize_axes(node.attrs["axis"], x.ndim)
        g = shp.expand_dims(g, axis=axes)
    return [shp.broadcast_like(g, x)]


def _sum_to_like_infer(types):
    g, x = types
    return TensorType(x.shape, g.dtype)


sum_to_like = defop("sum_to_like", num_inputs=2, pattern=REDUCE, infer=_sum_to_like_infer,
                    doc="Sum g over the axes along which x was broadcast to g's shape.")


@sum_to_like.kernel
def _(xp, g, x, out=None):
    shape = x.shape
    if g.shape == shape:
        if out is None:
            return g
        out[...] = g
        return out
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, d in enumerate(shape) if d == 1 and g.shape[i + lead] != 1)
    r = xp.sum(g, axis=axes, keepdims=True) if axes else g
    r = r.reshape(shape)
    if out is None:
        return r
    out[...] = r
    return out


@sum_to_like.grad
def _(node, gg):
    return [shp.broadcast_like(gg, node.inputs[0]), None]
