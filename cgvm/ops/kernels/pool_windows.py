"""Pooling windows: their geometry (PoolGeometry) and the kernels that work for any windows.

The op definitions are in cgvm.ops.pool; windows that tile the input have their own layouts
(cgvm.ops.kernels.pool_tiled).

Kernels loop over the kernel offsets, each one strided slice of the input clipped to the image
(padding is never copied), a chunk of (sample, channel) planes at a time; k x k windows reduce one
axis at a time. Gradients add the same slices back (col2im without scatter).
"""
from __future__ import annotations

import itertools
import math
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import ShapeError
from . import pool_tiled as tiled
from ..conv_geometry import PadPairs, crop_padding, pad_pairs, spatial_values
from ..rules import Dim


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

    __slots__ = ("nsp", "kernel", "stride", "pads", "ceil_mode", "dilation", "span")

    def __init__(self, nsp: int, kernel: Sequence[int], stride: Optional[Sequence[int]], pad: Sequence[int],
                 ceil_mode: bool, dilation: Sequence[int] = (1,)):
        self.nsp = nsp
        self.kernel = spatial_values(kernel, nsp, "kernel")
        self.stride = spatial_values(self.kernel if stride is None else stride, nsp, "stride")
        self.dilation = spatial_values(dilation, nsp, "dilation")
        # the extent one window covers: k taps, dilation apart
        self.span = tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilation))
        self.pads: PadPairs = pad_pairs(pad, nsp)
        for k, (b, e) in zip(self.span, self.pads):
            if b >= k or e >= k:
                raise ShapeError(f"pad {tuple(pad)} must be smaller than the kernel {self.kernel}"
                                 + (f" with dilation {self.dilation}" if self.dilated else ""))
        self.ceil_mode = ceil_mode

    @property
    def dilated(self) -> bool:
        return any(d != 1 for d in self.dilation)

    def out_sizes(self, in_sizes: Sequence[Dim]) -> Tuple[Dim, ...]:
        return tuple(pool_out_size(n, k, s, p, self.ceil_mode)
                     for n, k, s, p in zip(in_sizes, self.span, self.stride, self.pads))

    def extent(self, in_sizes: Sequence[int], out_sizes: Sequence[int]) -> Tuple[int, ...]:
        """Padded size covering every window (ceil mode may run past the end padding)."""
        return tuple(max(n + b + e, (o - 1) * s + k)
                     for n, (b, e), o, s, k in zip(in_sizes, self.pads, out_sizes, self.stride, self.span))

    def offsets(self) -> List[Tuple[int, ...]]:
        """Tap indices of a window, row-major (tap i of an axis lies i·dilation from its start)."""
        return list(itertools.product(*[range(k) for k in self.kernel]))

    def positions(self) -> List[Tuple[int, ...]]:
        """Where each tap of ``offsets()`` lies from the window's start."""
        return [tuple(k * d for k, d in zip(kk, self.dilation)) for kk in self.offsets()]

    def offset_slices(self, out_sizes: Sequence[int]) -> List[tuple]:
        """For each kernel offset (row-major), the strided slice of the padded input it reads."""
        return [(slice(None), slice(None)) + tuple(slice(k, k + (o - 1) * s + 1, s)
                                                   for k, o, s in zip(kk, out_sizes, self.stride))
                for kk in self.positions()]

    def clipped_axis(self, d: int, n: int, out: int) -> List[Tuple[slice, slice]]:
        """Along spatial axis d: for each kernel offset, (output slice, input slice) of the outputs
        whose window element at that offset lies inside the unpadded input, and the strided input
        elements they read. Padding is never materialized: a padded element is one no offset
        reads. Offsets that read only padding are left out."""
        k_size, s, b, dil = self.kernel[d], self.stride[d], self.pads[d][0], self.dilation[d]
        result = []
        for k in range(0, k_size * dil, dil):
            first = max(0, -(-(b - k) // s))          # o·s + k - b >= 0
            last = min(out - 1, (n - 1 + b - k) // s)  # o·s + k - b <= n - 1
            if last >= first:
                start = first * s + k - b
                result.append((slice(first, last + 1), slice(start, start + (last - first) * s + 1, s)))
        return result

    def divisor(self, in_sizes: Sequence[int], out_sizes: Sequence[int], include_pad: bool) -> np.ndarray:
        """Averaging divisor per output position (spatial shape), as float64 NumPy."""
        total = np.ones((), dtype=np.float64)
        for n, k, s, (b, e), o, dl in zip(in_sizes, self.kernel, self.stride, self.pads, out_sizes, self.dilation):
            start = np.arange(o) * s - b
            # taps t in [0, k) at start + t·dl: inside the padded extent (start + t·dl < n + e), or
            # inside the image (0 <= start + t·dl < n)
            if include_pad:
                count = np.clip(-(-(n + e - start) // dl), 0, k)
            else:
                first = np.maximum(-(-(-start) // dl), 0)
                count = np.maximum(np.minimum(-(-(n - start) // dl), k) - first, 0)
            total = np.multiply.outer(total, count)
        return total


def lowest_value(dtype: Any) -> Any:
    """The value padding takes in max pooling: it never wins against a real element."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return -np.inf
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return False


def pad_to_extent(xp: Any, x: Any, geo: PoolGeometry, extent: Sequence[int], fill: Any) -> Any:
    """x placed at the begin padding of a buffer of the given spatial extent, filled with ``fill``."""
    if tuple(x.shape[2:]) == tuple(extent) and not any(b for b, _ in geo.pads):
        return x
    buf = xp.full(tuple(x.shape[:2]) + tuple(extent), fill, dtype=x.dtype)
    buf[(slice(None), slice(None)) + tuple(slice(b, b + n) for n, (b, _) in zip(x.shape[2:], geo.pads))] = x
    return buf


def store_into(result: Any, out: Optional[Any]) -> Any:
    """result, copied into ``out`` when the caller gave one."""
    if out is None:
        return result
    out[...] = result
    return out


def window_argmax(xp: Any, x: Any, geo: PoolGeometry) -> Tuple[Any, Any, Tuple[int, ...]]:
    """(max, offset index of the first max in row-major window order, output sizes)."""
    out_sizes = geo.out_sizes(x.shape[2:])
    xpad = pad_to_extent(xp, x, geo, geo.extent(x.shape[2:], out_sizes), lowest_value(x.dtype))
    slices = geo.offset_slices(out_sizes)
    best = xpad[slices[0]].copy()
    index = xp.zeros(best.shape, dtype=xp.intp)
    for i, sl in enumerate(slices[1:], 1):
        cand = xpad[sl]
        better = cand > best  # strict: an equal later value does not take over (Caffe's tie rule)
        xp.copyto(index, i, where=better)
        xp.copyto(best, cand, where=better)
    return best, index, out_sizes


def scatter_windows(xp: Any, parts: Any, dtype: Any, x_shape: Sequence[int], geo: PoolGeometry,
                    out: Optional[Any]) -> Any:
    """col2im for pooling: ``parts(i)`` is the contribution of offset i; summed into an x-shaped result."""
    in_sizes = tuple(x_shape[2:])
    out_sizes = geo.out_sizes(in_sizes)
    acc = xp.zeros(tuple(x_shape[:2]) + geo.extent(in_sizes, out_sizes), dtype=dtype)
    for i, sl in enumerate(geo.offset_slices(out_sizes)):
        view = acc[sl]
        xp.add(view, parts(i), out=view)
    result = crop_padding(acc, geo.pads, in_sizes)
    return store_into(result, out) if out is not None else xp.ascontiguousarray(result)


#: separable pooling works on this many bytes of input planes at a time (its intermediate stays small)
POOL_CHUNK_BYTES = 1 << 20


def separable_pool(xp: Any, x: Any, geo: PoolGeometry, out_sizes: Tuple[int, ...], target: Any, fill: Any,
                   combine: Any) -> Any:
    """Window max (combine = maximum, fill = lowest) or sum (add, 0) of x into target.

    Windows are clipped to the input, so padding is never copied; planes (sample, channel) go a
    chunk at a time, so intermediates stay cache-sized. A k x k window with k > 2 is reduced one
    spatial axis at a time, 2k passes instead of k² (ResNet's 3x3 stem pool: 73 -> 21 ms); for
    2x2 or 1-D windows all offsets at once is no more work.
    """
    in_sizes = tuple(x.shape[2:])
    if len(in_sizes) == 2 and tiled.tiles(geo, in_sizes):   # floor mode drops an untiled rest
        return tiled.pool_2d(xp, x, geo, target, combine)
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


def chunked_max_grad(xp: Any, x: Any, g: Any, y: Optional[Any], geo: PoolGeometry, out: Optional[Any]) -> Any:
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
            separable_pool(xp, xc.reshape((m, 1) + in_sizes), geo, out_sizes, best.reshape((m, 1) + out_sizes),
                           lowest_value(x.dtype), xp.maximum)
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

