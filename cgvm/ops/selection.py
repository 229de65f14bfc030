"""Selection ops: keep the rows (axis-0 items) of a tensor that a selector marks, and the adjoint.

    filter_rows(x, selector)          -> x[selector != 0]          shape (None, *x.shape[1:])
    unfilter_rows(g, selector, like)  -> zeros like ``like`` with g written back at the kept rows

``filter_rows`` is Caffe's Filter layer: how many rows survive depends on the selector's values,
so the leading dimension of its output is unknown until run time (and its kernel cannot write
into a planned buffer). The selector is a vector of N numbers (any dtype; only "nonzero" matters)
and carries no gradient.
"""
from __future__ import annotations

from typing import Any

from ..errors import ShapeError
from ..ir.types import TensorType
from .registry import OPAQUE, defop


def _check_selector(x: TensorType, selector: TensorType, what: str) -> None:
    if selector.ndim != 1:
        raise ShapeError(f"{what}: the selector must be a vector (one entry per row), got {selector!r}")
    if x.ndim < 1:
        raise ShapeError(f"{what}: needs a tensor with at least one axis (the rows), got {x!r}")
    rows, marks = x.shape[0], selector.shape[0]
    if rows is not None and marks is not None and rows != marks:
        raise ShapeError(f"{what}: the selector has {marks} entries but the tensor has {rows} rows")


def _filter_infer(types):
    x, selector = types
    _check_selector(x, selector, "filter_rows")
    return TensorType((None,) + tuple(x.shape[1:]), x.dtype)


filter_rows = defop("filter_rows", num_inputs=2, pattern=OPAQUE, writes_out=False, infer=_filter_infer,
                    doc="The rows of x (axis 0) whose selector entry is nonzero, in order (Caffe's Filter).")


def _kept(xp: Any, selector: Any) -> Any:
    """Indices of the rows to keep (int64, ascending)."""
    return xp.nonzero(selector != 0)[0]


@filter_rows.kernel
def _(xp, x, selector, out=None):
    return xp.take(x, _kept(xp, selector), axis=0)


@filter_rows.grad
def _(node, g):
    x, selector = node.inputs
    return [unfilter_rows(g, selector, x), None]


def _unfilter_infer(types):
    g, selector, like = types
    _check_selector(like, selector, "unfilter_rows")
    if g.ndim != like.ndim or any(a is not None and b is not None and a != b
                                  for a, b in zip(g.shape[1:], like.shape[1:])):
        raise ShapeError(f"unfilter_rows: rows of {g!r} do not fit rows of {like!r}")
    return TensorType(like.shape, g.dtype)


unfilter_rows = defop("unfilter_rows", num_inputs=3, pattern=OPAQUE, infer=_unfilter_infer,
                      doc="Zeros shaped like `like`, with the rows of g at the rows the selector keeps "
                          "(the adjoint of filter_rows).")


@unfilter_rows.kernel
def _(xp, g, selector, like, out=None):
    if out is None:
        out = xp.zeros(like.shape, dtype=g.dtype)
    else:
        out.fill(0)
    kept = _kept(xp, selector)
    if kept.shape[0] != g.shape[0]:
        raise ValueError(f"unfilter_rows: the selector keeps {kept.shape[0]} rows, the gradient has {g.shape[0]}")
    out[kept] = g
    return out


@unfilter_rows.grad
def _(node, gg):
    _, selector, _ = node.inputs
    return [filter_rows(gg, selector), None, None]
