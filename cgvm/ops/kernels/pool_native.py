"""Max pooling and its gradient over 2-D NCHW maps as compiled loops (cgvm.ops.kernels.native).

2x2 windows tiling the map, forward and gradient; and the gradient of the other window
geometries where the general loop was measured faster than the NumPy kernels (GRAD_GEOMETRIES:
kernel, stride, begin padding; a tap outside the image is skipped, as max pooling ignores
padding, and ceil mode's clipped last window is the same clip). The output sizes come from the
caller (PoolGeometry.out_sizes), so the rules stay in one place.

Semantics are the NumPy kernels' (cgvm.ops.pool): the maximum propagates NaN as
``numpy.maximum`` does; the gradient goes to each window's first element (row-major) equal to the
window's maximum, accumulating where windows overlap.
"""
from __future__ import annotations

from typing import Any, Optional

from .native import native
from .pool_tiled import tiles
from .pool_windows import PoolGeometry


@native
def max_pool_2x2(x, y):
    """The common case, 2x2 windows with stride 2 and no padding (floor mode), without bounds tests."""
    n_, c_ = x.shape[0], x.shape[1]
    oh_, ow_ = y.shape[2], y.shape[3]
    for n in range(n_):
        for c in range(c_):
            for i in range(oh_):
                for j in range(ow_):
                    a = x[n, c, 2 * i, 2 * j]
                    b = x[n, c, 2 * i, 2 * j + 1]
                    e = x[n, c, 2 * i + 1, 2 * j]
                    f = x[n, c, 2 * i + 1, 2 * j + 1]
                    top = a if a >= b or a != a else b
                    bottom = e if e >= f or e != e else f
                    y[n, c, i, j] = top if top >= bottom or top != top else bottom


@native
def max_pool_grad_2d(x, y, g, dx, kh, kw, sh, sw, ph, pw, dh, dw):
    n_, c_, h_, w_ = x.shape
    oh_, ow_ = y.shape[2], y.shape[3]
    for n in range(n_):
        for c in range(c_):
            for h in range(h_):
                for w in range(w_):
                    dx[n, c, h, w] = 0
            for i in range(oh_):
                h0 = i * sh - ph
                for j in range(ow_):
                    w0 = j * sw - pw
                    best = y[n, c, i, j]
                    found = False
                    for a in range(kh):
                        h = h0 + a * dh
                        if found or h < 0 or h >= h_:
                            continue
                        for b in range(kw):
                            w = w0 + b * dw
                            if w >= 0 and w < w_ and x[n, c, h, w] == best:
                                dx[n, c, h, w] += g[n, c, i, j]
                                found = True
                                break


@native
def max_pool_grad_2x2(x, y, g, dx):
    """max_pool_grad_2d for 2x2 windows with stride 2 and no padding (floor mode)."""
    n_, c_, h_, w_ = x.shape
    oh_, ow_ = y.shape[2], y.shape[3]
    zero = dx.dtype.type(0)
    for n in range(n_):
        for c in range(c_):
            for h in range(2 * oh_, h_):
                for w in range(w_):
                    dx[n, c, h, w] = zero
            for i in range(oh_):
                for w in range(2 * ow_, w_):
                    dx[n, c, 2 * i, w] = zero
                    dx[n, c, 2 * i + 1, w] = zero
                # one row pair as 1-D rows, and selects without branches: which element is the
                # first maximum is data, so branches mispredict; this form vectorizes and ran
                # 1.4x faster than 4-D indexing (0.60 -> 0.43 ms for 64 x 16 x 26 x 26)
                top, bottom, dtop, dbottom = x[n, c, 2 * i], x[n, c, 2 * i + 1], dx[n, c, 2 * i], dx[n, c, 2 * i + 1]
                maxima, grads = y[n, c, i], g[n, c, i]
                for j in range(ow_):
                    best = maxima[j]
                    v = grads[j]
                    a = top[2 * j] == best
                    b = (top[2 * j + 1] == best) & (not a)
                    taken = a | b
                    e = (bottom[2 * j] == best) & (not taken)
                    f = (bottom[2 * j + 1] == best) & (not (taken | e))
                    dtop[2 * j] = v if a else zero
                    dtop[2 * j + 1] = v if b else zero
                    dbottom[2 * j] = v if e else zero
                    dbottom[2 * j + 1] = v if f else zero


def _tiles_2x2(geo: PoolGeometry, in_sizes: Any) -> bool:
    return tuple(geo.kernel) == (2, 2) and tiles(geo, in_sizes)


#: (kernel, stride) of undilated windows whose gradient the general compiled loop computes faster
#: than the NumPy kernels. Measured at one thread (NumPy -> compiled, ms): 2x2/2 in ceil mode
#: 16 x 64 x 13 x 13 1.36 -> 0.56; 3x3/2 pad 1 (ResNet's stem) 16 x 64 x 112 x 112 65 -> 49; 3x3/1
#: pad 1 (GoogLeNet) 16 x 192 x 28 x 28 49 -> 26. Slower, so left to NumPy: 3x3/3 in ceil mode
#: 0.95 -> 1.31, 2x2/1 3.2 -> 6.8. A compiled forward of windows other than 2x2 tiles lost to
#: NumPy's separable maximum at every shape measured (3x3/2: 10 -> 33 ms), so there is none.
GRAD_GEOMETRIES = frozenset({((2, 2), (2, 2)), ((3, 3), (2, 2)), ((3, 3), (1, 1))})


def pool_forward(xp: Any, x: Any, geo: PoolGeometry, target: Any) -> bool:
    """Window maxima of x (N, C, H, W) into target (N, C, OH, OW) when the compiled kernel may run
    (cgvm.ops.kernels.native): 2x2 windows tiling x; False: the caller runs the NumPy kernel."""
    return x.ndim == 4 and _tiles_2x2(geo, x.shape[2:]) and max_pool_2x2.run(xp, x, target)


def pool_grad(xp: Any, x: Any, g: Any, y: Optional[Any], geo: PoolGeometry, out: Optional[Any]) -> Optional[Any]:
    """dx of max pooling (into ``out`` when given) when a compiled kernel may run and pays, else
    None; ``y`` the window maxima (found here for 2x2 tiles when None)."""
    if x.ndim != 4 or g.dtype != x.dtype or (out is not None and out.dtype != x.dtype):
        return None
    tiled = _tiles_2x2(geo, x.shape[2:])
    if not tiled and ((tuple(geo.kernel), tuple(geo.stride)) not in GRAD_GEOMETRIES or geo.dilated or y is None):
        return None
    if y is None:
        y = xp.empty(g.shape, dtype=x.dtype)
        if not pool_forward(xp, x, geo, y):
            return None
    target = xp.empty(x.shape, dtype=x.dtype) if out is None else out
    if tiled:
        return target if max_pool_grad_2x2.run(xp, x, y, g, target) else None
    (kh, kw), (sh, sw), (dh, dw) = geo.kernel, geo.stride, geo.dilation
    (ph, _), (pw, _) = geo.pads
    return target if max_pool_grad_2d.run(xp, x, y, g, target, kh, kw, sh, sw, ph, pw, dh, dw) else None
