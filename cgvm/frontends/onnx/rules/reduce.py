"""Reductions: ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare, ArgMax/ArgMin (axes an
attribute before opset 13/18 and an input after)."""
from __future__ import annotations

import numpy as np

from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R
from cgvm.ops import shape as shp

from ..translate import rule
from .common import axes_of, axis_of, const, ints

# op -> the opset from which axes are an input
_AXES_INPUT_SINCE = {"ReduceSum": 13}


def _axes(n, x):
    if n.opset >= _AXES_INPUT_SINCE.get(n.op_type, 18):
        axes = n.need_static(1, "axes") if n.has_input(1) else None
        if axes is not None and np.asarray(axes).size == 0:
            axes = None
    else:
        axes = n.attr("axes")
    if axes is None:
        if n.attr("noop_with_empty_axes", 0):
            return None
        return tuple(range(x.ndim))
    return axes_of(ints(axes), x.ndim)


def _reduction(body):
    def apply(n):
        x = n.input(0)
        axes = _axes(n, x)
        keep = bool(n.attr("keepdims", 1))
        if axes is None:
            return body(x, None, keep, identity=True)
        if not axes:
            return shp.contiguous(x)
        if None not in x.shape and any(x.shape[a] == 0 for a in axes):
            return _empty_reduction(n, x, axes, keep)
        y = body(x, axes, keep, identity=False)
        return y if y.dtype == x.dtype else E.cast(y, dtype=x.dtype)
    return apply


_IDENTITY = {"ReduceSum": 0, "ReduceMean": np.nan, "ReduceProd": 1, "ReduceL1": 0, "ReduceL2": 0,
             "ReduceSumSquare": 0, "ReduceLogSum": -np.inf, "ReduceLogSumExp": -np.inf}


def _empty_reduction(n, x, axes, keep):
    """A reduction over an empty axis: the op's identity (max: the dtype's lowest, min: its highest)."""
    dt = x.dtype.np
    if n.op_type in ("ReduceMax", "ReduceMin"):
        info = np.finfo(dt) if dt.kind == "f" else (np.iinfo(dt) if dt.kind in "iu" else None)
        big = True if info is None else (np.inf if dt.kind == "f" else info.max)
        small = False if info is None else (-np.inf if dt.kind == "f" else info.min)
        value = small if n.op_type == "ReduceMax" else big
    else:
        value = _IDENTITY[n.op_type]
    shape = tuple(1 if k in axes else d for k, d in enumerate(x.shape) if keep or k not in axes)
    return np.full(shape, value, dtype=dt)


def _plain(fn, finish=None, prepare=None):
    def body(x, axes, keep, identity):
        v = prepare(x) if prepare else x
        if identity:
            return finish(v) if finish else (v if v is not x else shp.contiguous(x))
        y = fn(v, axis=axes, keepdims=keep)
        return finish(y) if finish else y
    return body


rule("ReduceSum")(_reduction(_plain(R.sum)))
rule("ReduceMean")(_reduction(_plain(R.mean)))
rule("ReduceMax")(_reduction(_plain(R.max)))
rule("ReduceMin")(_reduction(_plain(R.min)))
rule("ReduceProd")(_reduction(_plain(R.prod)))
rule("ReduceL1")(_reduction(_plain(R.sum, prepare=E.abs)))
rule("ReduceL2")(_reduction(_plain(R.sum, prepare=E.square, finish=E.sqrt)))
rule("ReduceSumSquare")(_reduction(_plain(R.sum, prepare=E.square)))
rule("ReduceLogSum")(_reduction(_plain(R.sum, finish=E.log)))
rule("ReduceLogSumExp")(_reduction(_plain(R.logsumexp, finish=None, prepare=None)))


def _arg(fn):
    def apply(n):
        x = n.input(0)
        axis = axis_of(n.attr("axis", 0), x.ndim)
        keep = bool(n.attr("keepdims", 1))
        if n.attr("select_last_index", 0):
            from cgvm.ops import indexing as I

            d = n.shape(0)[axis]
            flipped = I.slice(x, starts=(None,), stops=(None,), steps=(-1,), axes=(axis,))
            idx = fn(flipped, axis=axis, keepdims=keep)
            return E.sub(const(d - 1, idx), idx)
        return fn(x, axis=axis, keepdims=keep)
    return apply


rule("ArgMax")(_arg(R.argmax))
rule("ArgMin")(_arg(R.argmin))
