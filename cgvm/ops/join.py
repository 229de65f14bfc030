"""Joining and cutting along an axis: concat, split (by sizes or like other values), stack, tile.

Each op's gradient is built from the others (concat's is split_like, stack's a split and
squeeze, tile's tile_grad), so higher derivatives work. Dimensions may be unknown (``None``);
they stay unknown where the output depends on them.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from ..errors import ShapeError
from ..ir.attrs import Int, Ints
from ..ir.graph import Value
from ..ir.types import TensorType, result_dtype
from .registry import OPAQUE, defop
from .rules import Dim, normalize_axis
from .shape import squeeze, unify_dim, unify_shapes, zeros_like


def _single_or_tuple(parts: Sequence[Any]) -> Any:
    """Multi-output kernels return a tuple, but a one-output node takes the array itself."""
    return parts[0] if len(parts) == 1 else tuple(parts)


# --------------------------------------------------------------------------- concat / split / stack

def _concat_infer(types, axis):
    if types[0].ndim == 0:
        raise ShapeError("concat: cannot concatenate 0-d tensors (use stack)")
    ax = normalize_axis(axis, types[0].ndim)
    shape = unify_shapes([t.shape for t in types], "concat", skip_axis=ax)
    shape[ax] = _sum_dims([t.shape[ax] for t in types])
    return TensorType(shape, result_dtype(*[t.dtype for t in types]))


def _sum_dims(dims: Sequence[Dim]) -> Dim:
    return None if None in dims else sum(dims)


concat = defop("concat", num_inputs=(1, None), attrs={"axis": Int(0)}, infer=_concat_infer)


@concat.kernel
def _(xp, *xs, axis, out=None):
    return xp.concatenate(xs, axis=axis, out=out)


@concat.grad
def _(node, g):
    parts = split_like(g, *node.inputs, axis=node.attrs["axis"])
    return list(parts) if isinstance(parts, tuple) else [parts]


def _split_like_infer(types, axis):
    g, likes = types[0], types[1:]
    ax = normalize_axis(axis, g.ndim)
    for t in likes:
        if t.ndim != g.ndim:
            raise ShapeError(f"split_like: a part of rank {t.ndim} for a tensor of rank {g.ndim}")
    total = _sum_dims([t.shape[ax] for t in likes])
    unify_dim(g.shape[ax], total, f"split_like: the parts' sizes along axis {axis} do not add up")
    return [TensorType(g.shape[:ax] + (t.shape[ax],) + g.shape[ax + 1:], g.dtype) for t in likes]


split_like = defop("split_like", num_inputs=(2, None), view=True, attrs={"axis": Int(0)},
                   infer=_split_like_infer,
                   doc="Split the first input along axis into parts as long as the other inputs are there.")


def _split_at(x, axis: int, sizes: Sequence[int]) -> Any:
    index = [slice(None)] * x.ndim
    parts, start = [], 0
    for size in sizes:
        index[axis] = slice(start, start + size)
        parts.append(x[tuple(index)])
        start += size
    return _single_or_tuple(parts)


@split_like.kernel
def _(xp, g, *likes, axis):
    return _split_at(g, axis, [t.shape[axis] for t in likes])


def _concat_grads(node, grads: Sequence[Optional[Value]], axis: int) -> Value:
    """Concatenate output gradients along ``axis``; a missing one stands for zeros."""
    parts = [g if g is not None else zeros_like(o) for g, o in zip(grads, node.outputs)]
    return concat(*parts, axis=axis)


@split_like.grad
def _(node, *grads):
    return [_concat_grads(node, grads, node.attrs["axis"])] + [None] * (len(node.inputs) - 1)


def _split_sizes(dim: Dim, sizes: Optional[Sequence[int]], sections: Optional[int]) -> List[Dim]:
    if (sizes is None) == (sections is None):
        raise ValueError("split: give exactly one of sizes= or sections=")
    if sizes is not None:
        if any(s < 0 for s in sizes) or not sizes:
            raise ValueError(f"split: sizes {tuple(sizes)} must be non-negative and non-empty")
        if dim is not None and sum(sizes) != dim:
            raise ShapeError(f"split: sizes {tuple(sizes)} add up to {sum(sizes)}, the axis has {dim}")
        return list(sizes)
    if sections <= 0:
        raise ValueError(f"split: sections must be positive, got {sections}")
    if dim is None:
        return [None] * sections
    if dim % sections:
        raise ShapeError(f"split: an axis of size {dim} does not split into {sections} equal sections")
    return [dim // sections] * sections


def _split_infer(types, axis, sizes, sections):
    t = types[0]
    ax = normalize_axis(axis, t.ndim)
    return [TensorType(t.shape[:ax] + (d,) + t.shape[ax + 1:], t.dtype)
            for d in _split_sizes(t.shape[ax], sizes, sections)]


split = defop("split", view=True, infer=_split_infer,
              num_outputs=lambda attrs, n: len(attrs["sizes"]) if attrs["sizes"] else attrs["sections"],
              attrs={"axis": Int(0), "sizes": Ints(None), "sections": Int(None)},
              doc="Split along axis into parts of the given sizes, or into `sections` equal parts.")


@split.kernel
def _(xp, x, *, axis, sizes, sections):
    ax = axis % x.ndim
    return _split_at(x, ax, _split_sizes(x.shape[ax], sizes, sections))


@split.grad
def _(node, *grads):
    return [_concat_grads(node, grads, node.attrs["axis"])]


def _stack_infer(types, axis):
    shape = unify_shapes([t.shape for t in types], "stack")
    ax = normalize_axis(axis, len(shape) + 1)
    shape.insert(ax, len(types))
    return TensorType(shape, result_dtype(*[t.dtype for t in types]))


stack = defop("stack", num_inputs=(1, None), attrs={"axis": Int(0)}, infer=_stack_infer)


@stack.kernel
def _(xp, *xs, axis, out=None):
    return xp.stack(xs, axis=axis, out=out)


@stack.grad
def _(node, g):
    axis = node.attrs["axis"]
    parts = split(g, axis=axis, sections=len(node.inputs))
    parts = parts if isinstance(parts, tuple) else (parts,)
    return [squeeze(p, axis=axis) for p in parts]


# --------------------------------------------------------------------------- tile

def _tile_layout(shape: Sequence[Dim], reps: Sequence[int]) -> Tuple[Tuple[Dim, ...], Tuple[int, ...]]:
    """NumPy's tile alignment: the shorter of shape and reps is padded with leading ones."""
    n = max(len(shape), len(reps))
    return (1,) * (n - len(shape)) + tuple(shape), (1,) * (n - len(reps)) + tuple(reps)


def _tile_infer(types, reps):
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: negative repetitions {reps}")
    t = types[0]
    shape, full_reps = _tile_layout(t.shape, reps)
    return TensorType(tuple(None if d is None else d * r for d, r in zip(shape, full_reps)), t.dtype)


tile = defop("tile", attrs={"reps": Ints()}, infer=_tile_infer)


@tile.kernel
def _(xp, x, *, reps, out=None):
    r = xp.tile(x, reps)
    if out is None:
        return r
    out[...] = r
    return out


@tile.grad
def _(node, g):
    return [tile_grad(g, node.inputs[0], reps=node.attrs["reps"])]


tile_grad = defop("tile_grad", num_inputs=2, pattern=OPAQUE, attrs={"reps": Ints()},
                  infer=lambda types, reps: TensorType(types[1].shape, types[0].dtype),
                  doc="Sum the tiles of g back onto the shape of x (the adjoint of tile).")


@tile_grad.kernel
def _(xp, g, x, *, reps, out=None):
    shape, full_reps = _tile_layout(x.shape, reps)
    interleaved = tuple(v for pair in zip(full_reps, shape) for v in pair)
    summed = g.reshape(interleaved).sum(axis=tuple(range(0, len(interleaved), 2)))
    if out is None:
        return summed.reshape(x.shape)
    out[...] = summed.reshape(x.shape)
    return out


@tile_grad.grad
def _(node, gg):
    return [tile(gg, reps=node.attrs["reps"]), None]
