"""Indexing ONNX ops: Slice, Gather(Elements/ND), ScatterElements/ND (with reductions), TensorScatter,
Pad, OneHot, Compress, TopK, CumSum, NonZero, Unique; static positions become cgvm attributes,
run-time indices stay tensors."""
from __future__ import annotations

import numpy as np

from cgvm.ir.graph import const_value
from cgvm.ops import elementwise as E
from cgvm.ops import indexing as I
from cgvm.ops import join as J
from cgvm.ops import reduce as R
from cgvm.ops import selection as SEL
from cgvm.ops import shape as shp
from cgvm.ops import sorting as S

from ..translate import rule
from .common import axis_of, const, ints


def _onnx_slice(dim: int, start: int, end: int, step: int):
    """ONNX's clamping of (start, end) on an axis of length ``dim``, as a Python slice."""
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
        return start, end
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return start, (None if end < 0 else end)


@rule("Slice")
def _slice(n):
    x = n.input(0)
    if n.opset < 10:
        starts, ends, axes, steps = n.attr("starts"), n.attr("ends"), n.attr("axes"), None
    else:
        starts, ends = n.need_static(1, "starts"), n.need_static(2, "ends")
        axes = n.need_static(3, "axes") if n.has_input(3) else None
        steps = n.need_static(4, "steps") if n.has_input(4) else None
    starts, ends = ints(starts), ints(ends)
    axes = ints(axes) if axes is not None else list(range(len(starts)))
    steps = ints(steps) if steps is not None else [1] * len(starts)
    shape = n.shape(0)
    a_out, s_out, e_out, st_out = [], [], [], []
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = axis_of(a, x.ndim)
        s2, e2 = _onnx_slice(shape[a], s, e, st)
        a_out.append(a), s_out.append(s2), e_out.append(e2), st_out.append(st)
    return I.slice(x, starts=tuple(s_out), stops=tuple(e_out), steps=tuple(st_out), axes=tuple(a_out))


def _nonneg(idx, dim):
    """Negative indices counted from the end (ONNX allows them; take would wrap them too, but
    take_along_axis and scatters need them explicit)."""
    static = idx.data if idx.kind == "const" else None
    if static is not None:
        return const_value(np.where(static < 0, static + dim, static).astype(static.dtype))
    return E.where(E.lt(idx, const(0, idx)), E.add(idx, const(dim, idx)), idx)


@rule("Gather")
def _gather(n):
    x, idx = n.input(0), n.input(1)
    axis = axis_of(n.attr("axis", 0), x.ndim)
    return I.take(x, _nonneg(idx, n.shape(0)[axis]), axis=axis)


@rule("GatherElements")
def _gather_elements(n):
    x, idx = n.input(0), n.input(1)
    axis = axis_of(n.attr("axis", 0), x.ndim)
    return S.take_along_axis(x, _nonneg(idx, n.shape(0)[axis]), axis=axis)


@rule("GatherND")
def _gather_nd(n):
    x, idx = n.input(0), n.input(1)
    b = n.attr("batch_dims", 0)
    xs, ishape = n.shape(0), n.shape(1)
    k = ishape[-1]
    # the batch axes index themselves: aranges shaped to broadcast against the index tuples
    batch = [const_value(np.arange(ishape[a], dtype=np.int64).reshape(
        (1,) * a + (ishape[a],) + (1,) * (len(ishape) - 2 - a))) for a in range(b)]
    parts = batch + [_nonneg(shp.squeeze(I.slice(idx, starts=(j,), stops=(j + 1,), steps=(1,), axes=(idx.ndim - 1,)),
                                 axis=(idx.ndim - 1,)), xs[b + j]) for j in range(k)]
    return I.advanced_index(x, *parts)


@rule("Pad")
def _pad(n):
    x = n.input(0)
    mode = n.attr("mode", "constant")
    if n.opset < 11:
        pads, value = ints(n.attr("pads") or n.attr("paddings")), float(n.attr("value", 0.0))
        axes = None
    else:
        pads = ints(n.need_static(1, "pads"))
        cv = n.static(2) if n.has_input(2) else None
        if n.has_input(2) and cv is None:
            raise n.error("constant_value must be known when the model is translated")
        value = float(np.asarray(cv).reshape(-1)[0]) if cv is not None and np.asarray(cv).size else 0.0
        axes = ints(n.need_static(3, "axes")) if n.has_input(3) else None
    nd = x.ndim
    axes = [axis_of(a, nd) for a in axes] if axes is not None else list(range(nd))
    k = len(axes)
    before, after = [0] * nd, [0] * nd
    for j, a in enumerate(axes):
        before[a], after[a] = pads[j], pads[j + k]
    # negative pads crop
    if any(p < 0 for p in before + after):
        shape = n.shape(0)
        x = I.slice(x, starts=tuple(max(-b, 0) for b in before),
                    stops=tuple(d - max(-a, 0) for d, a in zip(shape, after)), steps=(1,) * nd,
                    axes=tuple(range(nd)))
        before, after = [max(b, 0) for b in before], [max(a, 0) for a in after]
    flat = []
    for b, a in zip(before, after):
        flat += [b, a]
    if not any(flat):
        return shp.contiguous(x)
    return I.pad(x, pads=tuple(flat), mode={"constant": "constant", "reflect": "reflect", "edge": "edge",
                                            "wrap": "wrap"}[mode], value=value)


@rule("OneHot")
def _one_hot(n):
    idx, values = n.input(0), n.input(2)
    depth = int(np.asarray(n.need_static(1, "depth")).reshape(-1)[0])
    axis = n.attr("axis", -1)
    pos = E.where(E.lt(idx, const(0, idx)), E.add(idx, const(depth, idx)), idx)
    hot = E.eq(shp.expand_dims(pos, axis=(idx.ndim,)), const_value(np.arange(depth, dtype=idx.dtype.np)))
    off = I.take(values, const_value(np.int64(0)), axis=0)
    on = I.take(values, const_value(np.int64(1)), axis=0)
    y = E.where(hot, on, off)
    ax = axis_of(axis, idx.ndim + 1)
    if ax != idx.ndim:
        perm = list(range(idx.ndim))
        perm.insert(ax, idx.ndim)
        y = shp.transpose(y, perm=tuple(perm))
    return y


@rule("Compress")
def _compress(n):
    x = n.input(0)
    cond = np.asarray(n.need_static(1, "condition")).astype(bool).reshape(-1)
    axis = n.attr("axis", None)
    if axis is None:
        x = shp.reshape(x, shape=(-1,))
        axis = 0
    axis = axis_of(axis, x.ndim)
    keep = np.nonzero(cond[: x.shape[axis]])[0].astype(np.int64)
    return I.take(x, const_value(keep), axis=axis)


@rule("TopK")
def _topk(n):
    x = n.input(0)
    k = int(np.asarray(n.need_static(1, "K") if n.opset >= 10 else n.attr("k")).reshape(-1)[0])
    axis = axis_of(n.attr("axis", -1), x.ndim)
    largest = n.attr("largest", 1)
    # descending order as an ascending sort of a key; ~x reverses integer order exactly (no overflow)
    key = (E.neg(x) if x.dtype.is_float else E.invert(x)) if largest else x
    order = S.argsort(key, axis=axis)   # stable: equal values keep the lower index first
    idx = I.slice(order, starts=(0,), stops=(k,), steps=(1,), axes=(axis,))
    return [S.take_along_axis(x, idx, axis=axis), idx]


@rule("CumSum")
def _cumsum(n):
    x = n.input(0)
    axis = axis_of(int(np.asarray(n.need_static(1, "axis")).reshape(-1)[0]), x.ndim)
    reverse, exclusive = bool(n.attr("reverse", 0)), bool(n.attr("exclusive", 0))
    y = R.cumsum(x, axis=axis, reverse=reverse)
    if y.dtype != x.dtype:
        y = E.cast(y, dtype=x.dtype)
    return E.sub(y, x) if exclusive else y


@rule("ScatterElements", "Scatter")
def _scatter_elements(n):
    x, upd = n.input(0), n.input(2)
    axis = axis_of(n.attr("axis", 0), x.ndim)
    reduction = n.attr("reduction", "none")
    dim = n.shape(0)[axis]
    if reduction != "none":
        return S.scatter_reduce(x, _nonneg(n.input(1), dim), upd, axis=axis, reduction=reduction)
    pos = np.asarray(n.need_static(1, "indices"))
    pos = np.where(pos < 0, pos + dim, pos)
    # positions known: scatter as a gather over a combined tensor [x, updates] (differentiable in both)
    full_idx = np.indices(pos.shape)
    flat_target = np.ravel_multi_index(tuple(pos if a == axis else full_idx[a] for a in range(x.ndim)), n.shape(0))
    size = int(np.prod(n.shape(0)))
    src = np.arange(size, dtype=np.int64)
    src[flat_target.reshape(-1)] = size + np.arange(pos.size)
    both = J.concat(shp.reshape(x, shape=(-1,)), shp.reshape(upd, shape=(-1,)), axis=0)
    return shp.reshape(I.take(both, const_value(src), axis=0), shape=n.shape(0))


@rule("ScatterND")
def _scatter_nd(n):
    x, upd = n.input(0), n.input(2)
    pos = np.asarray(n.need_static(1, "indices"))
    shape = n.shape(0)
    size = int(np.prod(shape))
    ids = np.arange(size, dtype=np.int64).reshape(shape)
    k = pos.shape[-1]
    targets = ids[tuple(pos[..., j] for j in range(k))]       # (*pos.shape[:-1], *shape[k:])
    reduction = n.attr("reduction", "none")
    if reduction != "none":   # every update combined into its flat position
        flat = S.scatter_reduce(shp.reshape(x, shape=(-1,)), const_value(targets.reshape(-1).astype(np.int64)),
                                shp.reshape(upd, shape=(-1,)), axis=0, reduction=reduction)
        return shp.reshape(flat, shape=shape)
    src = np.arange(size, dtype=np.int64)
    src[targets.reshape(-1)] = size + np.arange(targets.size)
    both = J.concat(shp.reshape(x, shape=(-1,)), shp.reshape(upd, shape=(-1,)), axis=0)
    return shp.reshape(I.take(both, const_value(src), axis=0), shape=shape)


@rule("CumProd")
def _cumprod(n):
    from cgvm.ops import tensor_math as TM

    x = n.input(0)
    axis = axis_of(int(np.asarray(n.need_static(1, "axis")).reshape(-1)[0]), x.ndim)
    reverse, exclusive = bool(n.attr("reverse", 0)), bool(n.attr("exclusive", 0))
    y = TM.cumprod(x, axis=axis, reverse=reverse)
    if not exclusive:
        return y
    d = n.shape(0)[axis]
    ones = shp.ones_like(I.slice(x, starts=(0,), stops=(1,), steps=(1,), axes=(axis,)))
    if d <= 1:
        return shp.ones_like(x)
    if reverse:
        return J.concat(I.slice(y, starts=(1,), stops=(d,), steps=(1,), axes=(axis,)), ones, axis=axis)
    return J.concat(ones, I.slice(y, starts=(0,), stops=(d - 1,), steps=(1,), axes=(axis,)), axis=axis)


@rule("Einsum")
def _einsum(n):
    from cgvm.ops import tensor_math as TM

    return TM.einsum(*[v for v in n.inputs if v is not None], equation=n.attr("equation"))


@rule("Det")
def _det(n):
    from cgvm.ops import tensor_math as TM

    return TM.det(n.input(0))


@rule("ReverseSequence")
def _reverse_sequence(n):
    x = n.input(0)
    lens = np.asarray(n.need_static(1, "sequence_lens")).astype(np.int64)
    t_ax, b_ax = n.attr("time_axis", 0), n.attr("batch_axis", 1)
    shape = n.shape(0)
    T, B = shape[t_ax], shape[b_ax]
    # positions along the time axis, per batch entry: the first lens[b] reversed, the rest kept
    pos = np.tile(np.arange(T)[:, None], (1, B))
    for b in range(B):
        L = int(lens[b])
        pos[:L, b] = np.arange(L)[::-1]
    idx_shape = [1] * len(shape)
    idx_shape[t_ax], idx_shape[b_ax] = T, B
    order = pos if t_ax < b_ax else pos.T
    idx = np.broadcast_to(order.reshape(idx_shape), shape).astype(np.int64)
    return S.take_along_axis(x, const_value(np.ascontiguousarray(idx)), axis=t_ax)


@rule("TensorScatter")
def _tensor_scatter(n):
    cache, upd = n.input(0), n.input(1)
    shape, ushape = n.shape(0), n.shape(1)
    nd = len(shape)
    axis = axis_of(n.attr("axis", -2), nd)
    if axis == 0:
        raise n.error("axis 0 is the batch axis; the sequence axis must come after it")
    if any(a != b for k, (a, b) in enumerate(zip(shape, ushape)) if k != axis) or ushape[axis] > shape[axis]:
        raise n.error(f"update of shape {ushape} does not fit the cache of shape {shape} along axis {axis}")
    # the sequence positions written: write_indices[batch] + 0..len-1 (wrapped around in circular mode)
    steps = const_value(np.arange(ushape[axis], dtype=np.int64).reshape(
        tuple(ushape[axis] if k == axis else 1 for k in range(nd))))
    if n.has_input(2):
        start = shp.reshape(E.cast(n.input(2), dtype=np.int64) if n.input(2).dtype.np != np.int64 else n.input(2),
                            shape=(shape[0],) + (1,) * (nd - 1))
        pos = E.add(start, steps)
    else:
        pos = steps
    if n.attr("mode", "linear") == "circular":
        pos = E.mod(pos, const(shape[axis], pos))
    index = [pos if k == axis else const_value(np.arange(ushape[k], dtype=np.int64).reshape(
        tuple(ushape[k] if j == k else 1 for j in range(nd)))) for k in range(nd)]
    return I.advanced_set(cache, upd, *index)


@rule("NonZero")
def _nonzero(n):
    return SEL.nonzero(n.input(0))


@rule("Unique")
def _unique(n):
    x = n.input(0)
    axis = n.attr("axis", None)
    return list(SEL.unique(x, axis=None if axis is None else axis_of(axis, x.ndim), sorted=bool(n.attr("sorted", 1))))
