"""The SSD fork's layers (weiliu89/caffe, branch ssd): Permute, Normalize, PriorBox, DetectionOutput.

What each computes is restated in docs/caffe_forks.md (with the fork's own sources as the
reference); in short:

* Permute: a transpose; ``order`` names the bottom axis of each top axis, axes left out follow in
  their order (no order, or the identity order, passes the bottom through).
* Normalize: ``x / sqrt(sum x^2 + eps) * scale``; the sum over C x H x W of each item
  (``across_spatial``) or over C at each position; ``scale`` is one learned number
  (``channel_shared``) or one per channel, filled by ``scale_filler`` (default constant 1).
* PriorBox: the default boxes of a feature map, a constant of its shape and the image's: per
  position (row-major), per min_size: the min_size square, the sqrt(min_size * max_size) square
  (with a max_size), then one box per aspect ratio other than 1 (``flip`` adds 1/ar); corners are
  normalized by the image size, ``clip`` clips them to [0, 1]; channel 1 holds the variances.
* DetectionOutput: see cgvm/ops/detection.py.
"""
from __future__ import annotations

import math
import warnings
from typing import List

import numpy as np

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.fillers import constant_filler
from cgvm.frontends.caffe.layers.base import need_bottoms, register, scalar
from cgvm.ir.builder import as_value
from cgvm.ops import detection
from cgvm.ops import elementwise as ew
from cgvm.ops import elementwise_math as em
from cgvm.ops import reduce as red
from cgvm.ops import shape as shp



class DetectionFilesNotWritten(UserWarning):
    """A DetectionOutput layer's file-writing settings are read but not acted on."""


@register("Permute")
def permute(layer, bottoms, ctx):
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    order: List[int] = []
    for axis in layer.permute_param.order:
        if axis >= x.ndim:
            raise ctx.error(f"permute_param.order {axis} is not an axis of the {x.ndim}-axis bottom")
        if axis in order:
            raise ctx.error(f"permute_param.order names axis {axis} twice")
        order.append(int(axis))
    order += [a for a in range(x.ndim) if a not in order]
    if order == list(range(x.ndim)):
        return [x]
    return [shp.transpose(x, perm=tuple(order))]


@register("Normalize")
def normalize(layer, bottoms, ctx):
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    if x.ndim < 2:
        raise ctx.error(f"Normalize needs a bottom with at least 2 axes, got shape {tuple(x.shape)}")
    param = layer.norm_param
    channels = x.shape[1]
    if channels is None:
        raise ctx.error("Normalize needs the channel count (axis 1) known when the net is built")
    axes = tuple(range(1, x.ndim)) if param.across_spatial else (1,)
    norm = em.sqrt(ew.add(red.sum(ew.square(x), axis=axes, keepdims=True), scalar(param.eps, x)))
    filler = param.scale_filler if param.HasField("scale_filler") else constant_filler(1.0)
    scale = ctx.param(0, () if param.channel_shared else (int(channels),), filler)
    if not param.channel_shared:
        scale = shp.reshape(scale, shape=(1, int(channels)) + (1,) * (x.ndim - 2))
    return [ew.mul(ew.div(x, norm), scale)]


def _aspect_ratios(param) -> List[float]:
    ratios = [1.0]
    for ar in param.aspect_ratio:
        if any(abs(ar - seen) < 1e-6 for seen in ratios):
            continue
        ratios.append(float(ar))
        if param.flip:
            ratios.append(1.0 / ar)
    return ratios


def prior_boxes(param, layer_hw, image_hw, ctx=None) -> np.ndarray:
    """The PriorBox top (1 x 2 x H*W*priors*4, float32) for a feature map and image size."""
    def fail(message):
        raise (ctx.error(message) if ctx is not None else ValueError(message))

    if not param.min_size:
        fail("prior_box_param needs min_size")
    mins = [float(s) for s in param.min_size]
    maxs = [float(s) for s in param.max_size]
    if any(s <= 0 for s in mins):
        fail("prior_box_param.min_size must be positive")
    if maxs and len(maxs) != len(mins):
        fail(f"prior_box_param has {len(mins)} min_size but {len(maxs)} max_size values")
    if any(mx <= mn for mn, mx in zip(mins, maxs)):
        fail("prior_box_param.max_size must be greater than min_size")
    if len(param.variance) not in (0, 1, 4) or any(v <= 0 for v in param.variance):
        fail("prior_box_param.variance takes 1 or 4 positive values")
    if (param.HasField("img_h") or param.HasField("img_w")) and param.HasField("img_size"):
        fail("prior_box_param: give img_size or img_h/img_w, not both")
    if (param.HasField("step_h") or param.HasField("step_w")) and param.HasField("step"):
        fail("prior_box_param: give step or step_h/step_w, not both")
    height, width = layer_hw
    if param.HasField("img_h") or param.HasField("img_w"):
        img_h, img_w = param.img_h, param.img_w
    elif param.HasField("img_size"):
        img_h = img_w = param.img_size
    else:
        img_h, img_w = image_hw
    if not img_h or not img_w:
        fail("prior_box_param: the image size must be positive (img_size, img_h/img_w or bottom[1])")
    if param.HasField("step_h") or param.HasField("step_w"):
        step_h, step_w = param.step_h, param.step_w
    elif param.HasField("step"):
        step_h = step_w = param.step
    else:
        step_h = step_w = 0.0
    if not step_h or not step_w:   # the fork's default: the image spread evenly over the feature map
        step_h, step_w = np.float32(img_h) / np.float32(height), np.float32(img_w) / np.float32(width)
    ratios = _aspect_ratios(param)
    sizes = []   # (box width, box height) of each prior at a position, in the fork's order
    for s, size in enumerate(mins):
        size = int(size)   # the fork reads min_size (and max_size) into an int
        sizes.append((size, size))
        if maxs:
            side = math.sqrt(size * int(maxs[s]))
            sizes.append((side, side))
        sizes += [(size * math.sqrt(ar), size / math.sqrt(ar)) for ar in ratios if abs(ar - 1.0) >= 1e-6]
    box = np.asarray(sizes, np.float32)                                        # priors x 2
    cy = (np.arange(height, dtype=np.float32) + np.float32(param.offset)) * np.float32(step_h)
    cx = (np.arange(width, dtype=np.float32) + np.float32(param.offset)) * np.float32(step_w)
    cx, cy = np.meshgrid(cx, cy)                                               # H x W
    cx, cy = cx[..., None], cy[..., None]
    half_w, half_h = box[:, 0] / np.float32(2), box[:, 1] / np.float32(2)
    corners = np.stack([(cx - half_w) / np.float32(img_w), (cy - half_h) / np.float32(img_h),
                        (cx + half_w) / np.float32(img_w), (cy + half_h) / np.float32(img_h)], axis=-1)
    corners = corners.astype(np.float32).reshape(-1)
    if param.clip:
        corners = np.clip(corners, 0.0, 1.0)
    variance = list(param.variance) or [0.1]
    variances = np.resize(np.asarray(variance, np.float32), corners.shape) if len(variance) == 4 else \
        np.full(corners.shape, variance[0], np.float32)
    return np.stack([corners, variances])[None].astype(np.float32)


@register("PriorBox")
def prior_box(layer, bottoms, ctx):
    need_bottoms(bottoms, (1, 2), ctx)
    feature = bottoms[0]
    image = bottoms[1] if len(bottoms) > 1 else None
    if feature.ndim != 4 or any(d is None for d in feature.shape[2:]):
        raise ctx.error(f"PriorBox needs a 4-D feature map of known height and width, got {tuple(feature.shape)}")
    image_hw = (0, 0)
    if image is not None:
        if image.ndim != 4 or any(d is None for d in image.shape[2:]):
            raise ctx.error(f"PriorBox's image bottom must be 4-D with known height and width, got {tuple(image.shape)}")
        image_hw = (int(image.shape[2]), int(image.shape[3]))
    boxes = prior_boxes(layer.prior_box_param, (int(feature.shape[2]), int(feature.shape[3])), image_hw, ctx)
    return [as_value(boxes.astype(feature.dtype.np, copy=False))]


@register("DetectionOutput")
def detection_output(layer, bottoms, ctx):
    need_bottoms(bottoms, (3, 4), ctx)   # a 4th bottom (the image, for visualizing) is allowed and unused
    loc, conf, prior = bottoms[:3]
    param = layer.detection_output_param
    if not param.HasField("num_classes"):
        raise ctx.error("detection_output_param needs num_classes")
    if param.visualize:
        raise ctx.error("detection_output_param.visualize draws the detections in an OpenCV window; cgvm does not "
                        "(remove it and draw the [image, label, score, box] rows of the top)")
    save = param.save_output_param
    if save.output_directory or param.save_file:
        # released SSD deploy files keep the evaluation's output settings; the detections are the top either way
        warnings.warn(f"{ctx.where}: detection_output_param asks to also write the detections to files "
                      "(save_output_param.output_directory / save_file); cgvm does not write them, the top "
                      "holds them", DetectionFilesNotWritten, stacklevel=2)
    nms = param.nms_param
    if nms.nms_threshold < 0:
        raise ctx.error("nms_param.nms_threshold must be non-negative")
    if not 0 < nms.eta <= 1:
        raise ctx.error("nms_param.eta must be in (0, 1]")
    attrs = dict(num_classes=int(param.num_classes), share_location=bool(param.share_location),
                 background_label_id=int(param.background_label_id), nms_threshold=float(nms.nms_threshold),
                 top_k=int(nms.top_k) if nms.HasField("top_k") else -1, eta=float(nms.eta),
                 code_type=int(param.code_type), variance_encoded_in_target=bool(param.variance_encoded_in_target),
                 keep_top_k=int(param.keep_top_k),
                 confidence_threshold=float(param.confidence_threshold) if param.HasField("confidence_threshold")
                 else -detection.FLT_MAX)
    try:
        return [detection.detection_output(loc, conf, prior, **attrs)]
    except Exception as exc:   # a shape rule's message, in the layer's terms
        raise ctx.error(str(exc)) from exc
