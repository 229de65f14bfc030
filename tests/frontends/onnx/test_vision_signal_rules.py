"""The ONNX rules composed of cgvm ops (DeformConv, Col2Im, MaxPool's Indices, MaxUnpool, STFT) against
ONNX's reference evaluator on inputs the backend suite does not try, DeformConv trained through
its offsets, and the new ops exported and run in ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import cgvm  # noqa: E402
import cgvm.onnx  # noqa: E402
from cgvm.ir import TensorType, input_value  # noqa: E402
from cgvm.ops import elementwise as E, reduce as R, sampling as SA, spectral as SP, roi as ROI  # noqa: E402

rng = np.random.default_rng(4)
F32 = TensorProto.FLOAT


def model_of(node, inputs, outputs, opset=20):
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def both(model, feeds):
    want = ReferenceEvaluator(model).run(None, feeds)
    got = cgvm.onnx.load(model, workspace=cgvm.Workspace())(*feeds.values())
    return (got if isinstance(got, (list, tuple)) else [got]), want


def test_deform_conv_with_groups_strides_and_mask_matches_the_reference():
    x = rng.standard_normal((2, 4, 6, 7)).astype(np.float32)
    w = rng.standard_normal((6, 2, 2, 3)).astype(np.float32)
    offset = (rng.standard_normal((2, 2 * 2 * 6, 3, 2)) * 1.5).astype(np.float32)
    mask = rng.uniform(0, 1, (2, 2 * 6, 3, 2)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    node = helper.make_node("DeformConv", ["x", "w", "offset", "b", "mask"], ["y"], group=2, offset_group=2,
                            strides=[2, 2], pads=[1, 0, 0, 1], dilations=[1, 2], kernel_shape=[2, 3])
    model = model_of(node, [("x", F32, x.shape), ("w", F32, w.shape), ("offset", F32, offset.shape),
                            ("b", F32, b.shape), ("mask", F32, mask.shape)], [("y", F32, None)], opset=19)
    got, want = both(model, {"x": x, "w": w, "offset": offset, "b": b, "mask": mask})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_deform_conv_offsets_get_gradients():
    x = rng.standard_normal((1, 2, 5, 5))
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    node = helper.make_node("DeformConv", ["x", "w", "offset"], ["y"], pads=[1, 1, 1, 1])
    model = model_of(node, [("x", F32, (1, 2, 5, 5)), ("offset", F32, (1, 18, 5, 5))], [("y", F32, None)], opset=19)
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    ws = cgvm.Workspace()
    imported = cgvm.onnx.load(model, workspace=ws)
    xs = input_value(TensorType((1, 2, 5, 5), "float32"), "x")
    off = input_value(TensorType((1, 18, 5, 5), "float32"), "off")
    (y,) = imported.symbolic(xs, off)
    weights = rng.standard_normal((1, 3, 5, 5)).astype(np.float32)
    loss = R.sum(E.mul(y, weights))
    (g_off,) = cgvm.grad(loss, [off])
    f = cgvm.compile([xs, off], [loss, g_off], workspace=ws)
    offsets = (rng.standard_normal((1, 18, 5, 5)) * 0.7).astype(np.float32)
    _, got = f(x.astype(np.float32), offsets)
    # central differences on a few offsets
    for index in [(0, 0, 2, 2), (0, 7, 1, 3), (0, 17, 4, 0)]:
        plus, minus = offsets.copy(), offsets.copy()
        plus[index] += 1e-2
        minus[index] -= 1e-2
        numeric = (f(x.astype(np.float32), plus)[0] - f(x.astype(np.float32), minus)[0]) / 2e-2
        np.testing.assert_allclose(got[index], numeric, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("pads, strides, dilations", [([1, 0, 2, 1], [2, 1], [1, 2]), ([0, 0, 0, 0], [3, 2], [1, 1])])
def test_col2im_with_asymmetric_pads_matches_the_reference(pads, strides, dilations):
    image, block = np.array([7, 6]), np.array([2, 3])
    counts = [(image[d] + pads[d] + pads[2 + d] - (dilations[d] * (block[d] - 1) + 1)) // strides[d] + 1
              for d in range(2)]
    cols = rng.standard_normal((2, 3 * 6, int(np.prod(counts)))).astype(np.float32)
    node = helper.make_node("Col2Im", ["cols", "image", "block"], ["y"], pads=pads, strides=strides,
                            dilations=dilations)
    model = model_of(node, [("cols", F32, cols.shape)], [("y", F32, None)])
    model.graph.initializer.extend([onnx.numpy_helper.from_array(image, "image"),
                                    onnx.numpy_helper.from_array(block, "block")])
    got, want = both(model, {"cols": cols})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices_with_asymmetric_pads_match_the_reference(storage_order):
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 0, 1],
                            storage_order=storage_order)
    model = model_of(node, [("x", F32, x.shape)], [("y", F32, None), ("i", TensorProto.INT64, None)], opset=12)
    got, want = both(model, {"x": x})
    np.testing.assert_allclose(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_maxpool_indices_feed_maxunpool():
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    pool = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2])
    unpool = helper.make_node("MaxUnpool", ["y", "i"], ["z"], kernel_shape=[2, 2], strides=[2, 2])
    graph = helper.make_graph([pool, unpool], "g", [helper.make_tensor_value_info("x", F32, x.shape)],
                              [helper.make_tensor_value_info("z", F32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    got, want = both(model, {"x": x})
    np.testing.assert_allclose(got[0], want[0])
    assert np.count_nonzero(got[0]) == 2 * 9


def test_stft_of_a_complex_signal_matches_the_reference():
    x = rng.standard_normal((2, 40, 2)).astype(np.float32)
    window = np.hanning(12).astype(np.float32)
    node = helper.make_node("STFT", ["x", "step", "window"], ["y"], onesided=0)
    model = model_of(node, [("x", F32, x.shape), ("window", F32, window.shape)], [("y", F32, None)], opset=17)
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(5, np.int64), "step"))
    got, want = both(model, {"x": x, "window": window})
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------- export

def test_new_ops_export_and_run_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    x = input_value(TensorType((1, 2, 6, 7), "float32"), "x")
    g = input_value(TensorType((1, 4, 5, 2), "float32"), "g")
    s = input_value(TensorType((2, 8, 1), "float32"), "s")
    boxes = np.array([[0.5, 1.0, 5.0, 4.5], [1.0, 0.0, 6.5, 5.5]], np.float32)
    outs = [SA.grid_sample(x, g, mode="cubic", padding_mode="reflection"),
            SP.dft(s, axis=1, onesided=True),
            ROI.roi_align(x, cgvm.ir.graph.const_value(boxes), cgvm.ir.graph.const_value(np.zeros(2, np.int64)),
                          output_height=2, output_width=3, sampling_ratio=2)]
    fn = cgvm.compile([x, g, s], outs)
    model = cgvm.onnx.export(fn, str(tmp_path / "m.onnx"))
    onnx.checker.check_model(model, full_check=True)
    feeds = [rng.standard_normal((1, 2, 6, 7)).astype(np.float32),
             rng.uniform(-1.2, 1.2, (1, 4, 5, 2)).astype(np.float32),
             rng.standard_normal((2, 8, 1)).astype(np.float32)]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, dict(zip([i.name for i in sess.get_inputs()], feeds)))
    for a, b in zip(got, fn(*feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
