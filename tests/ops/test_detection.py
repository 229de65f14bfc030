"""detection_output (SSD's DetectionOutput) in the op case table, against loops written from the fork's sources."""
import numpy as np
import pytest
from harness import Case, check_case

from cgvm.ops import detection as D
from tests.frontends.caffe.fork_reference import detection_output_loops


def _inputs(seed=3, n=2, priors=12, classes=4):
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.1, 0.9, size=(priors, 2))
    sizes = rng.uniform(0.05, 0.4, size=(priors, 2))
    corners = np.concatenate([centres - sizes / 2, centres + sizes / 2], axis=1).reshape(-1)
    prior = np.stack([corners, np.tile([0.1, 0.1, 0.2, 0.2], priors)])[None].astype(np.float32)
    loc = rng.normal(scale=0.5, size=(n, priors * 4)).astype(np.float32)
    logits = rng.normal(scale=2.0, size=(n, priors, classes))
    conf = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).reshape(n, -1).astype(np.float32)
    return [loc, conf, prior]


CASES = [
    Case("detection_output_center_size", lambda l, c, p: D.detection_output(
        l, c, p, num_classes=4, nms_threshold=0.45, top_k=50, keep_top_k=10, confidence_threshold=0.05,
        code_type=D.CENTER_SIZE),
        _inputs(), lambda l, c, p: detection_output_loops(l, c, p, 4, 0.45, 50, 10, 0.05, D.CENTER_SIZE),
        grad=False),
    Case("detection_output_corner", lambda l, c, p: D.detection_output(
        l, c, p, num_classes=4, nms_threshold=0.3, confidence_threshold=0.2, code_type=D.CORNER),
        _inputs(seed=5), lambda l, c, p: detection_output_loops(l, c, p, 4, 0.3, -1, -1, 0.2, D.CORNER),
        grad=False),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_detection_case(case):
    check_case(case)
