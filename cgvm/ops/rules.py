"""Shared shape/dtype rules for op declarations (broadcasting, reductions, axes)."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from ..errors import DTypeError, ShapeError
from ..ir.types import TensorType, result_dtype

Dim = Optional[int]


def normalize_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"axis {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim if ndim else 0


def normalize_axes(axis: Optional[Sequence[int]], ndim: int) -> Tuple[int, ...]:
    """``None`` means all axes; duplicates are an error."""
    if axis is None:
        return tuple(range(ndim))
    axes = tuple(sorted(normalize_axis(a, ndim) for a in axis))
    if len(set(axes)) != len(axes):
        raise ShapeError(f"repeated axis in {tuple(axis)}")
    return axes


def broadcast_shapes(*shapes: Sequence[Dim]) -> Tuple[Dim, ...]:
    """NumPy broadcasting where a dimension may be unknown (``None``)."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(ndim):
        dims = [s[len(s) - ndim + i] for s in shapes if len(s) - ndim + i >= 0]
        known = {d for d in dims if d is not None and d != 1}
        if len(known) > 1:
            raise ShapeError("shapes " + " and ".join(_fmt(s) for s in shapes) + " do not broadcast")
        if known:
            out.append(known.pop())
        elif any(d is None for d in dims):
            out.append(None)
        else:
            out.append(1)
    return tuple(out)


def _fmt(shape: Sequence[Dim]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def same_as_input(types: Sequence[TensorType], **_: object) -> TensorType:
    return types[0]


def broadcast_infer(types: Sequence[TensorType], **_: object) -> TensorType:
    return TensorType(broadcast_shapes(*[t.shape for t in types]), result_dtype(*[t.dtype for t in types]))


def require_float(t: TensorType, what: str) -> None:
    if not t.dtype.is_float:
        raise DTypeError(f"{what} must be a float tensor, got {t!r}")


def reduce_shape(shape: Sequence[Dim], axis: Optional[Sequence[int]], keepdims: bool) -> Tuple[Dim, ...]:
    axes = normalize_axes(axis, len(shape))
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def prod_dims(dims: Sequence[Dim]) -> Optional[int]:
    n = 1
    for d in dims:
        if d is None:
            return None
        n *= d
    return n


def assign_out(xp, out, value):
    """A kernel's result: written into the planned buffer ``out``, or handed back as an array."""
    if out is None:
        return xp.asarray(value)
    out[...] = value
    return out


def dims_agree(a: Dim, b: Dim) -> bool:
    """Two dimensions can be equal (either is unknown, or both are the same)."""
    return a is None or b is None or a == b


def axes_over_steps(axis, stepped=None):
    """Axis attributes (an int, a tuple of ints) for the same op over values with a new leading
    axis of loop steps: axes counted from the front move one on, those counted from the end stay;
    None (all axes) has no such form."""
    if axis is None:
        return None
    if isinstance(axis, int):
        return axis + 1 if axis >= 0 else axis
    return tuple(a + 1 if a >= 0 else a for a in axis)


def over_steps_along(attr: str):
    """An ``@op.over_steps`` rule for an op that works along attribute ``attr`` (axes), every input
    stepped: the same op with the axes moved past the step axis."""
    def rule(node, stepped):
        if not all(stepped) or len({v.ndim for v in node.inputs}) != 1:
            return None
        axis = axes_over_steps(node.attrs[attr])
        return None if axis is None else dict(node.attrs, **{attr: axis})
    return rule
