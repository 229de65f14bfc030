"""Pooling whose windows tile the input (stride = kernel, no padding): kernels laid out for NumPy.

A window offset is then a strided view of x, and no col2im accumulation is needed. What costs is
how NumPy walks those views, and which of its loops it picks:

* its float ``maximum`` (and ``minimum``, ``where``, ``copyto(where=)``) has a fast loop only for
  unit-stride operands: on the stride-2 view of one column of 2x2 windows it ran 6-9x slower than
  ``add``, a comparison or a plain copy over the same view (0.8 against 0.1 ms for LeNet-sized
  maps), while over operands whose inner runs are contiguous it is as fast as they are;
* NumPy pays per contiguous run, so a view with runs of only OW elements costs more than one
  whose runs merge.

Every kernel here views x as (N, C, OH, kh, OW, kw) (a split of the axes, so always a view, the
floor-mode rest left out) and combines the kh window rows first: each row of windows is one run
of OW·kw contiguous elements. The kw columns of that result are copied apart (copies stream over
any stride) and combined unit-stride. For 2x2 max pooling the gradient is built in two stages
from comparisons and products, which have fast strided loops.

Max pooling's ties go to the first maximum in row-major window order (Caffe's rule): the first
row holding the window's maximum, then the first column of that row holding it.

``geo`` here is a cgvm.ops.kernels.pool_windows.PoolGeometry.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

#: samples pooled at a time (bytes of their input): intermediates stay cache-sized
CHUNK_BYTES = 1 << 20


def tiles(geo: Any, in_sizes: Sequence[int]) -> bool:
    """Whether the windows tile the input (stride = kernel, no padding, and no partial last window
    in ceil mode; floor mode ignores the untiled rest)."""
    return (not geo.dilated and not any(b or e for b, e in geo.pads) and tuple(geo.stride) == tuple(geo.kernel)
            and all(n % k == 0 or not geo.ceil_mode for n, k in zip(in_sizes, geo.kernel)))


def window_view(x: Any, kernel: Sequence[int]) -> Any:
    """x (N, C, H, W) as (N, C, OH, kh, OW, kw): the windows' part of x (floor mode's untiled
    last rows and columns left out). Slicing and splitting axes never copy, so writing into the
    view writes x."""
    n, c, h, w = x.shape
    kh, kw = kernel
    oh, ow = h // kh, w // kw
    return x[:, :, :oh * kh, :ow * kw].reshape(n, c, oh, kh, ow, kw)


def _sample_step(x: Any) -> int:
    return max(1, CHUNK_BYTES // max(1, x[0].nbytes if x.shape[0] else 1))


def pool_2d(xp: Any, x: Any, geo: Any, target: Any, combine: Any) -> Any:
    """Window max (combine = maximum) or sum (add) of x (N, C, H, W) into target (N, C, OH, OW),
    for windows that tile x (floor mode drops an untiled rest): window rows first (long runs),
    then the columns, each copied out to unit stride first."""
    n, c = x.shape[:2]
    kh, kw = geo.kernel
    x6 = window_view(x, (kh, kw))
    oh, ow = x6.shape[2], x6.shape[4]
    result = target if target.flags.c_contiguous else xp.empty(target.shape, dtype=target.dtype)
    step = _sample_step(x)
    size = min(step, n)
    rows = xp.empty((size, c, oh, ow, kw), dtype=x.dtype) if kh > 1 else None
    column = xp.empty((size, c, oh, ow), dtype=x.dtype) if kw > 1 else None
    for s0 in range(0, n, step):
        m = min(step, n - s0)
        part = x6[s0:s0 + m]
        if kh == 1:
            acc = part[:, :, :, 0]
        else:
            acc = rows[:m]
            combine(part[:, :, :, 0], part[:, :, :, 1], out=acc)
            for i in range(2, kh):
                combine(acc, part[:, :, :, i], out=acc)
        dest = result[s0:s0 + m]
        dest[...] = acc[..., 0]
        for j in range(1, kw):
            col = column[:m]
            col[...] = acc[..., j]
            combine(dest, col, out=dest)
    if result is not target:
        target[...] = result
    return target


def max_grad_2x2(xp: Any, x: Any, g: Any, pooled: Optional[Any], out: Optional[Any]) -> Any:
    """max_pool_grad of 2x2/2 windows tiling x (in floor mode, an odd last row or column belongs to
    no window and gets zeros): g to each window's first maximum, a chunk of samples at a time.

    Stage 1 decides each window's row: the top one when one of its two elements equals the
    window's maximum (``pooled``, the forward's output, or found here); the row's share of g is
    g or 0. Stage 2 decides the column in both rows at once: the left one when it is at least the
    right one (one comparison over all the window rows, a long run), and writes share and rest.
    In floor mode a chunk's tiled part is first copied to contiguous memory: its rows would
    otherwise split every pass into runs of OW elements (5 for an 11x11 map: 0.25 ms more a pass).
    """
    n, c, h, w = x.shape
    oh, ow = h // 2, w // 2
    exact = (2 * oh, 2 * ow) == (h, w)
    x6 = window_view(x, (2, 2))
    g4 = g.reshape(n, c, oh, ow)
    target = out if out is not None and out.flags.c_contiguous else xp.empty(x.shape, dtype=g.dtype)
    if not exact:
        target[:, :, 2 * oh:] = 0
        target[:, :, :2 * oh, 2 * ow:] = 0
    t6 = window_view(target, (2, 2))
    step = _sample_step(x)
    size = min(step, n)
    top = xp.empty((size, c, oh, ow), dtype=bool)
    hit = xp.empty((size, c, oh, ow), dtype=bool)
    share = xp.empty((size, c, oh, 2, ow), dtype=g.dtype)     # g to the top or the bottom row of a window
    left = xp.empty((size, c, oh, 2, ow), dtype=bool)
    best = xp.empty((size, c, oh, ow), dtype=x.dtype) if pooled is None else None
    dense_x = None if exact else xp.empty((size, c, oh, 2, ow, 2), dtype=x.dtype)
    dense_t = None if exact else xp.empty((size, c, oh, 2, ow, 2), dtype=g.dtype)
    for s0 in range(0, n, step):
        m = min(step, n - s0)
        xs, gs, ts = x6[s0:s0 + m], g4[s0:s0 + m], t6[s0:s0 + m]
        if not exact:
            dense_x[:m] = xs
            xs, ts = dense_x[:m], dense_t[:m]
        if pooled is None:
            window_max = best[:m]
            pool_2d(xp, xs.reshape(m, c, 2 * oh, 2 * ow), _TWO_BY_TWO, window_max, xp.maximum)
        else:
            window_max = pooled[s0:s0 + m]
        tp, ht, sh, lf = top[:m], hit[:m], share[:m], left[:m]
        xp.equal(xs[:, :, :, 0, :, 0], window_max, out=tp)
        xp.equal(xs[:, :, :, 0, :, 1], window_max, out=ht)
        xp.logical_or(tp, ht, out=tp)
        xp.multiply(tp, gs, out=sh[:, :, :, 0])
        xp.subtract(gs, sh[:, :, :, 0], out=sh[:, :, :, 1])
        xp.greater_equal(xs[..., 0], xs[..., 1], out=lf)
        xp.multiply(lf, sh, out=ts[..., 0])
        xp.subtract(sh, ts[..., 0], out=ts[..., 1])
        if not exact:
            t6[s0:s0 + m] = ts
    if out is not None and target is not out:
        out[...] = target
        return out
    return target


class _Geometry2x2:
    """The attributes pool_2d reads, for 2x2/2 windows."""

    kernel = (2, 2)


_TWO_BY_TWO = _Geometry2x2()


def max_grad(xp: Any, x: Any, g: Any, geo: Any, out: Optional[Any], pooled: Optional[Any] = None) -> Any:
    """max_pool_grad for any tiled windows: g to each window's first maximum, in row-major window
    order, one window offset at a time; ``pooled`` (the forward's output, when given) are the
    window maxima.

    (NumPy reductions over small strided axes are slow: the maximum and the first-hit mask are
    built from elementwise passes over the per-offset views instead.)
    """
    out_sizes = tuple(n // k for n, k in zip(x.shape[2:], geo.kernel))
    tiled = (slice(None), slice(None)) + tuple(slice(0, o * k) for o, k in zip(out_sizes, geo.kernel))
    split = tuple(x.shape[:2]) + tuple(d for o, k in zip(out_sizes, geo.kernel) for d in (o, k))

    def at(a: Any, kk: Sequence[int]) -> Any:
        return a[(slice(None), slice(None)) + tuple(i for k in kk for i in (slice(None), k))]

    exact = all(o * k == n for o, k, n in zip(out_sizes, geo.kernel, x.shape[2:]))
    xr = (x if exact else x[tiled]).reshape(split)
    offsets = geo.offsets()
    if pooled is not None:
        best = pooled
    else:
        best = at(xr, offsets[0]).copy()
        for kk in offsets[1:]:
            xp.maximum(best, at(xr, kk), out=best)
    if out is None:
        out = xp.empty(x.shape, dtype=g.dtype) if exact else xp.zeros(x.shape, dtype=g.dtype)
    elif not exact:
        out[...] = 0
    result = (out if exact else out[tiled]).reshape(split)  # a view: tiled parts of out are contiguous runs
    taken = xp.equal(at(xr, offsets[0]), best)
    xp.multiply(taken, g, out=at(result, offsets[0]))
    hit = xp.empty(best.shape, dtype=bool)
    for i, kk in enumerate(offsets[1:], 2):
        xp.equal(at(xr, kk), best, out=hit)
        xp.greater(hit, taken, out=hit)   # a maximum here, and none at an earlier offset
        xp.multiply(hit, g, out=at(result, kk))
        if i < len(offsets):
            xp.logical_or(taken, hit, out=taken)
    return out
