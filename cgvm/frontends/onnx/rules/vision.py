"""Vision (and text) ONNX ops: GridSample, NonMaxSuppression, RoiAlign, ImageDecoder and TfIdfVectorizer on cgvm's
sampling, detection, roi, image and text ops; Col2Im and DeformConv composed of conv_transpose,
grid_sample and matmul."""
from __future__ import annotations

import numpy as np

from cgvm.ir.graph import const_value
from cgvm.ops import conv as CV
from cgvm.ops import detection as D
from cgvm.ops import elementwise as E
from cgvm.ops import image as IM
from cgvm.ops import indexing as I
from cgvm.ops import join as J
from cgvm.ops import linalg as L
from cgvm.ops import roi as ROI
from cgvm.ops import sampling as SA
from cgvm.ops import shape as shp
from cgvm.ops import text as TX

from ..translate import rule
from .common import const, ints

#: GridSample's mode names before opset 20
_OLD_MODES = {"bilinear": "linear", "bicubic": "cubic"}


@rule("GridSample")
def _grid_sample(n):
    mode = n.attr("mode", "linear" if n.opset >= 20 else "bilinear")
    mode = _OLD_MODES.get(mode, mode)
    padding = n.attr("padding_mode", "zeros")
    if mode not in SA.MODES or padding not in SA.PADDING_MODES:
        raise n.error(f"mode {mode!r} / padding_mode {padding!r}: GridSample knows modes {SA.MODES} and padding "
                      f"modes {SA.PADDING_MODES}")
    x, grid = n.input(0), n.input(1)
    if grid.dtype is not x.dtype:
        grid = E.cast(grid, dtype=x.dtype.np)
    return SA.grid_sample(x, grid, mode=mode, padding_mode=padding,
                          align_corners=bool(n.attr("align_corners", 0)))


def _optional_scalar(n, i, what, default):
    if not n.has_input(i):
        return default
    v = np.asarray(n.need_static(i, what)).reshape(-1)
    if v.size == 0:
        return default
    if v.size != 1:
        raise n.error(f"input {i} ({what}) must be a scalar, got {v.size} values")
    return v[0]


@rule("NonMaxSuppression")
def _nms(n):
    score_threshold = _optional_scalar(n, 4, "score_threshold", None)
    return D.non_max_suppression(
        n.input(0), n.input(1),
        max_output_boxes_per_class=int(_optional_scalar(n, 2, "max_output_boxes_per_class", 0)),
        iou_threshold=float(_optional_scalar(n, 3, "iou_threshold", 0.0)),
        score_threshold=None if score_threshold is None else float(score_threshold),
        center_point_box=bool(n.attr("center_point_box", 0)))


@rule("ImageDecoder")
def _image_decoder(n):
    fmt = n.attr("pixel_format", "RGB")
    if fmt not in IM.PIXEL_FORMATS:
        raise n.error(f"pixel_format {fmt!r} is not one of {IM.PIXEL_FORMATS}")
    return IM.decode_image(n.input(0), pixel_format=fmt)


@rule("Col2Im")
def _col2im(n):
    """Col2Im as the transposed convolution of the columns with a one-hot kernel per channel: block
    element j of channel c goes to offset j of c's window (a grouped conv_transpose), so windows
    that overlap add up, as ONNX's Col2Im does, and the gradient is conv's."""
    cols = n.input(0)
    image = ints(n.need_static(1, "image_shape"))
    block = ints(n.need_static(2, "block_shape"))
    nsp = len(image)
    if len(block) != nsp:
        raise n.error(f"image_shape {image} and block_shape {block} have different lengths")
    dil = ints(n.attr("dilations", [1] * nsp))
    strides = ints(n.attr("strides", [1] * nsp))
    pads = ints(n.attr("pads", [0] * (2 * nsp)))
    k = int(np.prod(block))
    if cols.ndim != 3 or cols.shape[1] is None or cols.shape[1] % k:
        raise n.error(f"the input must be (N, C x {k} block elements, blocks), got {cols.shape}")
    channels = cols.shape[1] // k
    counts = [(image[d] + pads[d] + pads[nsp + d] - (dil[d] * (block[d] - 1) + 1)) // strides[d] + 1
              for d in range(nsp)]
    if cols.shape[2] is not None and cols.shape[2] != int(np.prod(counts)):
        raise n.error(f"{cols.shape[2]} blocks, but image_shape {image} with these pads, strides and dilations "
                      f"holds {int(np.prod(counts))}")
    one_hot = np.zeros((channels * k, 1) + tuple(block), cols.dtype.np)
    for c in range(channels):
        for j, at in enumerate(np.ndindex(*block)):
            one_hot[(c * k + j, 0) + at] = 1
    grid = shp.reshape(cols, shape=(0, channels * k) + tuple(counts))
    full = [(counts[d] - 1) * strides[d] + dil[d] * (block[d] - 1) + 1 for d in range(nsp)]
    before, after = pads[:nsp], pads[nsp:]
    sym = [min(b, a) for b, a in zip(before, after)]
    # what cropping sym on both sides leaves past the image on each axis: grown or cut at the end
    grow = [image[d] - (full[d] - 2 * sym[d]) + (before[d] - sym[d]) for d in range(nsp)]
    y = CV.conv_transpose(grid, const_value(one_hot), stride=tuple(strides), pad=tuple(sym), dilation=tuple(dil),
                          groups=channels)
    if any(g > 0 for g in grow):       # the image runs past the last block: zeros there (no bias)
        flat = [0, 0, 0, 0]
        for g in grow:
            flat += [0, max(g, 0)]
        y = I.pad(y, pads=tuple(flat), mode="constant", value=0.0)
    if any(b != s for b, s in zip(before, sym)) or any(g < 0 for g in grow):
        y = I.slice(y, starts=tuple(b - s for b, s in zip(before, sym)),
                    stops=tuple(b - s + image[d] for d, (b, s) in enumerate(zip(before, sym))),
                    steps=(1,) * nsp, axes=tuple(range(2, 2 + nsp)))
    return y


@rule("DeformConv")
def _deform_conv(n):
    """Each kernel tap reads x at its regular position plus its learned offset, bilinearly (zero
    outside the image), scaled by the mask: grid_sample over all taps of all output positions, then
    the weights as one grouped matrix product."""
    x, w, offset = n.input(0), n.input(1), n.input(2)
    nsp = x.ndim - 2
    batch, channels = n.shape(0)[:2]
    sizes = n.spatial(0)
    kernel = ints(n.attr("kernel_shape", n.spatial(1)))
    strides = ints(n.attr("strides", [1] * nsp))
    dil = ints(n.attr("dilations", [1] * nsp))
    pads = ints(n.attr("pads", [0] * (2 * nsp)))
    group, og = int(n.attr("group", 1)), int(n.attr("offset_group", 1))
    out_sizes = tuple(offset.shape[2:])
    taps, length = int(np.prod(kernel)), int(np.prod(out_sizes)) if None not in out_sizes else None
    oc = w.shape[0]
    if length is None or channels % og or channels % group or oc % group or offset.shape[1] != og * taps * nsp:
        raise n.error(f"x {x.shape}, W {w.shape} and offset {offset.shape} do not fit group {group} and "
                      f"offset_group {og}")
    dt = x.dtype.np
    off = shp.reshape(offset, shape=(batch, og, taps, nsp, length))
    coords = []
    for d in reversed(range(nsp)):              # the grid lists the last spatial axis first
        tap = np.array([t[d] for t in np.ndindex(*kernel)]) * dil[d]
        out = np.array([o[d] for o in np.ndindex(*out_sizes)]) * strides[d] - pads[d]
        base = (tap[:, None] + out[None, :]).astype(dt)                             # (taps, length)
        pos = E.add(shp.reshape(I.slice(off, starts=(d,), stops=(d + 1,), steps=(1,), axes=(3,)),
                                shape=(batch, og, taps, length)), const(base, dtype=dt))
        # pixel positions as grid coordinates with align_corners off: (2·pos + 1) / size - 1
        coords.append(E.sub(E.mul(pos, const(2.0 / sizes[d], dtype=dt)), const(1.0 - 1.0 / sizes[d], dtype=dt)))
    grid = shp.reshape(J.stack(*coords, axis=-1), shape=(batch * og, taps * length) + (1,) * (nsp - 1) + (nsp,))
    planes = shp.reshape(x, shape=(batch * og, channels // og) + sizes)
    sampled = SA.grid_sample(planes, grid, mode="linear", padding_mode="zeros", align_corners=False)
    sampled = shp.reshape(sampled, shape=(batch, og, channels // og, taps, length))
    if n.has_input(4):
        sampled = E.mul(sampled, shp.reshape(n.input(4), shape=(batch, og, 1, taps, length)))
    cols = shp.reshape(sampled, shape=(batch, group, channels // group * taps, length))
    weights = shp.reshape(w, shape=(group, oc // group, channels // group * taps))
    y = shp.reshape(L.matmul(weights, cols), shape=(batch, oc) + out_sizes)
    if n.has_input(3):
        y = E.add(y, shp.reshape(n.input(3), shape=(1, oc) + (1,) * nsp))
    return y


@rule("TfIdfVectorizer")
def _tfidf(n):
    if n.attr("pool_strings") and not n.attr("pool_int64s"):
        raise n.error("TfIdfVectorizer over strings (pool_strings): cgvm has no string tensors; integer tokens "
                      "(pool_int64s) are supported")
    weights = n.attr("weights")
    return TX.tfidf_vectorize(
        n.input(0), pool=ints(n.attr("pool_int64s", [])), ngram_counts=ints(n.attr("ngram_counts", [])),
        ngram_indexes=ints(n.attr("ngram_indexes", [])), min_gram_length=int(n.attr("min_gram_length")),
        max_gram_length=int(n.attr("max_gram_length")), max_skip_count=int(n.attr("max_skip_count", 0)),
        mode=n.attr("mode", "TF"), weights=None if weights is None else [float(w) for w in weights])


@rule("RoiAlign")
def _roi_align(n):
    transform = n.attr("coordinate_transformation_mode", "half_pixel" if n.opset >= 16 else "output_half_pixel")
    if transform not in ("half_pixel", "output_half_pixel"):
        raise n.error(f"coordinate_transformation_mode {transform!r} is not half_pixel or output_half_pixel")
    idx = n.input(2)
    return ROI.roi_align(n.input(0), n.input(1), idx, mode=n.attr("mode", "avg"),
                         output_height=int(n.attr("output_height", 1)), output_width=int(n.attr("output_width", 1)),
                         sampling_ratio=int(n.attr("sampling_ratio", 0)),
                         spatial_scale=float(n.attr("spatial_scale", 1.0)), half_pixel=transform == "half_pixel")
