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
