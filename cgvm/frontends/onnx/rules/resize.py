"""Resize and Upsample: separable interpolation, one axis at a time, as a gather of the source
taps (clamped to the edge) weighted by coefficients computed here from the static sizes.

Every mode of Resize-19 is covered: nearest (four rounding modes), linear and cubic (with
antialias on downscaling and exclude_outside), the coordinate transformations half_pixel,
half_pixel_symmetric, pytorch_half_pixel, align_corners, asymmetric and tf_crop_and_resize (with
extrapolation_value), sizes with keep_aspect_ratio_policy, axes. The result is a differentiable
take/mul/sum over cgvm ops.
"""
from __future__ import annotations

import math

import numpy as np

from cgvm.ir.graph import const_value
from cgvm.ops import elementwise as E
from cgvm.ops import indexing as I
from cgvm.ops import reduce as R

from ..translate import rule
from .common import axis_of, ints


def _source_coords(mode, out_idx, scale, n_in, out_len_f, out_len, roi):
    """x_original for output positions ``out_idx`` on one axis, and which are extrapolated."""
    extrapolated = None
    if mode == "align_corners":
        x = np.zeros(out_len) if out_len_f == 1 else out_idx * (n_in - 1) / (out_len_f - 1)
    elif mode == "asymmetric":
        x = out_idx / scale
    elif mode == "tf_crop_and_resize":
        lo, hi = roi
        x = np.full(out_len, (hi - lo) * (n_in - 1) / 2) if out_len_f == 1 else \
            out_idx * (hi - lo) * (n_in - 1) / (out_len_f - 1)
        x = x + lo * (n_in - 1)
        extrapolated = (x < 0) | (x > n_in - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out_len, -0.5) if out_len_f == 1 else (out_idx + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (out_idx + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        adjust = out_len / out_len_f
        x = (n_in / 2) * (1 - adjust) + (out_idx + 0.5) / scale - 0.5
    else:
        raise ValueError(f"coordinate_transformation_mode {mode!r} is not supported")
    return x, extrapolated


def _cubic(d, a):
    d = np.abs(d)
    return np.where(d <= 1, (a + 2) * d ** 3 - (a + 3) * d ** 2 + 1,
                    np.where(d < 2, a * d ** 3 - 5 * a * d ** 2 + 8 * a * d - 4 * a, 0.0))


def _coefficients(kind, ratio, scale, antialias, a, nearest_mode):
    """Tap weights (out, n) for fractional offsets ``ratio`` (1 where the source is an integer)."""
    if kind == "nearest":
        integer = ratio == 1.0
        upper = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                 "floor": np.zeros_like(ratio, bool), "ceil": np.ones_like(ratio, bool)}[nearest_mode]
        upper = upper | integer
        return np.stack([~upper, upper], axis=1).astype(np.float64)
    if not antialias:
        if kind == "linear":
            return np.stack([1 - ratio, ratio], axis=1)
        return np.stack([_cubic(ratio + 1, a), _cubic(ratio, a), _cubic(1 - ratio, a), _cubic(2 - ratio, a)], axis=1)
    s = min(scale, 1.0)
    if kind == "linear":
        start = int(np.floor(-1 / s) + 1)
        offs = np.arange(start, start + 2 - 2 * start)
        w = np.clip(1 - np.abs((offs[None, :] - ratio[:, None]) * s), 0, 1)
    else:
        start = int(np.floor(-2 / s) + 1)
        offs = np.arange(start, 2 - start)
        w = _cubic(s * (offs[None, :] - ratio[:, None]), a)
    return w / w.sum(axis=1, keepdims=True)


def _axis_taps(kind, x, n_in, scale, antialias, a, nearest_mode, exclude_outside):
    """(indices (out, n) into the input axis, weights (out, n))."""
    floor = np.floor(x).astype(np.int64)
    ratio = np.where(x == floor, 1.0, x - floor)
    w = _coefficients(kind, ratio, scale, antialias, a, nearest_mode)
    n = w.shape[1]
    pad = int(math.ceil(n / 2))
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        off = np.where(frac <= 0.5, base, base + 1)
    idx = (p + off)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, n_in - 1), w


def resize(n, x, scales, sizes, roi, axes, *, mode, ctm, a=-0.75, exclude_outside=False, extrapolation=0.0,
           policy="stretch", nearest_mode="round_prefer_floor", antialias=False):
    shape = n.shape(0)
    r = len(shape)
    axes = [axis_of(ax, r) for ax in axes] if axes is not None else list(range(r))
    full_scales = [1.0] * r
    out = list(shape)
    full_roi = [0.0] * r + [1.0] * r
    if roi is not None and len(roi):
        for i, d in enumerate(axes):
            full_roi[d], full_roi[r + d] = float(roi[i]), float(roi[len(axes) + i])
    if sizes is not None:
        for i, d in enumerate(axes):
            out[d] = int(sizes[i])
        full_scales = [out[i] / shape[i] for i in range(r)]
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            s = pick(full_scales[d] for d in axes)
            full_scales = [s if i in axes else 1.0 for i in range(r)]
            out = [int(s * shape[i] + 0.5) if i in axes else shape[i] for i in range(r)]
    else:
        for i, d in enumerate(axes):
            full_scales[d] = float(scales[i])
        out = [int(full_scales[i] * shape[i]) if i in axes else shape[i] for i in range(r)]
    y = x
    kind = mode
    work_float = kind != "nearest"
    if work_float and not x.dtype.is_float:
        raise n.error(f"{kind} interpolation of {x.dtype.name} tensors is not supported")
    extrap_masks = []
    for d in axes:
        scale, m = full_scales[d], out[d]
        unchanged = math.isclose(scale, 1.0) and m == shape[d] and (
            ctm != "tf_crop_and_resize" or (math.isclose(full_roi[d], 0) and math.isclose(full_roi[r + d], 1)))
        if unchanged:
            continue
        xs, extra = _source_coords(ctm, np.arange(m, dtype=np.float64), scale, shape[d], scale * shape[d], m,
                                   (full_roi[d], full_roi[r + d]))
        idx, w = _axis_taps(kind, xs, shape[d], scale, antialias, a, nearest_mode, exclude_outside)
        if extra is not None and extra.any():
            extrap_masks.append((d, extra))
        if kind == "nearest":
            pick = idx[np.arange(m), np.argmax(w, axis=1)]
            y = I.take(y, const_value(pick.astype(np.int64)), axis=d)
            continue
        taps = I.take(y, const_value(idx.astype(np.int64)), axis=d)          # (..., m, n, ...)
        wshape = (1,) * d + w.shape + (1,) * (r - d - 1)
        y = R.sum(E.mul(taps, const_value(w.reshape(wshape).astype(x.dtype.np))), axis=(d + 1,), keepdims=False)
    if extrap_masks:
        mask = np.zeros(tuple(out), bool)
        for d, extra in extrap_masks:
            mask |= extra.reshape((1,) * d + (-1,) + (1,) * (r - d - 1))
        y = E.where(const_value(mask), const_value(np.asarray(extrapolation, x.dtype.np)), y)
    return y


@rule("Resize")
def _resize(n):
    x = n.input(0)
    if n.opset < 11:
        roi, scales, sizes = None, n.need_static(1, "scales"), None
    else:
        roi = n.static(1) if n.has_input(1) else None
        scales = n.static(2) if n.has_input(2) else None
        sizes = n.static(3) if n.has_input(3) else None
        if n.has_input(2) and scales is None or n.has_input(3) and sizes is None:
            raise n.error("scales and sizes must be known when the model is translated")
        if scales is not None and np.asarray(scales).size == 0:
            scales = None
    ctm = n.attr("coordinate_transformation_mode", "half_pixel" if n.opset >= 11 else "asymmetric")
    mode = n.attr("mode", "nearest")
    if n.opset < 11 and mode == "linear":
        ctm = "asymmetric"
    return resize(n, x, None if scales is None else np.asarray(scales, np.float64).reshape(-1),
                  None if sizes is None else ints(sizes), None if roi is None else np.asarray(roi).reshape(-1),
                  n.attr("axes"), mode=mode, ctm=ctm, a=float(n.attr("cubic_coeff_a", -0.75)),
                  exclude_outside=bool(n.attr("exclude_outside", 0)),
                  extrapolation=float(n.attr("extrapolation_value", 0.0)),
                  policy=n.attr("keep_aspect_ratio_policy", "stretch"),
                  nearest_mode=n.attr("nearest_mode", "round_prefer_floor" if n.opset >= 11 else "floor"),
                  antialias=bool(n.attr("antialias", 0)))


@rule("Upsample")
def _upsample(n):
    scales = n.attr("scales") if n.opset < 9 else n.need_static(1, "scales")
    return resize(n, n.input(0), np.asarray(scales, np.float64).reshape(-1), None, None, None,
                  mode=n.attr("mode", "nearest"), ctm="asymmetric", nearest_mode="floor")
