"""Pooling, NCHW with any number of spatial axes: max_pool, avg_pool, their global forms, and gradient ops.

Attributes: ``kernel`` (one value or one per spatial axis), ``stride`` (default: the kernel),
``pad`` (1, n symmetric, or 2·n values ``(begins..., ends...)``; each must be smaller than the
kernel, as Caffe requires), ``ceil_mode`` (False: floor rule).

Output size per axis: ``floor((in + pad_begin + pad_end - k) / stride) + 1``, or with
``ceil_mode`` Caffe's rule: ``ceil(...) + 1``, then ``out -= 1`` if ``(out-1)·stride >= in + pad_begin``
(the last window must start inside the image or its left padding). Caffe applies the clip only
when pad > 0; without padding it only matters when stride > kernel, where Caffe would produce an
empty window, so here it always applies (as PyTorch does).

Max pooling ignores padding (-inf padding); ties go to the first maximum in row-major window
order, as in Caffe. ``return_mask`` adds Caffe's top[1]: the argmax as a flat index into the
(n, c) spatial plane. Average pooling divides by the window clipped to the padded extent
(in + pads), so padding counts but the ceil-mode overhang does not (Caffe, PyTorch's
count_include_pad); ``count_include_pad=False`` divides by the in-image part only.

Kernels loop over the kernel offsets, each one strided slice of the input clipped to the image
(padding is never copied), a chunk of (sample, channel) planes at a time; k x k windows reduce one
axis at a time. Gradients add the same slices back (col2im without scatter). Windows that tile
the input have their own layouts (cgvm.ops.pool_tiled).
"""
from __future__ import annotations

import itertools
import math
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ShapeError
from ..ir.attrs import Bool, Ints
from ..ir.types import TensorType, int64
from . import pool_tiled as tiled
from .conv_geometry import PadPairs, crop_padding, pad_pairs, spatial_values
from .registry import OPAQUE, REDUCE, defop
from .rules import Dim, dims_agree, require_float

# --------------------------------------------------------------------------- geometry


def pool_out_size(n: Dim, k: int, s: int, pads: Tuple[int, int], ceil_mode: bool) -> Dim:
    """Pooling output length on one axis (floor, or Caffe's ceil with the clipped last window)."""
    if n is None:
        return None
    span = n + pads[0] + pads[1] - k
    if span < 0:
        raise ShapeError(f"pooling kernel {k} is larger than the padded input {n}+{pads[0]}+{pads[1]}")
    if not ceil_mode:
        return span // s + 1
    out = -(-span // s) + 1
    if (out - 1) * s >= n + pads[0]:
        out -= 1
    return out


class PoolGeometry:
    """Pooling attributes normalised for a given number of spatial axes."""

    __slots__ = ("nsp", "kernel", "stride", "pads", "ceil_mode")

    def __init__(self, nsp: int, kernel: Sequence[int], stride: Optional[Sequence[int]], pad: Sequence[int],
                 ceil_mode: bool):
        self.nsp = nsp
        self.kernel = spatial_values(kernel, nsp, "kernel")
        self.stride = spatial_values(self.kernel if stride is None else stride, nsp, "stride")
        self.pads: PadPairs = pad_pairs(pad, nsp)
        for k, (b, e) in zip(self.kernel, self.pads):
            if b >= k or e >= k:
                raise ShapeError(f"pad {tuple(pad)} must be smaller than the kernel {self.kernel}")
        self.ceil_mode = ceil_mode

    def out_sizes(self, in_sizes: Sequence[Dim]) -> Tuple[Dim, ...]:
        return tuple(pool_out_size(n, k, s, p, self.ceil_mode)
                     for n, k, s, p in zip(in_sizes, self.kernel, self.stride, self.pads))

    def extent(self, in_sizes: Sequence[int], out_sizes: Sequence[int]) -> Tuple[int, ...]:
        """Padded size covering every window (ceil mode may run past the end padding)."""
        return tuple(max(n + b + e, (o - 1) * s + k)
                     for n, (b, e), o, s, k in zip(in_sizes, self.pads, out_sizes, self.stride, self.kernel))

    def offsets(self) -> List[Tuple[int, ...]]:
        return list(itertools.product(*[range(k) for k in self.kernel]))

    def offset_slices(self, out_sizes: Sequence[int]) -> List[tuple]:
        """For each kernel offset (row-major), the strided slice of the padded input it reads."""
        return [(slice(None), slice(None)) + tuple(slice(k, k + (o - 1) * s + 1, s)
                                                   for k, o, s in zip(kk, out_sizes, self.stride))
                for kk in self.offsets()]

    def clipped_axis(self, d: int, n: int, out: int) -> List[Tuple[slice, slice]]:
        """Along spatial axis d: for each kernel offset, (output slice, input slice) of the outputs
        whose window element at that offset lies inside the unpadded input, and the strided input
        elements they read. Padding is never materialized: a padded element is one no offset
        reads. Offsets that read only padding are left out."""
        k_size, s, b = self.kernel[d], self.stride[d], self.pads[d][0]
        result = []
        for k in range(k_size):
            first = max(0, -(-(b - k) // s))          # o·s + k - b >= 0
            last = min(out - 1, (n - 1 + b - k) // s)  # o·s + k - b <= n - 1
            if last >= first:
                start = first * s + k - b
                result.append((slice(first, last + 1), slice(start, start + (last - first) * s + 1, s)))
        return result

    def divisor(self, in_sizes: Sequence[int], out_sizes: Sequence[int], include_pad: bool) -> np.ndarray:
        """Averaging divisor per output position (spatial shape), as float64 NumPy."""
        total = np.ones((), dtype=np.float64)
        for d, (n, k, s, (b, e), o) in enumerate(zip(in_sizes, self.kernel, self.stride, self.pads, out_sizes)):
            start = np.arange(o) * s - b
            if include_pad:
                count = np.minimum(start + k, n + e) - start
            else:
                count = np.minimum(start + k, n) - np.maximum(start, 0)
            total = np.multiply.outer(total, count)
        return total


def _lowest(dtype: Any) -> Any:
    """The value padding takes in max pooling: it never wins against a real element."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return -np.inf
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return False


def _pad_to(xp: Any, x: Any, geo: PoolGeometry, extent: Sequence[int], fill: Any) -> Any:
    """x placed at the begin padding of a buffer of the given spatial extent, filled with ``fill``."""
    if tuple(x.shape[2:]) == tuple(extent) and not any(b for b, _ in geo.pads):
        return x
    buf = xp.full(tuple(x.shape[:2]) + tuple(extent), fill, dtype=x.dtype)
    buf[(slice(None), slice(None)) + tuple(slice(b, b + n) for n, (b, _) in zip(x.shape[2:], geo.pads))] = x
    return buf


def _store(result: Any, out: Optional[Any]) -> Any:
    if out is None:
        return result
    out[...] = result
    return out


def _window_argmax(xp: Any, x: Any, geo: PoolGeometry) -> Tuple[Any, Any, Tuple[int, ...]]:
    """(max, offset index of the first max in row-major window order, output sizes)."""
    out_sizes = geo.out_sizes(x.shape[2:])
    xpad = _pad_to(xp, x, geo, geo.extent(x.shape[2:], out_sizes), _lowest(x.dtype))
    slices = geo.offset_slices(out_sizes)
    best = xpad[slices[0]].copy()
    index = xp.zeros(best.shape, dtype=xp.intp)
    for i, sl in enumerate(slices[1:], 1):
        cand = xpad[sl]
        better = cand > best  # strict: an equal later value does not take over (Caffe's tie rule)
        xp.copyto(index, i, where=better)
        xp.copyto(best, cand, where=better)
    return best, index, out_sizes


def _scatter_windows(xp: Any, parts: Any, dtype: Any, x_shape: Sequence[int], geo: PoolGeometry,
                     out: Optional[Any]) -> Any:
    """col2im for pooling: ``parts(i)`` is the contribution of offset i; summed into an x-shaped result."""
    in_sizes = tuple(x_shape[2:])
    out_sizes = geo.out_sizes(in_sizes)
    acc = xp.zeros(tuple(x_shape[:2]) + geo.extent(in_sizes, out_sizes), dtype=dtype)
    for i, sl in enumerate(geo.offset_slices(out_sizes)):
        view = acc[sl]
        xp.add(view, parts(i), out=view)
    result = crop_padding(acc, geo.pads, in_sizes)
    return _store(result, out) if out is not None else xp.ascontiguousarray(result)


#: separable pooling works on this many bytes of input planes at a time (its intermediate stays small)
POOL_CHUNK_BYTES = 1 << 20


def _separable_pool(xp: Any, x: Any, geo: PoolGeometry, out_sizes: Tuple[int, ...], target: Any, fill: Any,
                    combine: Any) -> Any:
    """Window max (combine = maximum, fill = lowest) or sum (add, 0) of x into target.

    Windows are clipped to the input, so padding is never copied; planes (sample, channel) go a
    chunk at a time, so intermediates stay cache-sized. A k x k window with k > 2 is reduced one
    spatial axis at a time, 2k passes instead of k² (ResNet's 3x3 stem pool: 73 -> 21 ms); for
    2x2 or 1-D windows all offsets at once is no more work.
    """
    in_sizes = tuple(x.shape[2:])
    if len(in_sizes) == 2 and tiled.tiles(geo, in_sizes):   # floor mode drops an untiled rest
        return tiled.pool_2d(xp, tiled.cropped(xp, x, geo), geo, target, combine)
    planes = x.reshape((-1,) + in_sizes)
    result = target if target.flags.c_contiguous else xp.empty(target.shape, dtype=target.dtype)
    flat_out = result.reshape((-1,) + out_sizes)
    step = max(1, POOL_CHUNK_BYTES // max(1, planes[0].nbytes if planes.shape[0] else 1))
    nsp = len(in_sizes)
    axes = [geo.clipped_axis(d, in_sizes[d], out_sizes[d]) for d in range(nsp)]
    # passes: (spatial axes reduced together, their clipped (output, input) slice pairs)
    if math.prod(geo.kernel) <= sum(geo.kernel):
        passes = [(nsp, [tuple(zip(*combo)) for combo in itertools.product(*axes)])]
    else:
        passes = [(1, [((o,), (i,)) for o, i in axes[d]]) for d in range(nsp)]
    for p0 in range(0, planes.shape[0], step):
        cur, done = planes[p0:p0 + step], 0
        for width, pairs in passes:
            lead = (slice(None),) * (done + 1)
            done += width
            last = done == nsp
            shape = (cur.shape[0],) + out_sizes[:done] + in_sizes[done:]
            nxt = flat_out[p0:p0 + step] if last else xp.empty(shape, dtype=x.dtype)
            nxt.fill(fill)
            for out_sl, in_sl in pairs:
                view = nxt[lead + out_sl]
                combine(view, cur[lead + in_sl], out=view)
            cur = nxt
    if result is not target:
        target[...] = result
    return target


# --------------------------------------------------------------------------- type rules

_POOL_ATTRS = {"kernel": Ints(), "stride": Ints(None), "pad": Ints((0,)), "ceil_mode": Bool(False)}
_AVG_ATTRS = dict(_POOL_ATTRS, count_include_pad=Bool(True))


def _check_input(t: TensorType, what: str) -> None:
    if t.ndim < 3:
        raise ShapeError(f"{what} input must be (N, C, spatial...) with at least one spatial axis, got rank {t.ndim}")
    if t.dtype.is_bool:
        raise ShapeError(f"{what} needs a numeric input, got {t!r}")


def _pooled_type(t: TensorType, geo: PoolGeometry) -> TensorType:
    return TensorType(t.shape[:2] + geo.out_sizes(t.shape[2:]), t.dtype)


def _max_pool_infer(types, kernel, stride, pad, ceil_mode, return_mask):
    x = types[0]
    _check_input(x, "max_pool")
    y = _pooled_type(x, PoolGeometry(x.ndim - 2, kernel, stride, pad, ceil_mode))
    return [y, y.with_dtype(int64)] if return_mask else y


def _avg_pool_infer(types, kernel, stride, pad, ceil_mode, count_include_pad):
    x = types[0]
    _check_input(x, "avg_pool")
    require_float(x, "avg_pool input")
    return _pooled_type(x, PoolGeometry(x.ndim - 2, kernel, stride, pad, ceil_mode))


def _x_shaped(types, **attrs):
    """(x, g[, y]) -> x's shape with g's dtype (the max-pool routing op)."""
    x, g = types[:2]
    _check_input(x, "max_pool_grad")
    if len(types) == 3 and (types[2].dtype is not x.dtype or not dims_agree(types[2].shape, g.shape)):
        raise ShapeError(f"max_pool_grad: the pooled output {types[2]!r} must match x's dtype and g's shape {g!r}")
    PoolGeometry(x.ndim - 2, attrs["kernel"], attrs["stride"], attrs["pad"], attrs["ceil_mode"])
    return x.with_dtype(g.dtype)


def _y_shaped(types, **attrs):
    """(x, v) -> pooled shape of x with v's dtype (the max-pool gather op)."""
    x, v = types
    _check_input(x, "max_pool_select")
    geo = PoolGeometry(x.ndim - 2, attrs["kernel"], attrs["stride"], attrs["pad"], attrs["ceil_mode"])
    return _pooled_type(x, geo).with_dtype(v.dtype)


def _avg_grad_infer(types, **attrs):
    g, x_like = types
    _check_input(x_like, "avg_pool_grad")
    PoolGeometry(x_like.ndim - 2, attrs["kernel"], attrs["stride"], attrs["pad"], attrs["ceil_mode"])
    return x_like.with_dtype(g.dtype)


def _pool_attrs(node) -> dict:
    return {k: node.attrs[k] for k in _POOL_ATTRS}


# --------------------------------------------------------------------------- max pooling

max_pool = defop("max_pool", num_inputs=1, pattern=OPAQUE, attrs=dict(_POOL_ATTRS, return_mask=Bool(False)),
                 num_outputs=lambda attrs, n: 2 if attrs["return_mask"] else 1, infer=_max_pool_infer,
                 doc="Max pooling (Caffe Pooling MAX); with return_mask also the argmax as a flat in-plane index.")


@max_pool.kernel
def _(xp, x, *, kernel, stride, pad, ceil_mode, return_mask, out=None):
    geo = PoolGeometry(x.ndim - 2, kernel, stride, pad, ceil_mode)
    if return_mask:
        best, index, out_sizes = _window_argmax(xp, x, geo)
        return best, _flat_mask(xp, index, x.shape[2:], out_sizes, geo)
    out_sizes = geo.out_sizes(x.shape[2:])
    target = xp.empty(x.shape[:2] + out_sizes, dtype=x.dtype) if out is None else out
    return _separable_pool(xp, x, geo, out_sizes, target, _lowest(x.dtype), xp.maximum)


def _flat_mask(xp: Any, index: Any, in_sizes: Sequence[int], out_sizes: Sequence[int], geo: PoolGeometry) -> Any:
    """Offset indices turned into flat positions h·W + w within the unpadded (n, c) plane."""
    plane_strides = [int(np.prod(in_sizes[d + 1:], dtype=np.int64)) for d in range(len(in_sizes))]
    base = np.zeros((), dtype=np.int64)
    for o, s, (b, _), st in zip(out_sizes, geo.stride, geo.pads, plane_strides):
        base = np.add.outer(base, (np.arange(o) * s - b) * st)
    offset_flat = np.array([sum(k * st for k, st in zip(kk, plane_strides)) for kk in geo.offsets()], dtype=np.int64)
    return xp.asarray(base) + xp.take(xp.asarray(offset_flat), index)


@max_pool.grad
def _(node, g, *_mask_grad):
    # the pooled output rides along: the tiled kernel then need not find the window maxima again
    return [None if g is None else max_pool_grad(node.inputs[0], g, node.outputs[0], **_pool_attrs(node))]


max_pool_grad = defop("max_pool_grad", num_inputs=(2, 3), pattern=OPAQUE, attrs=dict(_POOL_ATTRS), infer=_x_shaped,
                      doc="Gradient of max_pool: (x, g[, y = max_pool(x)]) -> g routed to each window's first "
                          "argmax in x.")


@max_pool_grad.kernel
def _(xp, x, g, y=None, *, kernel, stride, pad, ceil_mode, out=None):
    geo = PoolGeometry(x.ndim - 2, kernel, stride, pad, ceil_mode)
    if x.ndim == 4 and tiled.tiles(geo, x.shape[2:]) and tuple(geo.kernel) == (2, 2):
        return tiled.max_grad_2x2(xp, x, g, y, out)
    if tiled.tiles(geo, x.shape[2:]):
        return tiled.max_grad(xp, x, g, geo, out, y)
    return _chunked_max_grad(xp, x, g, y, geo, out)


def _chunked_max_grad(xp: Any, x: Any, g: Any, y: Optional[Any], geo: PoolGeometry, out: Optional[Any]) -> Any:
    """max_pool_grad for any windows: a chunk of (sample, channel) planes at a time, g goes to each
    window's first maximum, offset by offset in row-major order over windows clipped to the input
    (a hit is an element equal to the window's maximum where no earlier offset hit). Temporaries
    are pooled-size chunks: ResNet-18's stem pooling gradient allocated 94 MiB with whole-batch
    argmax indices and a padded accumulator."""
    in_sizes, out_sizes = tuple(x.shape[2:]), tuple(g.shape[2:])
    planes_x = x.reshape((-1,) + in_sizes)
    planes_g = g.reshape((-1,) + out_sizes)
    target = out if out is not None and out.flags.c_contiguous else xp.empty(x.shape, dtype=g.dtype)
    planes_dx = target.reshape((-1,) + in_sizes)
    axes = [geo.clipped_axis(d, in_sizes[d], out_sizes[d]) for d in range(len(in_sizes))]
    pairs = [tuple(zip(*combo)) for combo in itertools.product(*axes)]     # (output slices, input slices)
    step = max(1, POOL_CHUNK_BYTES // max(1, planes_x[0].nbytes if planes_x.shape[0] else 1))
    lead = (slice(None),)
    for p0 in range(0, planes_x.shape[0], step):
        xc, gc, dc = planes_x[p0:p0 + step], planes_g[p0:p0 + step], planes_dx[p0:p0 + step]
        m = xc.shape[0]
        if y is not None:
            best = y.reshape((-1,) + out_sizes)[p0:p0 + step]
        else:
            best = xp.empty((m,) + out_sizes, dtype=x.dtype)
            _separable_pool(xp, xc.reshape((m, 1) + in_sizes), geo, out_sizes, best.reshape((m, 1) + out_sizes),
                            _lowest(x.dtype), xp.maximum)
        dc[...] = 0
        taken = xp.zeros(best.shape, dtype=bool)
        hit = xp.empty(best.shape, dtype=bool)
        part = xp.empty(best.shape, dtype=g.dtype)
        for out_sl, in_sl in pairs:
            at_out, at_in = lead + out_sl, lead + in_sl
            h, t = hit[at_out], taken[at_out]
            xp.equal(xc[at_in], best[at_out], out=h)
            xp.greater(h, t, out=h)               # a maximum here, and none at an earlier offset
            xp.logical_or(t, h, out=t)
            contribution = part[at_out]
            xp.multiply(h, gc[at_out], out=contribution)
            view = dc[at_in]
            xp.add(view, contribution, out=view)
    if out is not None and target is not out:
        out[...] = target
        return out
    return target


@max_pool_grad.grad
def _(node, gg):
    return [None, max_pool_select(node.inputs[0], gg, **_pool_attrs(node))] + [None] * (len(node.inputs) - 2)


max_pool_select = defop("max_pool_select", num_inputs=2, pattern=OPAQUE, attrs=dict(_POOL_ATTRS), infer=_y_shaped,
                        doc="(x, v) -> v read at each window's first argmax in x (adjoint of max_pool_grad).")


@max_pool_select.kernel
def _(xp, x, v, *, kernel, stride, pad, ceil_mode, out=None):
    geo = PoolGeometry(x.ndim - 2, kernel, stride, pad, ceil_mode)
    _, index, out_sizes = _window_argmax(xp, x, geo)
    vpad = _pad_to(xp, v, geo, geo.extent(x.shape[2:], out_sizes), 0)
    target = xp.zeros(x.shape[:2] + out_sizes, dtype=v.dtype) if out is None else out
    for i, sl in enumerate(geo.offset_slices(out_sizes)):
        xp.copyto(target, vpad[sl], where=index == i)
    return target


@max_pool_select.grad
def _(node, gg):
    return [None, max_pool_grad(node.inputs[0], gg, **_pool_attrs(node))]


# --------------------------------------------------------------------------- average pooling

avg_pool = defop("avg_pool", num_inputs=1, pattern=OPAQUE, attrs=dict(_AVG_ATTRS), infer=_avg_pool_infer,
                 doc="Average pooling (Caffe Pooling AVE): padding counts in the divisor unless count_include_pad=False.")


def _reciprocal(xp: Any, geo: PoolGeometry, in_sizes: Sequence[int], out_sizes: Sequence[int], include_pad: bool,
                dtype: Any) -> Any:
    return xp.asarray((1.0 / geo.divisor(in_sizes, out_sizes, include_pad)).astype(dtype))


@avg_pool.kernel
def _(xp, x, *, kernel, stride, pad, ceil_mode, count_include_pad, out=None):
    geo = PoolGeometry(x.ndim - 2, kernel, stride, pad, ceil_mode)
    in_sizes = x.shape[2:]
    out_sizes = geo.out_sizes(in_sizes)
    target = xp.empty(x.shape[:2] + out_sizes, dtype=x.dtype) if out is None else out
    _separable_pool(xp, x, geo, out_sizes, target, 0, xp.add)   # padding adds nothing to a sum
    target *= _reciprocal(xp, geo, in_sizes, out_sizes, count_include_pad, x.dtype)
    return target


@avg_pool.grad
def _(node, g):
    return [avg_pool_grad(g, node.inputs[0], **node.attrs)]


avg_pool_grad = defop("avg_pool_grad", num_inputs=2, pattern=OPAQUE, attrs=dict(_AVG_ATTRS), infer=_avg_grad_infer,
                      doc="Gradient of avg_pool: (g, x_like) -> g spread over each window / its divisor.")


@avg_pool_grad.kernel
def _(xp, g, x_like, *, kernel, stride, pad, ceil_mode, count_include_pad, out=None):
    geo = PoolGeometry(x_like.ndim - 2, kernel, stride, pad, ceil_mode)
    in_sizes = x_like.shape[2:]
    scaled = g * _reciprocal(xp, geo, in_sizes, geo.out_sizes(in_sizes), count_include_pad, g.dtype)
    return _scatter_windows(xp, lambda i: scaled, g.dtype, x_like.shape, geo, out)


@avg_pool_grad.grad
def _(node, gg):
    # avg_pool_grad is avg_pool's adjoint, so its own adjoint is avg_pool
    return [avg_pool(gg, **node.attrs), None]


# --------------------------------------------------------------------------- global pooling

def _global_infer(types):
    x = types[0]
    _check_input(x, "global pooling")
    return TensorType(x.shape[:2] + (1,) * (x.ndim - 2), x.dtype)


def _spatial_axes(ndim: int) -> Tuple[int, ...]:
    return tuple(range(2, ndim))


global_avg_pool = defop("global_avg_pool", num_inputs=1, pattern=REDUCE, infer=_global_infer,
                        doc="Mean over all spatial axes, kept as size-1 axes: (N, C, s...) -> (N, C, 1...).")


@global_avg_pool.kernel
def _(xp, x, out=None):
    return xp.mean(x, axis=_spatial_axes(x.ndim), keepdims=True, out=out)


@global_avg_pool.grad
def _(node, g):
    return [global_avg_pool_grad(g, node.inputs[0])]


global_avg_pool_grad = defop("global_avg_pool_grad", num_inputs=2, pattern=OPAQUE,
                             infer=lambda types: types[1].with_dtype(types[0].dtype),
                             doc="(g, x_like) -> g / (spatial size) broadcast to x_like's shape.")


@global_avg_pool_grad.kernel
def _(xp, g, x_like, out=None):
    target = xp.empty(x_like.shape, dtype=g.dtype) if out is None else out
    scale = xp.asarray(1.0 / max(int(np.prod(x_like.shape[2:])), 1), dtype=g.dtype)
    xp.multiply(g, scale, out=target)
    return target


@global_avg_pool_grad.grad
def _(node, gg):
    return [global_avg_pool(gg), None]


global_max_pool = defop("global_max_pool", num_inputs=1, pattern=REDUCE, infer=_global_infer,
                        doc="Max over all spatial axes, kept as size-1 axes: (N, C, s...) -> (N, C, 1...).")


@global_max_pool.kernel
def _(xp, x, out=None):
    return xp.max(x, axis=_spatial_axes(x.ndim), keepdims=True, out=out)


@global_max_pool.grad
def _(node, g):
    return [global_max_pool_grad(node.inputs[0], g)]


def _plane_argmax(xp: Any, x: Any) -> Any:
    """First argmax over the flattened spatial plane, shape (N, C, 1)."""
    return xp.argmax(x.reshape(x.shape[0], x.shape[1], -1), axis=2)[:, :, None]


global_max_pool_grad = defop("global_max_pool_grad", num_inputs=2, pattern=OPAQUE,
                             infer=lambda types: types[0].with_dtype(types[1].dtype),
                             doc="(x, g) -> g placed at the first spatial argmax of x, zeros elsewhere.")


@global_max_pool_grad.kernel
def _(xp, x, g, out=None):
    n, c = x.shape[:2]
    hit = xp.arange(int(np.prod(x.shape[2:]))).reshape(1, 1, -1) == _plane_argmax(xp, x)
    result = xp.where(hit, g.reshape(n, c, 1), xp.zeros((), dtype=g.dtype)).reshape(x.shape)
    return _store(result, out)


@global_max_pool_grad.grad
def _(node, gg):
    return [None, global_max_pool_select(node.inputs[0], gg)]


global_max_pool_select = defop("global_max_pool_select", num_inputs=2, pattern=OPAQUE,
                               infer=lambda types: _global_infer(types[:1]).with_dtype(types[1].dtype),
                               doc="(x, v) -> v at the first spatial argmax of x, shape (N, C, 1...).")


@global_max_pool_select.kernel
def _(xp, x, v, out=None):
    n, c = x.shape[:2]
    picked = xp.take_along_axis(v.reshape(n, c, -1), _plane_argmax(xp, x), axis=2)
    return _store(picked.reshape((n, c) + (1,) * (x.ndim - 2)), out)


@global_max_pool_select.grad
def _(node, gg):
    return [None, global_max_pool_grad(node.inputs[0], gg)]
