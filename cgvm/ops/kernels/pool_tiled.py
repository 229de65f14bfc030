"""Pooling whose windows tile the input (stride = kernel, no padding): kernels laid out for NumPy.

A window offset is then a strided view of x, and no col2im accumulation is needed. What costs is
how NumPy walks those views: the view of one (row, column) offset of a 2-D window has inner runs
of only OW elements (its rows are not adjacent in memory), and NumPy pays per run. LeNet's
2x2 pooling of 24x24 maps ran 15,360 runs of 12 elements per pass.

Viewed as ``(planes·OH, kh, OW, kw)``, a column offset ``[..., j]`` is ONE run over the whole
input (stride kw): reducing the columns first, then the kh rows of the result, makes most passes
long. For 2x2 max pooling the gradient is built the same way, in the two stages.

Max pooling's ties go to the first maximum in row-major window order (Caffe's rule): the first
row holding the window's maximum, then the first column of that row holding it.

``geo`` here is a cgvm.ops.kernels.pool_windows.PoolGeometry.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

#: rows of the (planes·OH, kh, OW, kw) view reduced at a time (bytes of input): cache-sized
CHUNK_BYTES = 1 << 20


def tiles(geo: Any, in_sizes: Sequence[int]) -> bool:
    """Whether the windows tile the input (stride = kernel, no padding, and no partial last window
    in ceil mode; floor mode ignores the untiled rest)."""
    return (not geo.dilated and not any(b or e for b, e in geo.pads) and tuple(geo.stride) == tuple(geo.kernel)
            and all(n % k == 0 or not geo.ceil_mode for n, k in zip(in_sizes, geo.kernel)))


def pool_2d(xp: Any, x: Any, geo: Any, target: Any, combine: Any) -> Any:
    """Window max (combine = maximum) or sum (add) of x (N, C, H, W) into target (N, C, OH, OW),
    for windows that tile x exactly: columns first (long runs), then rows."""
    n, c, h, w = x.shape
    kh, kw = geo.kernel
    oh, ow = h // kh, w // kw
    rows = n * c * oh
    x4 = x.reshape(rows, kh, ow, kw)
    result = target if target.flags.c_contiguous else xp.empty(target.shape, dtype=target.dtype)
    flat = result.reshape(rows, ow)
    step = max(1, CHUNK_BYTES // max(1, kh * w * x.dtype.itemsize))
    cols = xp.empty((min(step, rows), kh, ow), dtype=x.dtype)
    for r0 in range(0, rows, step):
        part, acc = x4[r0:r0 + step], cols[:min(step, rows - r0)]
        if kw == 1:
            acc[...] = part[..., 0]
        else:
            combine(part[..., 0], part[..., 1], out=acc)
        for j in range(2, kw):
            combine(acc, part[..., j], out=acc)
        dest = flat[r0:r0 + step]
        if kh == 1:
            dest[...] = acc[:, 0]
            continue
        combine(acc[:, 0], acc[:, 1], out=dest)
        for i in range(2, kh):
            combine(dest, acc[:, i], out=dest)
    if result is not target:
        target[...] = result
    return target


def cropped(xp: Any, x: Any, geo: Any) -> Any:
    """The part of x (N, C, H, W) that floor-mode windows tile, contiguous (x itself when exact)."""
    h, w = (n - n % k for n, k in zip(x.shape[2:], geo.kernel))
    return x if (h, w) == tuple(x.shape[2:]) else xp.ascontiguousarray(x[:, :, :h, :w])


def max_grad_2x2(xp: Any, x: Any, g: Any, pooled: Optional[Any], out: Optional[Any]) -> Any:
    """max_pool_grad of 2x2/2 windows tiling x (in floor mode, an odd last row or column belongs to
    no window and gets zeros): g to each window's first maximum."""
    h, w = x.shape[2:]
    th, tw = h - h % 2, w - w % 2
    if (th, tw) == (h, w):
        return _max_grad_2x2_exact(xp, x, g, pooled, out)
    target = out if out is not None else xp.empty(x.shape, dtype=g.dtype)
    target[:, :, :th, :tw] = _max_grad_2x2_exact(xp, xp.ascontiguousarray(x[:, :, :th, :tw]), g, pooled, None)
    target[:, :, th:] = 0
    target[:, :, :th, tw:] = 0
    return target


def _max_grad_2x2_exact(xp: Any, x: Any, g: Any, pooled: Optional[Any], out: Optional[Any]) -> Any:
    """max_pool_grad of 2x2/2 windows tiling x exactly: g to each window's first maximum.

    Stage 1 compares the two columns of every window row (one long run each): the row maxima, and
    whether the left column holds the first one. Stage 2 compares the two row maxima with the
    window's maximum (``pooled``, the forward's output, when given): whether the top row holds it.
    Rows go a cache-sized chunk at a time: the passes are memory-bound, and from cache the
    intermediate ones cost little (LeNet's first pooling: 2.0 -> 1.0 ms).
    """
    n, c, h, w = x.shape
    rows, ow = n * c * (h // 2), w // 2
    x4 = x.reshape(rows, 2, ow, 2)
    g2 = g.reshape(rows, ow)
    best = None if pooled is None else pooled.reshape(rows, ow)
    target = out if out is not None and out.flags.c_contiguous else xp.empty(x.shape, dtype=g.dtype)
    o4 = target.reshape(rows, 2, ow, 2)
    step = max(1, CHUNK_BYTES // max(1, 2 * w * x.dtype.itemsize))
    size = min(step, rows)
    row_max = xp.empty((size, 2, ow), dtype=x.dtype)
    left_first = xp.empty((size, 2, ow), dtype=bool)
    per_row = xp.empty((size, 2, ow), dtype=g.dtype)      # g to the top or the bottom row of a window
    top = xp.empty((size, ow), dtype=bool)
    for r0 in range(0, rows, step):
        m = min(step, rows - r0)
        left, right = x4[r0:r0 + m, ..., 0], x4[r0:r0 + m, ..., 1]
        rmax, lf, pr, tp = row_max[:m], left_first[:m], per_row[:m], top[:m]
        xp.maximum(left, right, out=rmax)
        xp.greater_equal(left, right, out=lf)
        if best is None:
            window_max = xp.maximum(rmax[:, 0], rmax[:, 1])
        else:
            window_max = best[r0:r0 + m]
        xp.equal(rmax[:, 0], window_max, out=tp)
        gc = g2[r0:r0 + m]
        xp.multiply(tp, gc, out=pr[:, 0])
        xp.subtract(gc, pr[:, 0], out=pr[:, 1])
        oc = o4[r0:r0 + m]
        xp.multiply(lf, pr, out=oc[..., 0])
        xp.subtract(pr, oc[..., 0], out=oc[..., 1])
    if out is not None and target is not out:
        out[...] = target
        return out
    return target


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
