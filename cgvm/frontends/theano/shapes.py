"""Theano's shape manipulation, joining, creation and linear algebra over cgvm ops.

Shapes known when the graph is built are used as constants (``x.shape`` of a fixed-size tensor
folds away); unknown ones become ``shape_of`` nodes, and reshapes or allocations with symbolic
sizes read them at run time (``reshape_dyn``, ``alloc``).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ...ir.graph import CONST
from ...ir.types import result_dtype
from ...ops import creation as cr
from ...ops import elementwise as ew
from ...ops import indexing as ix
from ...ops import linalg as la
from ...ops import join as join_ops
from ...ops import shape as shp
from . import basic as B
from .config import config
from .var import TensorVariable, as_tensor_variable, constant, wrap


def _val(x: Any):
    return as_tensor_variable(x).value


def _static_int(x: Any) -> Optional[int]:
    """``x`` as a Python int if it is known when the graph is built."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    if isinstance(x, TensorVariable) and x.value.kind == CONST and x.value.data.ndim == 0:
        return int(x.value.data)
    return None


def _int_scalar(x: Any) -> TensorVariable:
    v = as_tensor_variable(x) if not isinstance(x, (int, np.integer)) else constant(int(x), dtype="int64")
    if v.ndim != 0 or not v.value.dtype.is_int:
        raise TypeError(f"a dimension must be an integer scalar, got {v.type!r}")
    return v


# --------------------------------------------------------------------------- shape queries

def shape(x: Any) -> TensorVariable:
    """The shape of ``x`` as an int64 vector (a constant when it is known already)."""
    v = _val(x)
    if v.type.is_concrete:
        return constant(np.array(v.shape, dtype=np.int64))
    return wrap(shp.shape_of(v))


def size(x: Any) -> TensorVariable:
    return B.prod(shape(x))


def _dims(x: Any) -> list:
    """Each dimension of ``x``: an int where known, else an int64 scalar variable."""
    v = _val(x)
    s = None
    out = []
    for i, d in enumerate(v.shape):
        if d is not None:
            out.append(d)
        else:
            s = shape(x) if s is None else s
            out.append(s[i])
    return out


# --------------------------------------------------------------------------- reshaping

def reshape(x: Any, newshape: Any, ndim: Optional[int] = None) -> TensorVariable:
    """``x`` reshaped; entries may be ints (-1 inferred) or integer scalar variables."""
    v = _val(x)
    if isinstance(newshape, TensorVariable):
        if newshape.value.kind == CONST:
            newshape = newshape.value.data.tolist()
        else:
            if newshape.ndim != 1 or newshape.value.shape[0] is None and ndim is None:
                raise ValueError("reshape: a symbolic shape vector needs a known length (pass ndim=)")
            target = newshape
            if newshape.value.shape[0] is None:
                target = B.cast(newshape, "int64")
            return wrap(shp.reshape_dyn(v, B.cast(target, "int64").value))
    if isinstance(newshape, (int, np.integer)):
        newshape = (int(newshape),)
    statics = [_static_int(d) for d in newshape]
    if all(s is not None for s in statics):
        if any(s == 0 for s in statics):  # cgvm's reshape reads 0 as "copy"; Theano means an empty axis
            return wrap(shp.reshape_dyn(v, constant(np.array(statics, dtype=np.int64)).value))
        return wrap(shp.reshape(v, shape=tuple(statics)))
    vec = stack([_int_scalar(d) if s is None else constant(s, dtype="int64") for d, s in zip(newshape, statics)])
    return wrap(shp.reshape_dyn(v, B.cast(vec, "int64").value))


def flatten(x: Any, ndim: int = 1, outdim: Optional[int] = None) -> TensorVariable:
    """Keep the first ``ndim - 1`` axes, merge the rest into one."""
    ndim = outdim if outdim is not None else ndim
    v = _val(x)
    if ndim < 1 or ndim > max(v.ndim, 1):
        raise ValueError(f"flatten: ndim must be in [1, {max(v.ndim, 1)}], got {ndim}")
    if v.ndim == 0:
        return wrap(shp.reshape(v, shape=(1,)))
    if ndim == v.ndim:
        return wrap(v)
    return wrap(shp.flatten(v, axis=ndim - 1, end_axis=-1))


def dimshuffle(x: Any, pattern: Sequence[Any]) -> TensorVariable:
    """Theano's dimshuffle: a permutation of axes, 'x' inserting broadcastable ones; missing axes must be length 1."""
    v = _val(x)
    pattern = tuple(pattern)
    kept = [p for p in pattern if p != "x"]
    if len(set(kept)) != len(kept) or any(not isinstance(p, (int, np.integer)) or not 0 <= p < v.ndim
                                          for p in kept):
        raise ValueError(f"dimshuffle: invalid pattern {pattern} for a tensor of rank {v.ndim}")
    dropped = [i for i in range(v.ndim) if i not in kept]
    for i in dropped:
        if v.shape[i] != 1:  # Theano refuses when the graph is built, even for a length known only later
            length = "unknown length" if v.shape[i] is None else f"length {v.shape[i]}"
            raise ValueError(f"dimshuffle{pattern}: you cannot drop a non-broadcastable dimension (axis {i}, "
                             f"{length}); only broadcastable axes may be dropped: use T.addbroadcast(x, {i}) "
                             "or a row/col type to mark it")
    out = v
    if dropped:
        out = shp.squeeze(out, axis=tuple(dropped))
        remap = {a: k for k, a in enumerate(i for i in range(v.ndim) if i not in dropped)}
        kept = [remap[p] for p in kept]
    if kept != sorted(kept):
        out = shp.transpose(out, perm=tuple(kept))
    new_axes = tuple(i for i, p in enumerate(pattern) if p == "x")
    if new_axes:
        out = shp.expand_dims(out, axis=new_axes)
    return wrap(out)


def transpose(x: Any, axes: Optional[Sequence[int]] = None) -> TensorVariable:
    v = _val(x)
    if v.ndim < 2 and axes is None:
        return wrap(v)
    return wrap(shp.transpose(v, perm=None if axes is None else tuple(axes)))


def swapaxes(x: Any, a: int, b: int) -> TensorVariable:
    v = _val(x)
    perm = list(range(v.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


def squeeze(x: Any, axis: Any = None) -> TensorVariable:
    """Drop the broadcastable (length-1) axes, or the given ones."""
    v = _val(x)
    if axis is None:
        axes = tuple(i for i, d in enumerate(v.shape) if d == 1)
    else:
        axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    return wrap(shp.squeeze(v, axis=axes)) if axes else wrap(v)


def shape_padleft(x: Any, n_ones: int = 1) -> TensorVariable:
    return wrap(shp.expand_dims(_val(x), axis=tuple(range(n_ones)))) if n_ones else as_tensor_variable(x)


def shape_padright(x: Any, n_ones: int = 1) -> TensorVariable:
    v = _val(x)
    return wrap(shp.expand_dims(v, axis=tuple(range(v.ndim, v.ndim + n_ones)))) if n_ones else wrap(v)


def shape_padaxis(x: Any, axis: int) -> TensorVariable:
    return wrap(shp.expand_dims(_val(x), axis=(axis,)))


def addbroadcast(x: Any, *axes: int) -> TensorVariable:
    """Mark ``axes`` as broadcastable (length 1; checked at run time)."""
    v = _val(x)
    axes = tuple(a % v.ndim for a in axes if v.shape[a % v.ndim] != 1)
    if not axes:
        return wrap(v)
    return wrap(shp.expand_dims(shp.squeeze(v, axis=axes), axis=axes))


def unbroadcast(x: Any, *axes: int) -> TensorVariable:
    """Theano's unbroadcast: cgvm broadcasts any length-1 axis at run time, so this is the identity."""
    return as_tensor_variable(x)


def patternbroadcast(x: Any, broadcastable: Sequence[bool]) -> TensorVariable:
    return addbroadcast(x, *[i for i, b in enumerate(broadcastable) if b])


def specify_shape(x: Any, shape: Any) -> TensorVariable:
    return as_tensor_variable(x)


# --------------------------------------------------------------------------- joining

def _upcast_all(tensors: Sequence[Any]) -> list:
    vals = [_val(t) for t in tensors]
    dt = result_dtype(*[v.dtype for v in vals])
    return [v if v.dtype is dt else ew.cast(v, dtype=dt) for v in vals]


def concatenate(tensor_list: Sequence[Any], axis: int = 0) -> TensorVariable:
    if not tensor_list:
        raise ValueError("concatenate needs at least one tensor")
    return wrap(join_ops.concat(*_upcast_all(tensor_list), axis=axis))


def join(axis: int, *tensors: Any) -> TensorVariable:
    return concatenate(tensors, axis)


def stack(*tensors: Any, axis: int = 0) -> TensorVariable:
    """``stack([a, b], axis=0)`` or Theano's older ``stack(a, b)``."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    elif len(tensors) == 2 and isinstance(tensors[0], (list, tuple)) and isinstance(tensors[1], int):
        tensors, axis = tuple(tensors[0]), tensors[1]
    return wrap(join_ops.stack(*_upcast_all(tensors), axis=axis))


def horizontal_stack(*tensors: Any) -> TensorVariable:
    return concatenate(tensors, axis=1)


def vertical_stack(*tensors: Any) -> TensorVariable:
    return concatenate(tensors, axis=0)


def split(x: Any, splits_size: Sequence[int], n_splits: int, axis: int = 0) -> list:
    sizes = splits_size.value.data.tolist() if isinstance(splits_size, TensorVariable) else list(splits_size)
    if len(sizes) != n_splits:
        raise ValueError(f"split: {len(sizes)} sizes for n_splits={n_splits}")
    parts = join_ops.split(_val(x), axis=axis, sizes=tuple(int(s) for s in sizes))
    return [wrap(p) for p in (parts if isinstance(parts, tuple) else (parts,))]


def tile(x: Any, reps: Sequence[int], ndim: Optional[int] = None) -> TensorVariable:
    return wrap(join_ops.tile(_val(x), reps=tuple(int(r) for r in reps)))


def repeat(x: Any, repeats: int, axis: Optional[int] = None) -> TensorVariable:
    """Each element repeated ``repeats`` times along ``axis`` (flattened first when None)."""
    r = _static_int(repeats)
    if r is None:
        raise TypeError("repeat: repeats must be an int known when the graph is built")
    v = _val(x)
    if axis is None:
        v, axis = _val(flatten(x)), 0
    axis %= v.ndim
    dims = _dims(v)
    expanded = shp.expand_dims(v, axis=(axis + 1,))
    target = dims[:axis + 1] + [r] + dims[axis + 1:]
    tiled = alloc(wrap(expanded), *target)
    merged = dims[:axis] + [dims[axis] * r if isinstance(dims[axis], int) else dims[axis] * r] + dims[axis + 1:]
    return reshape(tiled, merged)


# --------------------------------------------------------------------------- creation

def _dtype(dtype: Any) -> str:
    return config.floatX if dtype in (None, "floatX") else np.dtype(dtype).name


def zeros_like(x: Any, dtype: Any = None) -> TensorVariable:
    return wrap(shp.zeros_like(_val(x), dtype=dtype))


def ones_like(x: Any, dtype: Any = None) -> TensorVariable:
    return wrap(shp.ones_like(_val(x), dtype=dtype))


def alloc(value: Any, *shape: Any) -> TensorVariable:
    """``value`` broadcast to ``shape`` (ints or integer scalar variables)."""
    v = _val(value)
    dims = [int(s) if _static_int(s) is not None and not isinstance(s, TensorVariable) else
            (_static_int(s) if _static_int(s) is not None else _int_scalar(s).value) for s in shape]
    return wrap(cr.alloc(v, *dims))


def _shape_args(shape: Any) -> list:
    if isinstance(shape, TensorVariable):
        if shape.value.kind == CONST:
            return shape.value.data.tolist()
        n = shape.value.shape[0]
        if n is None:
            raise ValueError("zeros/ones: a symbolic shape vector needs a known length")
        return [shape[i] for i in range(n)]
    if isinstance(shape, (int, np.integer)):
        return [int(shape)]
    return list(shape)


def zeros(shape: Any, dtype: Any = None) -> TensorVariable:
    return alloc(constant(0, dtype=_dtype(dtype)), *_shape_args(shape))


def ones(shape: Any, dtype: Any = None) -> TensorVariable:
    return alloc(constant(1, dtype=_dtype(dtype)), *_shape_args(shape))


def fill(model: Any, value: Any) -> TensorVariable:
    """``value`` broadcast to the shape of ``model``."""
    m = _val(model)
    v = _val(value) if isinstance(value, TensorVariable) else B._like(value, m)
    return wrap(ew.add(shp.broadcast_like(v, m), shp.zeros_like(m, dtype=v.dtype)))


second = fill


def eye(n: Any, m: Any = None, k: int = 0, dtype: Any = None) -> TensorVariable:
    ns, ms = _static_int(n), _static_int(m) if m is not None else None
    if ns is not None and (m is None or ms is not None):
        return wrap(cr.eye(n=ns, m=ms, k=int(k), dtype=_dtype(dtype)))
    rows = arange(n)
    cols = arange(n if m is None else m)
    return B.cast(B.eq(rows.dimshuffle(0, "x") + k, cols.dimshuffle("x", 0)), _dtype(dtype))


def identity_like(x: Any, dtype: Any = None) -> TensorVariable:
    dims = _dims(x)
    return eye(dims[0], dims[1], dtype=dtype if dtype is not None else as_tensor_variable(x).dtype)


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None) -> TensorVariable:
    """Evenly spaced values; int arguments give int64 (Theano's rule); bounds may be symbolic."""
    if stop is None:
        start, stop = 0, start
    statics = [_static_number(a) for a in (start, stop, step)]
    if all(s is not None for s in statics):
        s0, s1, s2 = statics
        dt = dtype if dtype is not None else ("int64" if all(isinstance(s, int) for s in statics) else config.floatX)
        return wrap(cr.arange(start=s0, stop=s1, step=s2, dtype=np.dtype(dt).name))
    # symbolic bounds: count = ceil((stop - start) / step), values = start + step * (0, 1, ...)
    s0, s1, s2 = (as_tensor_variable(a) if isinstance(a, TensorVariable) else constant(a) for a in (start, stop, step))
    is_int = all(v.value.dtype.is_int for v in (s0, s1, s2))
    span = B.sub(s1, s0)
    if is_int and statics[2] == 1:
        count = span
    elif is_int:
        count = B.int_div(B.add(span, B.sub(s2, B.sgn(s2))), s2)
    else:
        count = B.cast(B.ceil(B.true_div(span, s2)), "int64")
    count = B.maximum(B.cast(count, "int64"), 0)
    ramp = B.sub(cumsum_ones(count), 1)
    out = B.add(B.mul(ramp, s2), s0) if not is_int else B.add(B.mul(ramp, B.cast(s2, "int64")), B.cast(s0, "int64"))
    dt = dtype if dtype is not None else ("int64" if is_int else config.floatX)
    return B.cast(out, dt)


def cumsum_ones(count: TensorVariable) -> TensorVariable:
    """1, 2, ..., count as an int64 vector (``count`` symbolic)."""
    ones_vec = wrap(cr.alloc(constant(1, dtype="int64").value, B.cast(count, "int64").value))
    return B.cumsum(ones_vec, axis=0)


def _static_number(x: Any) -> Any:
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    if isinstance(x, TensorVariable) and x.value.kind == CONST and x.value.data.ndim == 0:
        return x.value.data.item()
    return None


# --------------------------------------------------------------------------- linear algebra

def dot(a: Any, b: Any) -> TensorVariable:
    """Theano's dot: matrix/vector products; scalars multiply; higher ranks contract a's last with b's second-to-last."""
    av, bv = _val(a), _val(b)
    if av.ndim == 0 or bv.ndim == 0:
        return B.mul(wrap(av), wrap(bv))
    if av.ndim <= 2 and bv.ndim <= 2:
        return wrap(la.matmul(*_upcast_all([av, bv])))
    return tensordot(wrap(av), wrap(bv), axes=[[av.ndim - 1], [max(bv.ndim - 2, 0)]])


def tensordot(a: Any, b: Any, axes: Any = 2) -> TensorVariable:
    if not isinstance(axes, (int, np.integer)):
        axes = tuple(tuple(int(i) for i in (ax if isinstance(ax, (list, tuple)) else [ax])) for ax in axes)
    return wrap(la.tensordot(*_upcast_all([a, b]), axes=axes))


def batched_dot(a: Any, b: Any) -> TensorVariable:
    """Products of matching entries along axis 0."""
    av, bv = _upcast_all([a, b])
    if av.ndim == 2 and bv.ndim == 2:
        return B.sum(B.mul(wrap(av), wrap(bv)), axis=1)
    if bv.ndim == 2:
        return wrap(shp.squeeze(la.matmul(av, shp.expand_dims(bv, axis=(2,))), axis=(2,)))
    if av.ndim == 2:
        return wrap(shp.squeeze(la.matmul(shp.expand_dims(av, axis=(1,)), bv), axis=(1,)))
    return wrap(la.matmul(av, bv))


def batched_tensordot(a: Any, b: Any, axes: Any = 2) -> TensorVariable:
    return batched_dot(a, b)


def outer(x: Any, y: Any) -> TensorVariable:
    return B.mul(dimshuffle(flatten(x), (0, "x")), dimshuffle(flatten(y), ("x", 0)))


def trace(x: Any) -> TensorVariable:
    return B.sum(B.mul(x, identity_like(x)))


def diagonal(x: Any, offset: int = 0, axis1: int = 0, axis2: int = 1) -> TensorVariable:
    """The ``offset`` diagonal of a matrix, gathered with index vectors."""
    v = _val(x)
    if v.ndim != 2 or (axis1, axis2) not in ((0, 1), (1, 0)):
        raise ValueError("diagonal: only the diagonals of a matrix are supported")
    if (axis1, axis2) == (1, 0):
        x = transpose(x)
    n0, n1 = _dims(x)
    r0, c0 = max(0, -offset), max(0, offset)
    length = B.maximum(B.minimum(B.sub(n0, r0), B.sub(n1, c0)), 0)
    idx = arange(length)
    return wrap(ix.advanced_index(_val(x), _val(B.add(idx, r0)), _val(B.add(idx, c0))))


def cumprod(x: Any, axis: Optional[int] = None) -> TensorVariable:
    """Running products, from ``cumsum`` in log space with the signs and zeros tracked."""
    v = _val(x)
    if axis is None:
        v, axis = _val(flatten(x)), 0
    xv = wrap(v)
    mag = B.exp(B.cumsum(B.log(B.abs(xv)), axis=axis))
    negs = B.cumsum(B.cast(B.lt(xv, 0), "int64"), axis=axis)
    sign = B.sub(1, B.mul(2, B.mod(negs, 2)))
    return B.cast(B.mul(mag, sign), v.dtype.name if v.dtype.is_float else "float64")
