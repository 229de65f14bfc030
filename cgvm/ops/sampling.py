"""Sampling an image at given points: grid_sample (ONNX GridSample, PyTorch's grid_sample) and its gradients.

    grid_sample(x, grid, mode="linear", padding_mode="zeros", align_corners=False) -> y

``x`` is (N, C, D1, ..., Dr), ``grid`` (N, O1, ..., Om, r) holds normalized coordinates in [-1, 1],
its last axis ordered like PyTorch's and ONNX's (x, y[, z]): the last spatial axis first. ``y`` is
(N, C, O1, ..., Om). A coordinate ``g`` on an axis of size n becomes the pixel position
``(g + 1) / 2 · (n - 1)`` with ``align_corners`` (-1 and 1 are the corner pixels' centers), else
``((g + 1) · n - 1) / 2`` (they are the corner pixels' outer edges).

``mode``: "nearest" (the position rounded half to even), "linear" (2 taps per axis) or "cubic"
(4 taps per axis, Keys' kernel with a = -0.75), all over every spatial axis at once.
``padding_mode`` says what lies outside the image: "zeros"; "border" (a position outside the
image's extent is clamped to the edge pixels, and taps past the edge read the edge pixel); or
"reflection" (positions and taps are reflected at the extent's borders: the pixel centers with
``align_corners``, else the image's outer edges). The rules follow ONNX's GridSample (whose
nearest mode rounds before padding the position); linear and cubic agree with PyTorch's.

Gradients: with respect to x, each output's gradient spread back over the taps it read with their
weights (grid_sample_grad_x); with respect to the grid, the derivative of the tap weights times
the pixels they read, times the slope of the coordinate mapping (zero where nearest mode rounds,
or a border clamps; -1 where a reflection flips it) (grid_sample_grad_grid). The two gradient ops
have no gradient rules themselves (second order through grid_sample is a GradientError). Kernels
are NumPy/CuPy alike.
"""
from __future__ import annotations

import itertools
from typing import Any, List, Tuple

from ..errors import ShapeError
from ..ir.attrs import Bool, Str
from ..ir.types import TensorType
from .registry import OPAQUE, defop
from .rules import dims_agree, require_float

MODES = ("nearest", "linear", "cubic")
PADDING_MODES = ("zeros", "border", "reflection")
CUBIC_A = -0.75
_ATTRS = {"mode": Str("linear", choices=MODES), "padding_mode": Str("zeros", choices=PADDING_MODES),
          "align_corners": Bool(False)}


def _grid_sample_infer(types, mode, padding_mode, align_corners):
    x, grid = types[:2]
    require_float(x, "grid_sample: x")
    require_float(grid, "grid_sample: grid")
    nsp = x.ndim - 2
    if nsp < 1:
        raise ShapeError(f"grid_sample: x must be (N, C, spatial...) with at least one spatial axis, got {x!r}")
    if grid.ndim != x.ndim or grid.shape[-1] not in (None, nsp):
        raise ShapeError(f"grid_sample: the grid must be (N, out spatial..., {nsp}) for x {x!r}, got {grid!r}")
    if not dims_agree(x.shape[:1], grid.shape[:1]):
        raise ShapeError(f"grid_sample: x {x!r} and grid {grid!r} disagree on the batch size")
    return TensorType(x.shape[:2] + grid.shape[1:-1], x.dtype)


# --------------------------------------------------------------------------- the taps

def _reflect(xp: Any, v: Any, lo: float, hi: float) -> Tuple[Any, Any]:
    """v reflected at lo and hi until inside, and the slope d(result)/dv (+1 or -1)."""
    span = hi - lo
    if span <= 0:
        return xp.full(v.shape, lo, dtype=v.dtype), xp.zeros(v.shape, dtype=v.dtype)
    below, above = v < lo, v > hi
    dist = xp.where(below, lo - v, xp.where(above, v - hi, 0))
    times = xp.floor(dist / span)
    rest = dist - times * span
    even = (times % 2) == 0
    flipped = xp.where(below, xp.where(even, lo + rest, hi - rest), xp.where(even, hi - rest, lo + rest))
    outside = below | above
    result = xp.where(outside, flipped, v)
    slope = xp.where(outside & even, -1.0, 1.0).astype(v.dtype)
    return result, slope


def _extent(n: int, align_corners: bool) -> Tuple[float, float]:
    return (0.0, n - 1.0) if align_corners else (-0.5, n - 0.5)


def _position(xp: Any, g: Any, n: int, mode: str, padding_mode: str, align_corners: bool) -> Tuple[Any, Any]:
    """Normalized coordinates -> pixel positions on one axis (padded as ONNX pads them), with the slope."""
    scale = (n - 1) / 2.0 if align_corners else n / 2.0
    pos = (g + 1) * scale if align_corners else ((g + 1) * n - 1) / 2.0
    slope = xp.full(g.shape, scale, dtype=g.dtype)
    if mode == "nearest":
        pos = xp.rint(pos)
        slope = xp.zeros(g.shape, dtype=g.dtype)
    lo, hi = _extent(n, align_corners)
    if padding_mode == "border":
        outside = (pos < lo) | (pos > hi)
        pos = xp.where(outside, xp.clip(pos, 0, n - 1), pos)
        slope = xp.where(outside, 0, slope).astype(g.dtype)
    elif padding_mode == "reflection":
        pos, flip = _reflect(xp, pos, lo, hi)
        slope = slope * flip
    return pos.astype(g.dtype), slope


def _cubic(xp: Any, t: Any, derivative: bool) -> List[Any]:
    """Keys' weights of the taps at -1, 0, 1, 2 for a fraction t in [0, 1) (or their d/dt)."""
    a = CUBIC_A

    def outer(s):     # |s| in [1, 2)
        return 3 * a * s * s - 10 * a * s + 8 * a if derivative else ((a * s - 5 * a) * s + 8 * a) * s - 4 * a

    def inner(s):     # |s| in [0, 1)
        return 3 * (a + 2) * s * s - 2 * (a + 3) * s if derivative else ((a + 2) * s - (a + 3)) * s * s + 1

    sign = -1 if derivative else 1
    return [outer(t + 1), inner(t), sign * inner(1 - t), sign * outer(2 - t)]


def _axis_taps(xp: Any, pos: Any, n: int, mode: str, padding_mode: str, align_corners: bool
               ) -> List[Tuple[Any, Any, Any, Any]]:
    """Per tap on one axis: (index into the axis, in-image mask, weight, d weight / d position)."""
    if mode == "nearest":
        raw = [xp.trunc(pos).astype(xp.int64)]
        weights = [xp.ones(pos.shape, dtype=pos.dtype)]
        slopes = [xp.zeros(pos.shape, dtype=pos.dtype)]
    else:
        base = xp.floor(pos)
        t = pos - base
        base = base.astype(xp.int64)
        if mode == "linear":
            raw = [base, base + 1]
            weights = [1 - t, t]
            slopes = [-xp.ones(t.shape, dtype=t.dtype), xp.ones(t.shape, dtype=t.dtype)]
        else:
            raw = [base - 1, base, base + 1, base + 2]
            weights = _cubic(xp, t, False)
            slopes = _cubic(xp, t, True)
    taps = []
    lo, hi = _extent(n, align_corners)
    for index, w, dw in zip(raw, weights, slopes):
        if padding_mode == "zeros":
            valid = (index >= 0) & (index < n)
            index = xp.clip(index, 0, n - 1)
        elif padding_mode == "border":
            valid = None
            index = xp.clip(index, 0, n - 1)
        else:
            valid = None
            index = xp.trunc(_reflect(xp, index.astype(pos.dtype), lo, hi)[0]).astype(xp.int64)
            index = xp.clip(index, 0, n - 1)
        taps.append((index, valid, w, dw))
    return taps


class _Sampling:
    """Where the outputs read x: per combination of taps over the axes, the flat index into an
    (n, c) plane, its weight (zero outside the image under zeros padding) and the pieces of its
    derivative per axis; shapes (N, M) with M the number of output positions."""

    def __init__(self, xp: Any, x_shape: Tuple[int, ...], grid: Any, mode: str, padding_mode: str,
                 align_corners: bool, with_slopes: bool = False):
        sizes = tuple(x_shape[2:])
        nsp = len(sizes)
        n = grid.shape[0]
        flat_grid = grid.reshape(n, -1, nsp)
        self.out_spatial = tuple(grid.shape[1:-1])
        self.axis_taps, self.slopes = [], []
        for d, size in enumerate(sizes):
            pos, slope = _position(xp, flat_grid[:, :, nsp - 1 - d], size, mode, padding_mode, align_corners)
            self.axis_taps.append(_axis_taps(xp, pos, size, mode, padding_mode, align_corners))
            self.slopes.append(slope)
        self.strides = [1] * nsp
        for d in range(nsp - 2, -1, -1):
            self.strides[d] = self.strides[d + 1] * sizes[d + 1]
        self.plane = self.strides[0] * sizes[0] if nsp else 1
        self.with_slopes = with_slopes

    def combos(self):
        """(flat index, weight, [d weight / d position on axis d]) per tap combination."""
        for combo in itertools.product(*self.axis_taps):
            flat, weight, valid = None, None, None
            for (index, ok, w, _), st in zip(combo, self.strides):
                term = index * st
                flat = term if flat is None else flat + term
                weight = w if weight is None else weight * w
                if ok is not None:
                    valid = ok if valid is None else valid & ok
            if valid is not None:
                weight = weight * valid
            parts = []
            if self.with_slopes:
                for d in range(len(combo)):
                    p = combo[d][3]
                    for e, (_, _, w, _) in enumerate(combo):
                        if e != d:
                            p = p * w
                    parts.append(p if valid is None else p * valid)
            yield flat, weight, parts


def _gather(xp: Any, planes: Any, flat: Any) -> Any:
    """planes (N, C, P) read at flat (N, M) -> (N, C, M)."""
    n, c, _ = planes.shape
    return xp.take_along_axis(planes, xp.broadcast_to(flat[:, None, :], (n, c, flat.shape[1])), axis=2)


def _check_runtime(x: Any, grid: Any) -> None:
    if grid.shape[0] != x.shape[0] or grid.shape[-1] != x.ndim - 2:
        raise ShapeError(f"grid_sample: grid of shape {grid.shape} does not fit x of shape {x.shape}")


# --------------------------------------------------------------------------- the ops

grid_sample = defop("grid_sample", num_inputs=2, pattern=OPAQUE, attrs=dict(_ATTRS), infer=_grid_sample_infer,
                    doc="x (N, C, spatial...) sampled at the grid's normalized points (N, out..., r) -> "
                        "(N, C, out...): nearest, linear or cubic; zeros, border or reflection padding.")


@grid_sample.kernel
def _(xp, x, grid, *, mode, padding_mode, align_corners, out=None):
    _check_runtime(x, grid)
    n, c = x.shape[:2]
    sampling = _Sampling(xp, x.shape, grid.astype(x.dtype, copy=False), mode, padding_mode, align_corners)
    planes = x.reshape(n, c, -1)
    acc = xp.zeros((n, c, grid[..., 0].size // max(n, 1)), dtype=x.dtype)
    if planes.shape[2]:
        for flat, weight, _ in sampling.combos():
            acc += _gather(xp, planes, flat) * weight[:, None, :].astype(x.dtype, copy=False)
    result = acc.reshape((n, c) + sampling.out_spatial)
    if out is None:
        return result
    out[...] = result
    return out


@grid_sample.grad
def _(node, g):
    x, grid = node.inputs
    return [grid_sample_grad_x(g, x, grid, **node.attrs), grid_sample_grad_grid(g, x, grid, **node.attrs)]


def _grad_x_infer(types, **attrs):
    g, x, grid = types
    _grid_sample_infer([x, grid], **attrs)
    return x.with_dtype(g.dtype)


grid_sample_grad_x = defop("grid_sample_grad_x", num_inputs=3, pattern=OPAQUE, attrs=dict(_ATTRS),
                           infer=_grad_x_infer, shape_only=(1,),
                           doc="Gradient of grid_sample w.r.t. x: (g, x, grid) -> g spread over the taps each "
                               "output read, with their weights (x is read for its shape).")


@grid_sample_grad_x.kernel
def _(xp, g, x, grid, *, mode, padding_mode, align_corners, out=None):
    _check_runtime(x, grid)
    n, c = x.shape[:2]
    sampling = _Sampling(xp, x.shape, grid.astype(g.dtype, copy=False), mode, padding_mode, align_corners)
    plane = sampling.plane
    gflat = g.reshape(n, c, -1)
    # one bincount over the whole (N, C, plane) range: the flat index gets the (n, c) plane's offset
    offsets = (xp.arange(n * c, dtype=xp.int64) * plane).reshape(n, c, 1)
    total = xp.zeros(n * c * plane, dtype=xp.float64)
    if plane and gflat.shape[2]:
        for flat, weight, _ in sampling.combos():
            where = (flat[:, None, :] + offsets).reshape(-1)
            contrib = (gflat * weight[:, None, :]).reshape(-1)
            total += xp.bincount(where, weights=contrib, minlength=n * c * plane)
    result = total.astype(g.dtype).reshape(x.shape)
    if out is None:
        return result
    out[...] = result
    return out


def _grad_grid_infer(types, **attrs):
    g, x, grid = types
    _grid_sample_infer([x, grid], **attrs)
    return grid


grid_sample_grad_grid = defop("grid_sample_grad_grid", num_inputs=3, pattern=OPAQUE, attrs=dict(_ATTRS),
                              infer=_grad_grid_infer,
                              doc="Gradient of grid_sample w.r.t. the grid: (g, x, grid) -> the tap weights' "
                                  "derivatives times the pixels read, times the coordinate mapping's slope.")


@grid_sample_grad_grid.kernel
def _(xp, g, x, grid, *, mode, padding_mode, align_corners, out=None):
    _check_runtime(x, grid)
    n, c = x.shape[:2]
    nsp = x.ndim - 2
    sampling = _Sampling(xp, x.shape, grid, mode, padding_mode, align_corners, with_slopes=True)
    planes = x.reshape(n, c, -1).astype(grid.dtype, copy=False)
    gflat = g.reshape(n, c, -1).astype(grid.dtype, copy=False)
    per_axis = [xp.zeros(gflat.shape[::2], dtype=grid.dtype) for _ in range(nsp)]     # (N, M) each
    if mode != "nearest" and planes.shape[2] and gflat.shape[2]:
        for flat, _, parts in sampling.combos():
            seen = (_gather(xp, planes, flat) * gflat).sum(axis=1)                     # (N, M)
            for d in range(nsp):
                per_axis[d] += seen * parts[d]
    # the grid's last axis lists the spatial axes last first
    result = xp.stack([per_axis[nsp - 1 - k] * sampling.slopes[nsp - 1 - k] for k in range(nsp)], axis=-1)
    result = result.reshape(grid.shape).astype(grid.dtype, copy=False)
    if out is None:
        return result
    out[...] = result
    return out
