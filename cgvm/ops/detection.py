"""Detection ops: SSD's DetectionOutput (decode boxes against priors, per-class NMS, top-k), and ONNX's
NonMaxSuppression (non_max_suppression, at the end).

    detection_output(loc, conf, prior, num_classes=, ...) -> (1, 1, kept, 7)

``loc`` is N x (P * L * 4) box offsets (L = 1 with a shared location, else one set per class),
``conf`` N x (P * C) class probabilities, ``prior`` 1 x 2 x (P * 4): the priors' corners
(xmin, ymin, xmax, ymax, normalized) then their four variances. Each kept detection is a row
``[image, label, score, xmin, ymin, xmax, ymax]``: per image, labels ascending, scores descending
within a label. With nothing kept the output is one row of -1 per image (its image index first),
as in the SSD fork. How many rows survive depends on the values, so the row count is known only at
run time and the kernel cannot write into a planned buffer; it runs on the host (the work is
sorting and a greedy loop) and hands back an array of the input's backend. Not differentiable:
the fork has no backward either.

The rules (from the SSD fork's bbox_util and DetectionOutput CPU code, restated): a score takes
part only if it is above ``confidence_threshold``; candidates are sorted by score (stable), cut to
``top_k``, and greedily kept while their Jaccard overlap with every box already kept is at most
the threshold, which is multiplied by ``eta`` after each keep while above 0.5; then, when an image
has more than ``keep_top_k`` detections over all classes, only the best ``keep_top_k`` stay.
"""
from __future__ import annotations

from typing import Any, List

import numpy as np

from ..errors import ShapeError
from ..ir.attrs import Bool, Float, Int
from ..ir.types import TensorType
from .registry import OPAQUE, defop

CORNER, CENTER_SIZE, CORNER_SIZE = 1, 2, 3      # PriorBoxParameter.CodeType
FLT_MAX = float(np.finfo(np.float32).max)        # "no confidence threshold" is -FLT_MAX, as in the fork


def _detection_infer(types, num_classes, share_location, **_):
    loc, conf, prior = types
    for t, what in ((loc, "loc"), (conf, "conf"), (prior, "prior")):
        if not t.dtype.is_float:
            raise ShapeError(f"detection_output: {what} must be a float tensor, got {t!r}")
    if prior.ndim != 3 or prior.shape[1] not in (None, 2):
        raise ShapeError(f"detection_output: the priors must be 1 x 2 x (4 * priors), got {prior!r}")
    priors = None if prior.shape[2] is None else prior.shape[2] // 4
    loc_classes = 1 if share_location else num_classes
    if priors is not None:
        if prior.shape[2] % 4:
            raise ShapeError(f"detection_output: the priors' last axis ({prior.shape[2]}) is not 4 per prior")
        for t, per, what in ((loc, loc_classes * 4, "loc"), (conf, num_classes, "conf")):
            width = t.shape[1:]
            if all(d is not None for d in width) and int(np.prod(width)) != priors * per:
                raise ShapeError(f"detection_output: {what} has {int(np.prod(width))} values per image, expected "
                                 f"{priors} priors x {per} = {priors * per}")
    if loc.shape[0] is not None and conf.shape[0] is not None and loc.shape[0] != conf.shape[0]:
        raise ShapeError(f"detection_output: loc has {loc.shape[0]} images, conf {conf.shape[0]}")
    return TensorType((1, 1, None, 7), loc.dtype)


detection_output = defop(
    "detection_output", num_inputs=3, pattern=OPAQUE, writes_out=False, differentiable=False,
    attrs={"num_classes": Int(), "share_location": Bool(True), "background_label_id": Int(0),
           "nms_threshold": Float(0.3), "top_k": Int(-1), "eta": Float(1.0), "code_type": Int(CORNER),
           "variance_encoded_in_target": Bool(False), "keep_top_k": Int(-1),
           "confidence_threshold": Float(-FLT_MAX)},
    infer=_detection_infer,
    doc="SSD's DetectionOutput: [image, label, score, xmin, ymin, xmax, ymax] rows of the kept boxes.")


def decode_boxes(prior: np.ndarray, variance: np.ndarray, offsets: np.ndarray, code_type: int,
                 variance_encoded_in_target: bool) -> np.ndarray:
    """Boxes (xmin, ymin, xmax, ymax) from per-prior offsets (P x 4 each), in float32 as the fork computes."""
    prior = prior.astype(np.float32)
    v = np.ones_like(variance, dtype=np.float32) if variance_encoded_in_target else variance.astype(np.float32)
    t = offsets.astype(np.float32) * v
    if code_type == CORNER:
        return prior + t
    width = prior[:, 2] - prior[:, 0]
    height = prior[:, 3] - prior[:, 1]
    if (width <= 0).any() or (height <= 0).any():
        raise ValueError("detection_output: a prior box has no width or height")
    if code_type == CORNER_SIZE:
        scale = np.stack([width, height, width, height], axis=1)
        return prior + t * scale
    if code_type != CENTER_SIZE:
        raise ValueError(f"detection_output: unknown code_type {code_type}")
    cx = t[:, 0] * width + (prior[:, 0] + prior[:, 2]) / np.float32(2)
    cy = t[:, 1] * height + (prior[:, 1] + prior[:, 3]) / np.float32(2)
    w = np.exp(t[:, 2]) * width
    h = np.exp(t[:, 3]) * height
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1).astype(np.float32)


def box_areas(boxes: np.ndarray) -> np.ndarray:
    """Normalized areas; a box with max < min has area 0."""
    w = boxes[..., 2] - boxes[..., 0]
    h = boxes[..., 3] - boxes[..., 1]
    return np.where((w < 0) | (h < 0), np.float32(0), w * h)


def jaccard(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Intersection over union of one box with each of ``others`` (0 where they do not overlap)."""
    apart = ((others[:, 0] > box[2]) | (others[:, 2] < box[0]) | (others[:, 1] > box[3]) | (others[:, 3] < box[1]))
    iw = np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0])
    ih = np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1])
    overlap = ~apart & (iw > 0) & (ih > 0)
    inter = np.where(overlap, iw * ih, np.float32(0))
    union = box_areas(box[None])[0] + box_areas(others) - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(overlap, inter / union, np.float32(0))


def nms(boxes: np.ndarray, scores: np.ndarray, score_threshold: float, nms_threshold: float, eta: float,
        top_k: int) -> List[int]:
    """Indices kept by the fork's ApplyNMSFast, best score first."""
    candidates = np.nonzero(scores > np.float32(score_threshold))[0]
    order = candidates[np.argsort(-scores[candidates], kind="stable")]
    if top_k > -1:
        order = order[:top_k]
    kept: List[int] = []
    threshold = nms_threshold
    for index in order:
        if kept and (jaccard(boxes[index], boxes[kept]) > threshold).any():
            continue
        kept.append(int(index))
        if eta < 1 and threshold > 0.5:
            threshold *= eta
    return kept


def detect(loc: np.ndarray, conf: np.ndarray, prior: np.ndarray, *, num_classes: int, share_location: bool,
           background_label_id: int, nms_threshold: float, top_k: int, eta: float, code_type: int,
           variance_encoded_in_target: bool, keep_top_k: int, confidence_threshold: float) -> np.ndarray:
    """The rows DetectionOutput produces for one batch (host NumPy arrays in, float32 rows out)."""
    images = loc.shape[0]
    priors = prior.shape[2] // 4
    loc_classes = 1 if share_location else num_classes
    corners = prior[0, 0].reshape(priors, 4)
    variances = prior[0, 1].reshape(priors, 4)
    offsets = loc.reshape(images, priors, loc_classes, 4)
    scores = conf.reshape(images, priors, num_classes)
    rows = []
    for i in range(images):
        decoded = {}
        for c in range(loc_classes):
            label = -1 if share_location else c
            if not share_location and c == background_label_id:
                continue
            decoded[label] = decode_boxes(corners, variances, offsets[i, :, c], code_type, variance_encoded_in_target)
        kept = {}
        for c in range(num_classes):
            if c == background_label_id or (-1 if share_location else c) not in decoded:
                continue
            kept[c] = nms(decoded[-1 if share_location else c], scores[i, :, c], confidence_threshold,
                          nms_threshold, eta, top_k)
        total = sum(len(v) for v in kept.values())
        if keep_top_k > -1 and total > keep_top_k:
            pairs = [(scores[i, idx, c], c, idx) for c in sorted(kept) for idx in kept[c]]
            order = sorted(range(len(pairs)), key=lambda k: -pairs[k][0])[:keep_top_k]   # stable
            best = {}
            for k in order:
                best.setdefault(pairs[k][1], []).append(pairs[k][2])
            kept = best
        for c in sorted(kept):
            boxes = decoded[-1 if share_location else c]
            for idx in kept[c]:
                rows.append([i, c, scores[i, idx, c], *boxes[idx]])
    if not rows:
        empty = np.full((1, 1, images, 7), -1, dtype=np.float32)
        empty[0, 0, :, 0] = np.arange(images)
        return empty
    return np.asarray(rows, dtype=np.float32).reshape(1, 1, len(rows), 7)


def _host(a: Any) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


@detection_output.kernel
def _(xp, loc, conf, prior, *, out=None, **attrs):
    rows = detect(_host(loc), _host(conf), _host(prior), **attrs)
    return xp.asarray(rows.astype(_host(loc).dtype, copy=False))


# --------------------------------------------------------------------------- ONNX NonMaxSuppression

def _nms_infer(types, **_):
    boxes, scores = types
    if not boxes.dtype.is_float or not scores.dtype.is_float:
        raise ShapeError(f"non_max_suppression: boxes and scores must be float tensors, got {boxes!r} and {scores!r}")
    if boxes.ndim != 3 or boxes.shape[2] not in (None, 4):
        raise ShapeError(f"non_max_suppression: boxes must be (batches, boxes, 4), got {boxes!r}")
    if scores.ndim != 3:
        raise ShapeError(f"non_max_suppression: scores must be (batches, classes, boxes), got {scores!r}")
    for a, b, what in ((boxes.shape[0], scores.shape[0], "batches"), (boxes.shape[1], scores.shape[2], "boxes")):
        if a is not None and b is not None and a != b:
            raise ShapeError(f"non_max_suppression: boxes {boxes!r} and scores {scores!r} disagree on the {what}")
    return TensorType((None, 3), "int64")


non_max_suppression = defop(
    "non_max_suppression", num_inputs=2, pattern=OPAQUE, writes_out=False, differentiable=False,
    attrs={"max_output_boxes_per_class": Int(0), "iou_threshold": Float(0.0), "score_threshold": Float(None),
           "center_point_box": Bool(False)},
    infer=_nms_infer,
    doc="ONNX NonMaxSuppression: rows [batch, class, box index] of the boxes kept per class, best first.")


def _corners(boxes: np.ndarray, center_point_box: bool) -> np.ndarray:
    """(..., 4) boxes as (ymin, xmin, ymax, xmax); corner pairs may come in either order."""
    if center_point_box:
        xc, yc, w, h = (boxes[..., i] for i in range(4))
        return np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)
    y = np.sort(boxes[..., 0::2], axis=-1)
    x = np.sort(boxes[..., 1::2], axis=-1)
    return np.stack([y[..., 0], x[..., 0], y[..., 1], x[..., 1]], axis=-1)


def overlaps_more_than(box: np.ndarray, others: np.ndarray, threshold: float) -> np.ndarray:
    """Whether each of ``others`` has an intersection over union with ``box`` above the threshold
    (boxes as (ymin, xmin, ymax, xmax); no overlap, an empty box or an empty union never suppress)."""
    iy = np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0])
    ix = np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1])
    inter = iy * ix
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    ok = (iy > 0) & (ix > 0) & (inter > 0) & (area > 0) & (areas > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return ok & (inter / np.where(ok, union, 1) > threshold)


def select_boxes(boxes: np.ndarray, scores: np.ndarray, *, max_output_boxes_per_class: int, iou_threshold: float,
                 score_threshold, center_point_box: bool) -> np.ndarray:
    """The (selected, 3) int64 rows NonMaxSuppression produces (host NumPy in and out)."""
    corners = _corners(boxes, center_point_box)
    rows = []
    limit = max(int(max_output_boxes_per_class), 0)
    threshold = scores.dtype.type(iou_threshold)
    for b in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            if not limit:
                break
            s = scores[b, c]
            candidates = np.arange(s.shape[0]) if score_threshold is None else \
                np.nonzero(s > s.dtype.type(score_threshold))[0]
            order = candidates[np.argsort(-s[candidates], kind="stable")]   # ties: the lower index first
            kept: List[int] = []
            for index in order:
                if kept and overlaps_more_than(corners[b, index], corners[b, kept], threshold).any():
                    continue
                kept.append(int(index))
                rows.append((b, c, int(index)))
                if len(kept) >= limit:
                    break
    return np.asarray(rows, dtype=np.int64).reshape(len(rows), 3)


@non_max_suppression.kernel
def _(xp, boxes, scores, *, out=None, **attrs):
    return xp.asarray(select_boxes(_host(boxes), _host(scores), **attrs))
