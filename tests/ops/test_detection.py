"""detection_output (SSD's DetectionOutput) in the op case table, against loops written from the fork's sources."""
import numpy as np
import pytest
from harness import Case, check_case

from cgvm.ops import detection as D
from tests.frontends.caffe.fork_reference import detection_inputs, detection_output_loops


CASES = [
    Case("detection_output_center_size", lambda l, c, p: D.detection_output(
        l, c, p, num_classes=4, nms_threshold=0.45, top_k=50, keep_top_k=10, confidence_threshold=0.05,
        code_type=D.CENTER_SIZE),
        detection_inputs(3, priors=12, peaky=2.0), lambda l, c, p: detection_output_loops(l, c, p, 4, 0.45, 50, 10, 0.05, D.CENTER_SIZE),
        grad=False),
    Case("detection_output_corner", lambda l, c, p: D.detection_output(
        l, c, p, num_classes=4, nms_threshold=0.3, confidence_threshold=0.2, code_type=D.CORNER),
        detection_inputs(5, priors=12, peaky=2.0), lambda l, c, p: detection_output_loops(l, c, p, 4, 0.3, -1, -1, 0.2, D.CORNER),
        grad=False),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_detection_case(case, backend):
    check_case(case, backend)


# --------------------------------------------------------------------------- ONNX NonMaxSuppression

def ref_nms(boxes, scores, max_output, iou_threshold, score_threshold, center_point_box):
    """Greedy NMS box by box with plain Python floats (ONNX's rules: boxes above the score
    threshold, best score first and the lower index among equals, suppressed by an IoU above the
    threshold with a box already kept, at most max_output per class)."""
    def corners(b):
        if center_point_box:
            return (b[1] - b[3] / 2, b[0] - b[2] / 2, b[1] + b[3] / 2, b[0] + b[2] / 2)
        return (min(b[0], b[2]), min(b[1], b[3]), max(b[0], b[2]), max(b[1], b[3]))

    def iou(a, b):
        a, b = corners(a), corners(b)
        ih = min(a[2], b[2]) - max(a[0], b[0])
        iw = min(a[3], b[3]) - max(a[1], b[1])
        if ih <= 0 or iw <= 0:
            return 0.0
        inter = ih * iw
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
        return inter / union

    rows = []
    for bi in range(scores.shape[0]):
        for c in range(scores.shape[1]):
            cand = [i for i in range(scores.shape[2]) if score_threshold is None or scores[bi, c, i] > score_threshold]
            cand.sort(key=lambda i: (-scores[bi, c, i], i))
            kept = []
            for i in cand:
                if len(kept) >= max_output:
                    break
                if all(iou(boxes[bi, i], boxes[bi, j]) <= iou_threshold for j in kept):
                    kept.append(i)
                    rows.append((bi, c, i))
    return np.asarray(rows, np.int64).reshape(-1, 3)


def _nms_inputs(batches, classes, count, seed):
    g = np.random.default_rng(seed)
    centers = g.uniform(0, 10, (batches, count, 2))
    sizes = g.uniform(1, 4, (batches, count, 2))
    corners = np.concatenate([centers - sizes / 2, centers + sizes / 2], axis=-1)
    flip = g.random((batches, count)) < 0.3           # some boxes give their corners the other way round
    corners[flip] = corners[flip][:, [2, 3, 0, 1]]
    scores = np.round(g.random((batches, classes, count)), 1)     # ties in score happen
    return corners.astype(np.float32), scores.astype(np.float32)


NMS_CASES = [
    Case("nms_corners", lambda b, s: D.non_max_suppression(b, s, max_output_boxes_per_class=5, iou_threshold=0.3,
                                                           score_threshold=0.2),
         list(_nms_inputs(2, 3, 12, 1)), lambda b, s: ref_nms(b, s, 5, 0.3, 0.2, False), grad=False),
    Case("nms_center_no_score_threshold", lambda b, s: D.non_max_suppression(
        b, s, max_output_boxes_per_class=20, iou_threshold=0.1, center_point_box=True),
        [np.concatenate([_nms_inputs(1, 1, 9, 2)[0][..., :2], _nms_inputs(1, 1, 9, 3)[0][..., :2] * 0 + 2.5], -1),
         _nms_inputs(1, 2, 9, 4)[1]],
        lambda b, s: ref_nms(b, s, 20, 0.1, None, True), grad=False),
]


@pytest.mark.parametrize("case", NMS_CASES, ids=repr)
def test_nms_case(case):
    check_case(case)


def test_nms_keeps_nothing_without_a_budget():
    boxes, scores = _nms_inputs(1, 1, 4, 5)
    rows = D.select_boxes(boxes, scores, max_output_boxes_per_class=0, iou_threshold=0.5, score_threshold=None,
                          center_point_box=False)
    assert rows.shape == (0, 3) and rows.dtype == np.int64
