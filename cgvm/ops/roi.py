"""Pooling regions of interest: roi_align (ONNX RoiAlign, Mask R-CNN's RoIAlign) and its gradient.

    roi_align(x, rois, batch_indices, mode="avg", output_height=1, output_width=1, sampling_ratio=0,
              spatial_scale=1.0, half_pixel=True) -> (rois, C, output_height, output_width)

``x`` is (N, C, H, W); each row of ``rois`` (R, 4) is a box (x1, y1, x2, y2) in input coordinates
of image ``batch_indices[r]``, scaled by ``spatial_scale`` (and shifted by -0.5 with
``half_pixel``; without it a box is at least 1 x 1). The box is split into output_height x
output_width bins; each bin is sampled on a regular grid of ``sampling_ratio`` points per axis
(0: ceil(bin size) points), each point read bilinearly (a point more than one pixel outside the
image reads 0; one inside that margin is clamped to the edge). "avg" averages the samples of a
bin; "max" takes, as ONNX defines it, the largest of the weighted corner values w·x over the
samples of the bin. How many samples a box takes depends on its size, so the kernel walks the
boxes on the host; the gathers run on x's backend.

Gradient: with respect to x, each output's gradient goes back to the pixels its samples read
with their weights (for "max", to the winning corner); with respect to the boxes it is taken as
zero (as torchvision's and Detectron's RoIAlign do: the sampling positions are not differentiated).
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Tuple

import numpy as np

from ..errors import ShapeError
from ..ir.attrs import Bool, Float, Int, Str
from ..ir.types import TensorType
from .registry import OPAQUE, defop
from .rules import require_float

_ATTRS = {"mode": Str("avg", choices=("avg", "max")), "output_height": Int(1), "output_width": Int(1),
          "sampling_ratio": Int(0), "spatial_scale": Float(1.0), "half_pixel": Bool(True)}


def _infer(types, mode, output_height, output_width, sampling_ratio, spatial_scale, half_pixel):
    x, rois, idx = types
    require_float(x, "roi_align: x")
    require_float(rois, "roi_align: rois")
    if x.ndim != 4:
        raise ShapeError(f"roi_align: x must be (N, C, H, W), got {x!r}")
    if rois.ndim != 2 or rois.shape[1] not in (None, 4):
        raise ShapeError(f"roi_align: rois must be (R, 4) boxes (x1, y1, x2, y2), got {rois!r}")
    if idx.ndim != 1 or not idx.dtype.is_int:
        raise ShapeError(f"roi_align: batch_indices must be a 1-D integer tensor, got {idx!r}")
    if rois.shape[0] is not None and idx.shape[0] is not None and rois.shape[0] != idx.shape[0]:
        raise ShapeError(f"roi_align: {rois.shape[0]} boxes but {idx.shape[0]} batch indices")
    if output_height < 1 or output_width < 1 or sampling_ratio < 0:
        raise ShapeError(f"roi_align: output {output_height} x {output_width} and sampling_ratio {sampling_ratio} "
                         "must be positive (the ratio may be 0: adaptive)")
    return TensorType((rois.shape[0], x.shape[1], output_height, output_width), x.dtype)


def _axis_samples(start: float, bin_size: float, bins: int, per_bin: int, size: int):
    """Per (bin, sample) on one axis: low and high pixel, their weights, and whether it reads anything."""
    pos = start + np.arange(bins)[:, None] * bin_size + (np.arange(per_bin)[None, :] + 0.5) * bin_size / per_bin
    valid = (pos >= -1.0) & (pos <= size)
    pos = np.maximum(pos, 0.0)
    low = pos.astype(np.int64)
    at_edge = low >= size - 1
    low = np.where(at_edge, size - 1, low)
    high = np.where(at_edge, size - 1, low + 1)
    pos = np.where(at_edge, low, pos)
    frac = pos - low
    return low, high, 1.0 - frac, frac, valid


def roi_taps(h: int, w: int, box: np.ndarray, *, output_height: int, output_width: int, sampling_ratio: int,
             spatial_scale: float, half_pixel: bool) -> Tuple[np.ndarray, np.ndarray, int]:
    """For one box: flat in-plane pixel indices and weights, both (oh, ow, samples, 4), and the
    divisor of the average."""
    shift = 0.5 if half_pixel else 0.0
    x1, y1, x2, y2 = (float(v) * spatial_scale - shift for v in box)
    rw, rh = x2 - x1, y2 - y1
    if not half_pixel:
        rw, rh = max(rw, 1.0), max(rh, 1.0)
    bh, bw = rh / output_height, rw / output_width
    gh = sampling_ratio if sampling_ratio > 0 else int(math.ceil(rh / output_height))
    gw = sampling_ratio if sampling_ratio > 0 else int(math.ceil(rw / output_width))
    count = max(gh * gw, 1)
    gh, gw = max(gh, 0), max(gw, 0)
    yl, yh, wyl, wyh, vy = _axis_samples(y1, bh, output_height, gh, h)     # (oh, gh)
    xl, xh, wxl, wxh, vx = _axis_samples(x1, bw, output_width, gw, w)      # (ow, gw)

    def grid(a, b):   # (oh, gh) and (ow, gw) -> (oh, ow, gh·gw)
        return (a[:, None, :, None] * b[None, :, None, :]).reshape(output_height, output_width, gh * gw)

    def pix(ya, xb):
        return (ya[:, None, :, None] * w + xb[None, :, None, :]).reshape(output_height, output_width, gh * gw)

    valid = grid(vy, vx)
    index = np.stack([pix(yl, xl), pix(yl, xh), pix(yh, xl), pix(yh, xh)], axis=-1)
    weight = np.stack([grid(wyl, wxl), grid(wyl, wxh), grid(wyh, wxl), grid(wyh, wxh)], axis=-1) * valid[..., None]
    return index, weight, count


def _boxes(xp: Any, x_shape: Tuple[int, ...], rois: Any, batch_indices: Any, attrs: dict
           ) -> Iterator[Tuple[int, int, np.ndarray, np.ndarray, int]]:
    host = rois.get() if hasattr(rois, "get") and not isinstance(rois, np.ndarray) else np.asarray(rois)
    idx = batch_indices.get() if hasattr(batch_indices, "get") and not isinstance(batch_indices, np.ndarray) \
        else np.asarray(batch_indices)
    n, _, h, w = x_shape
    if host.shape[0] != idx.shape[0]:
        raise ShapeError(f"roi_align: {host.shape[0]} boxes but {idx.shape[0]} batch indices")
    for r in range(host.shape[0]):
        b = int(idx[r])
        if not 0 <= b < n:
            raise ShapeError(f"roi_align: box {r} names image {b} of a batch of {n}")
        index, weight, count = roi_taps(h, w, host[r], **attrs)
        yield r, b, index, weight, count


def _tap_values(xp: Any, plane: Any, index: np.ndarray, weight: np.ndarray) -> Any:
    """(C, oh, ow, samples, 4): the weighted corner values w·x of one box."""
    c = plane.shape[0]
    read = xp.take(plane.reshape(c, -1), xp.asarray(index.reshape(-1)), axis=1).reshape((c,) + index.shape)
    return read * xp.asarray(weight.astype(plane.dtype))


roi_align = defop("roi_align", num_inputs=3, pattern=OPAQUE, attrs=dict(_ATTRS), infer=_infer,
                  doc="RoIAlign: each box's bins sampled bilinearly and averaged (or maxed): "
                      "(rois, C, output_height, output_width).")


@roi_align.kernel
def _(xp, x, rois, batch_indices, *, mode, out=None, **attrs):
    c = x.shape[1]
    target = xp.zeros((rois.shape[0], c, attrs["output_height"], attrs["output_width"]), dtype=x.dtype) \
        if out is None else out
    if out is not None:
        target[...] = 0
    for r, b, index, weight, count in _boxes(xp, x.shape, rois, batch_indices, attrs):
        if not index.shape[2]:
            continue              # a box with no samples pools to 0
        vals = _tap_values(xp, x[b], index, weight)
        target[r] = vals.sum(axis=(3, 4)) / count if mode == "avg" else vals.max(axis=4).max(axis=3)
    return target


@roi_align.grad
def _(node, g):
    x, rois, idx = node.inputs
    return [roi_align_grad(g, x, rois, idx, **node.attrs), None, None]


def _grad_infer(types, **attrs):
    g, x, rois, idx = types
    _infer([x, rois, idx], **attrs)
    return x.with_dtype(g.dtype)


roi_align_grad = defop("roi_align_grad", num_inputs=4, pattern=OPAQUE, attrs=dict(_ATTRS), infer=_grad_infer,
                       doc="Gradient of roi_align w.r.t. x: (g, x, rois, batch_indices) -> each output's gradient "
                           "back at the pixels its samples read (the winning corner for max).")


@roi_align_grad.kernel
def _(xp, g, x, rois, batch_indices, *, mode, out=None, **attrs):
    n, c, h, w = x.shape
    plane = h * w
    total = xp.zeros((n, c * plane), dtype=xp.float64)
    channel_offset = (xp.arange(c, dtype=xp.int64) * plane)[:, None]
    for r, b, index, weight, count in _boxes(xp, x.shape, rois, batch_indices, attrs):
        if not index.shape[2]:
            continue
        oh, ow, samples, _ = index.shape
        gr = g[r].astype(xp.float64).reshape(c, oh, ow, 1, 1)
        if mode == "avg":
            where = xp.broadcast_to(xp.asarray(index)[None], (c,) + index.shape).reshape(c, -1)
            amount = (gr * xp.asarray(weight)[None] / count).reshape(c, -1)
        else:
            vals = _tap_values(xp, x[b], index, weight).reshape(c, oh, ow, samples * 4)
            best = xp.argmax(vals, axis=3)[..., None]                                   # the first largest
            where = xp.take_along_axis(xp.broadcast_to(xp.asarray(index.reshape(oh, ow, -1))[None],
                                                       (c, oh, ow, samples * 4)), best, axis=3).reshape(c, -1)
            chosen = xp.take_along_axis(xp.broadcast_to(xp.asarray(weight.reshape(oh, ow, -1))[None],
                                                        (c, oh, ow, samples * 4)), best, axis=3)
            amount = (gr.reshape(c, oh, ow, 1) * chosen).reshape(c, -1)
        total[b] += xp.bincount((where + channel_offset).reshape(-1), weights=amount.reshape(-1),
                                minlength=c * plane)
    result = total.astype(g.dtype).reshape(x.shape)
    if out is None:
        return result
    out[...] = result
    return out
