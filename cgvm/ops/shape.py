"""Shape ops: reshape, transpose, broadcasting, expand/squeeze, concat/split, slicing, indexing, fills."""
from __future__ import annotations

from ..ir.attrs import DTypeAttr, Float, Ints
from ..ir.types import TensorType
from . import reduce as red
from .registry import INJECTIVE, defop
from .rules import broadcast_shapes, normalize_axes


def _expand_infer(types, axis):
    t = types[0]
    ndim = t.ndim + len(axis)
    axes = normalize_axes(axis, ndim)
    dims = iter(t.shape)
    return TensorType(tuple(1 if i in axes else next(dims) for i in range(ndim)), t.dtype)


expand_dims = defop("expand_dims", pattern=INJECTIVE, view=True, attrs={"axis": Ints()}, infer=_expand_infer)


@expand_dims.kernel
def _(xp, x, *, axis):
    return xp.expand_dims(x, axis)


@expand_dims.grad
def _(node, g):
    return [squeeze(g, axis=node.attrs["axis"])]


def _squeeze_infer(types, axis):
    t = types[0]
    axes = normalize_axes(axis, t.ndim) if axis is not None else tuple(i for i, d in enumerate(t.shape) if d == 1)
    for a in axes:
        if t.shape[a] not in (1, None):
            raise ValueError(f"cannot squeeze axis {a} of size {t.shape[a]}")
    return TensorType(tuple(d for i, d in enumerate(t.shape) if i not in axes), t.dtype)


squeeze = defop("squeeze", pattern=INJECTIVE, view=True, attrs={"axis": Ints(None)}, infer=_squeeze_infer)


@squeeze.kernel
def _(xp, x, *, axis):
    return xp.squeeze(x, axis=axis)


@squeeze.grad
def _(node, g):
    return [reshape_like(g, node.inputs[0])]


def _broadcast_like_infer(types):
    x, like = types
    return TensorType(broadcast_shapes(x.shape, like.shape), x.dtype)


broadcast_like = defop("broadcast_like", num_inputs=2, pattern=INJECTIVE, view=True, infer=_broadcast_like_infer,
                       doc="x broadcast to the shape of the second input (only its shape is read).")


@broadcast_like.kernel
def _(xp, x, like):
    return xp.broadcast_to(x, xp.broadcast_shapes(x.shape, like.shape))


@broadcast_like.grad
def _(node, g):
    return [red.sum_to_like(g, node.inputs[0]), None]


reshape_like = defop("reshape_like", num_inputs=2, pattern=INJECTIVE, view=True,
                     infer=lambda types: TensorType(types[1].shape, types[0].dtype),
                     doc="x reshaped to the shape of the second input (only its shape is read).")


@reshape_like.kernel
def _(xp, x, like):
    return x.reshape(like.shape)


@reshape_like.grad
def _(node, g):
    return [reshape_like(g, node.inputs[0]), None]


def _fill_like_infer(types, value=0.0, dtype=None):
    t = types[0]
    return t if dtype is None else t.with_dtype(dtype)


zeros_like = defop("zeros_like", pattern=INJECTIVE, differentiable=False, infer=_fill_like_infer,
                   attrs={"dtype": DTypeAttr(None)})
ones_like = defop("ones_like", pattern=INJECTIVE, differentiable=False, infer=_fill_like_infer,
                  attrs={"dtype": DTypeAttr(None)})
full_like = defop("full_like", pattern=INJECTIVE, differentiable=False, infer=_fill_like_infer,
                  attrs={"value": Float(), "dtype": DTypeAttr(None)})


def _filler(fill):
    def factory(xp, dtype=None, value=None):
        v = fill if value is None else value

        def kernel(x, out=None):
            if out is None:
                return xp.full(x.shape, v, dtype=x.dtype if dtype is None else dtype.np)
            out.fill(v)
            return out
        return kernel
    return factory


zeros_like.kernel_factory(_filler(0))
ones_like.kernel_factory(_filler(1))
full_like.kernel_factory(_filler(None))
