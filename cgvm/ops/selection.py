"""Selection ops: keep the rows (axis-0 items) of a tensor that a selector marks, and the adjoint.

    filter_rows(x, selector)          -> x[selector != 0]          shape (None, *x.shape[1:])
    unfilter_rows(g, selector, like)  -> zeros like ``like`` with g written back at the kept rows

    nonzero(x)                        -> the coordinates of x's nonzero entries, (rank, None) int64
    unique(x, axis, sorted)           -> (values, first indices, inverse indices, counts)

``filter_rows`` is Caffe's Filter layer: how many rows survive depends on the selector's values,
so the leading dimension of its output is unknown until run time (and its kernel cannot write
into a planned buffer). The selector is a vector of N numbers (any dtype; only "nonzero" matters)
and carries no gradient. ``nonzero`` and ``unique`` (ONNX's NonZero and Unique) are the same kind
of op: the output types carry ``None`` where the size depends on values, the kernels return arrays
of the actual size (``writes_out=False``), and the memory planner leaves those values, and what is
computed from them, to allocate when they are made.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..backend import host_array
from ..errors import ShapeError
from ..ir.attrs import Bool, Int
from ..ir.types import TensorType, int64
from .registry import OPAQUE, defop
from .rules import normalize_axis, prod_dims


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


def _nonzero_infer(types):
    x = types[0]
    if x.ndim == 0:
        raise ShapeError("nonzero: needs a tensor with at least one axis, got a scalar")
    return TensorType((x.ndim, None), int64)


nonzero = defop("nonzero", pattern=OPAQUE, differentiable=False, writes_out=False, infer=_nonzero_infer,
                doc="The coordinates of x's nonzero entries in row-major order: int64 of shape (rank, count).")


@nonzero.kernel
def _(xp, x, out=None):
    return xp.stack(xp.nonzero(x)).astype(xp.int64, copy=False).reshape(x.ndim, -1)


def _unique_infer(types, axis, sorted):
    x = types[0]
    if axis is None:
        return [TensorType((None,), x.dtype), TensorType((None,), int64),
                TensorType((prod_dims(x.shape),), int64), TensorType((None,), int64)]
    a = normalize_axis(axis, x.ndim)
    values = tuple(None if k == a else d for k, d in enumerate(x.shape))
    return [TensorType(values, x.dtype), TensorType((None,), int64), TensorType((x.shape[a],), int64),
            TensorType((None,), int64)]


unique = defop("unique", num_outputs=4, pattern=OPAQUE, differentiable=False, writes_out=False,
               attrs={"axis": Int(None), "sorted": Bool(True)}, infer=_unique_infer,
               doc="(distinct values -- elements, or slices along axis --, index of each one's first occurrence, "
                   "index into the values of every input entry, count of each): sorted ascending, or in order "
                   "of first occurrence when sorted is false.")


@unique.kernel
def _(xp, x, *, axis, sorted):
    # on the host (NumPy's unique; CuPy's lacks some of its options): the sizes are needed there anyway
    host = host_array(x)
    values, first, inverse, counts = np.unique(host, return_index=True, return_inverse=True, return_counts=True,
                                               axis=axis)
    first, inverse, counts = (a.astype(np.int64, copy=False).reshape(-1) for a in (first, inverse, counts))
    if not sorted:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.shape[0], dtype=order.dtype)
        values = np.take(values, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    if xp is np:
        return values, first, inverse, counts
    return tuple(xp.asarray(a) for a in (values, first, inverse, counts))
