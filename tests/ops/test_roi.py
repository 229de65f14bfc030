"""roi_align against a sample-by-sample loop written from ONNX RoiAlign's rules, and numeric gradients."""
import math

import numpy as np
import pytest

from cgvm.errors import ExecutionError, GraphBuildError, ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import roi as ROI
from harness import Case, check_case, check_grad, linear_adjoint, run_op

rng = np.random.default_rng(17)


def _bilinear_corners(img, y, x):
    """[(weight, value)] of the four corners a sample reads (none when it is out of range)."""
    h, w = img.shape
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return [(0.0, 0.0)] * 4
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= h - 1:
        y0 = y1 = h - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= w - 1:
        x0 = x1 = w - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    return [((1 - ly) * (1 - lx), img[y0, x0]), ((1 - ly) * lx, img[y0, x1]), (ly * (1 - lx), img[y1, x0]),
            (ly * lx, img[y1, x1])]


def ref_roi_align(x, rois, idx, mode="avg", output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0,
                  half_pixel=True):
    out = np.zeros((rois.shape[0], x.shape[1], output_height, output_width))
    for r in range(rois.shape[0]):
        shift = 0.5 if half_pixel else 0.0
        x1, y1, x2, y2 = [v * spatial_scale - shift for v in rois[r]]
        rw, rh = x2 - x1, y2 - y1
        if not half_pixel:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        gh = sampling_ratio or math.ceil(rh / output_height)
        gw = sampling_ratio or math.ceil(rw / output_width)
        for c in range(x.shape[1]):
            img = x[idx[r], c]
            for ph in range(output_height):
                for pw in range(output_width):
                    values = []
                    for iy in range(gh):
                        for ix in range(gw):
                            y = y1 + ph * rh / output_height + (iy + 0.5) * rh / output_height / gh
                            xx = x1 + pw * rw / output_width + (ix + 0.5) * rw / output_width / gw
                            corners = _bilinear_corners(img, y, xx)
                            values.append(sum(wt * v for wt, v in corners) if mode == "avg"
                                          else max(wt * v for wt, v in corners))
                    if values:
                        out[r, c, ph, pw] = sum(values) / max(gh * gw, 1) if mode == "avg" else max(values)
    return out


X = rng.standard_normal((2, 3, 7, 8))
ROIS = np.array([[0.5, 1.0, 6.2, 5.5], [2.0, 0.0, 7.9, 6.9], [-1.5, -0.8, 3.0, 2.5], [4.0, 3.0, 4.2, 3.1]])
IDX = np.array([0, 1, 1, 0], np.int64)


def roi_case(name, **attrs):
    return Case(name, lambda x, b, i: ROI.roi_align(x, b, i, **attrs), [X, ROIS, IDX],
                lambda x, b, i: ref_roi_align(x, b, i, **attrs), grad_inputs=[0], rtol=1e-9, atol=1e-9)


CASES = [
    roi_case("avg_adaptive", output_height=3, output_width=2),
    roi_case("avg_ratio2_scaled", output_height=2, output_width=3, sampling_ratio=2, spatial_scale=0.8),
    roi_case("avg_output_half_pixel", output_height=2, output_width=2, half_pixel=False),
    roi_case("max_ratio2", mode="max", output_height=2, output_width=2, sampling_ratio=2),
    Case("roi_align_grad", lambda g, x, b, i: ROI.roi_align_grad(g, x, b, i, output_height=2, output_width=2),
         [rng.standard_normal((4, 3, 2, 2)), X, ROIS, IDX],
         lambda g, x, b, i: _adjoint(g, x, b, i, output_height=2, output_width=2), grad=False, rtol=1e-9,
         atol=1e-9),
]


def _adjoint(g, x, rois, idx, **attrs):
    return linear_adjoint(lambda u: ref_roi_align(u, rois, idx, **attrs), x, g)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)


def test_boxes_must_name_an_image_of_the_batch():
    with pytest.raises((ShapeError, ExecutionError)):
        run_op(lambda x, b, i: ROI.roi_align(x, b, i), [X, ROIS, np.array([0, 1, 2, 0], np.int64)])
    with pytest.raises((ShapeError, GraphBuildError)):
        ROI.roi_align(input_value(TensorType((1, 2, 4, 4), np.float32), "x"),
                      input_value(TensorType((3, 5), np.float32), "b"), input_value(TensorType((3,), np.int64), "i"))
