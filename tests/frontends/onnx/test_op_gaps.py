"""ONNX ops that needed new cgvm ops or data-dependent shapes: NonZero and Unique (output sizes read
from the values, per call), scatters with a reduction (trained through cgvm.grad), the random ops
(generator states in the Workspace, advanced per call) and training-mode Dropout, checked against
ONNX's reference evaluator (onnx.reference) and plain NumPy."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import cgvm  # noqa: E402
import cgvm.onnx  # noqa: E402
from cgvm.ir import TensorType, input_value  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, opset=21):
    g = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def test_nonzero_and_unique_sizes_follow_each_call_compiled_once():
    model = _model([helper.make_node("NonZero", ["x"], ["nz"]),
                    helper.make_node("Unique", ["x"], ["u", "first", "inverse", "counts"], sorted=0)],
                   [_vi("x", F, [6])], [_vi("nz", I64, [1, None]), _vi("u", F, [None]),
                                        _vi("first", I64, [None]), _vi("inverse", I64, [6]),
                                        _vi("counts", I64, [None])])
    ref = ReferenceEvaluator(model)
    m = cgvm.onnx.load(model, workspace=cgvm.Workspace())
    f = m.compile()
    for data in ([0, 3, 3, 0, 1, 3], [2, 2, 2, 2, 2, 2], [5, 0, 4, 3, 2, 1]):
        x = np.array(data, np.float32)
        want = ref.run(None, {"x": x})
        for got in (m.run([x]), f(x)):
            for g, w in zip(got, want):
                np.testing.assert_array_equal(np.asarray(g), w)


def test_unique_along_an_axis_matches_the_reference():
    model = _model([helper.make_node("Unique", ["x"], ["u", "first", "inverse", "counts"], axis=-1)],
                   [_vi("x", I64, [2, 5])], [_vi("u", I64, [2, None]), _vi("first", I64, [None]),
                                             _vi("inverse", I64, [5]), _vi("counts", I64, [None])])
    x = np.array([[1, 0, 1, 2, 0], [3, 1, 3, 0, 1]], np.int64)
    got = cgvm.onnx.load(model, workspace=cgvm.Workspace()).run([x])
    for g, w in zip(got, ReferenceEvaluator(model).run(None, {"x": x})):
        np.testing.assert_array_equal(g, w)


def test_scatter_with_a_reduction_trains_through_cgvm_grad():
    """d/dx and d/dupdates of sum(w * ScatterElements(x, idx, upd, reduction=mul)), against central
    differences of ONNX's reference evaluator."""
    idx = np.array([[1, 0, 1], [2, 2, 0]], np.int64)
    model = _model([helper.make_node("ScatterElements", ["x", "idx", "upd"], ["y"], axis=0, reduction="mul")],
                   [_vi("x", TensorProto.DOUBLE, [3, 3]), _vi("idx", I64, [2, 3]),
                    _vi("upd", TensorProto.DOUBLE, [2, 3])], [_vi("y", TensorProto.DOUBLE, [3, 3])], opset=18)
    rng = np.random.default_rng(3)
    xv, uv, wv = rng.standard_normal((3, 3)), rng.standard_normal((2, 3)), rng.standard_normal((3, 3))
    ref = ReferenceEvaluator(model)

    def cost(xa, ua):
        return float(np.sum(wv * ref.run(None, {"x": xa, "idx": idx, "upd": ua})[0]))

    m = cgvm.onnx.load(model, workspace=cgvm.Workspace())
    x = input_value(TensorType((3, 3), "float64"), "x")
    u = input_value(TensorType((2, 3), "float64"), "u")
    i = input_value(TensorType((2, 3), "int64"), "i")
    (y,) = m.symbolic(x, i, u)
    loss = cgvm.ops.reduce.sum(cgvm.ops.elementwise.mul(y, wv))
    gx, gu = cgvm.grad(loss, [x, u])
    got_loss, got_gx, got_gu = cgvm.compile([x, i, u], [loss, gx, gu], workspace=m.workspace)(xv, idx, uv)
    assert got_loss == pytest.approx(cost(xv, uv), rel=1e-12)
    for got, arr, k in ((got_gx, xv, 0), (got_gu, uv, 1)):
        num = np.zeros_like(arr)
        for pos in np.ndindex(*arr.shape):
            plus, minus = arr.copy(), arr.copy()
            plus[pos] += 1e-6
            minus[pos] -= 1e-6
            args = [(plus, uv), (minus, uv)] if k == 0 else [(xv, plus), (xv, minus)]
            num[pos] = (cost(*args[0]) - cost(*args[1])) / 2e-6
        np.testing.assert_allclose(got, num, rtol=1e-6, atol=1e-8)


def test_random_ops_draw_afresh_each_call_and_repeat_with_the_seed():
    model = _model([helper.make_node("RandomUniform", [], ["u"], shape=[1000], low=2.0, high=3.0, seed=7.0),
                    helper.make_node("RandomNormalLike", ["x"], ["n"], mean=1.0, scale=0.5, seed=8.0)],
                   [_vi("x", F, [2000])], [_vi("u", F, [1000]), _vi("n", F, [2000])])
    x = np.zeros(2000, np.float32)
    m = cgvm.onnx.load(model, workspace=cgvm.Workspace())
    u1, n1 = m.run([x])
    u2, _ = m.run([x])
    assert u1.dtype == np.float32 and u1.shape == (1000,) and n1.shape == (2000,)
    assert 2.0 <= u1.min() and u1.max() < 3.0 and abs(u1.mean() - 2.5) < 0.03
    assert abs(n1.mean() - 1.0) < 0.05 and abs(n1.std() - 0.5) < 0.05
    assert not np.array_equal(u1, u2)
    again, _ = cgvm.onnx.load(model, workspace=cgvm.Workspace()).run([x])
    np.testing.assert_array_equal(again, u1)


def test_training_dropout_keeps_and_scales_what_its_mask_says():
    model = _model([helper.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], seed=0)],
                   [_vi("x", F, [50, 40]), _vi("r", F, []), _vi("t", TensorProto.BOOL, [])],
                   [_vi("y", F, [50, 40]), _vi("mask", TensorProto.BOOL, [50, 40])])
    x = np.random.default_rng(0).standard_normal((50, 40)).astype(np.float32)
    m = cgvm.onnx.load(model, workspace=cgvm.Workspace())
    y, mask = m.run([x, np.float32(0.25), np.bool_(True)])
    assert mask.dtype == np.bool_ and abs(mask.mean() - 0.75) < 0.03
    np.testing.assert_allclose(y, np.where(mask, x / 0.75, 0.0), rtol=1e-6)
    y_eval, mask_eval = m.run([x, np.float32(0.25), np.bool_(False)])
    np.testing.assert_array_equal(y_eval, x)
    assert mask_eval.all()


def test_the_new_ops_export_and_run_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from cgvm.ops import selection as SEL
    from cgvm.ops import sorting as SRT

    x = input_value(TensorType((4, 3), "float32"), "x")
    u = input_value(TensorType((2, 3), "float32"), "u")
    idx = cgvm.ir.const_value(np.array([[3, 0, 3], [3, 1, 0]], np.int64))
    scattered = SRT.scatter_reduce(x, idx, u, axis=0, reduction="add")
    values, first, inverse, counts = SEL.unique(scattered, sorted=True)
    fn = cgvm.compile([x, u], [scattered, SEL.nonzero(scattered), values, first, inverse, counts])
    model = cgvm.onnx.export(fn, str(tmp_path / "gaps.onnx"))
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    xv = np.round(rng.standard_normal((4, 3)), 1).astype(np.float32)
    xv[1] = 0.0
    uv = np.round(rng.standard_normal((2, 3)), 1).astype(np.float32)
    got = sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), (xv, uv))})
    for g, w in zip(got, fn(xv, uv)):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_multinomial_draws_classes_by_their_softmax_probabilities():
    probs = np.array([[0.1, 0.6, 0.3], [0.7, 0.0, 0.3]], np.float32)
    model = _model([helper.make_node("Multinomial", ["x"], ["y"], sample_size=4000, seed=3.0)],
                   [_vi("x", F, [2, 3])], [_vi("y", TensorProto.INT32, [2, 4000])])
    with np.errstate(divide="ignore"):
        logits = np.log(probs) + 2.0               # unnormalized log probabilities
    y = cgvm.onnx.load(model, workspace=cgvm.Workspace()).run([logits.astype(np.float32)])[0]
    assert y.dtype == np.int32 and y.shape == (2, 4000)
    for row in range(2):
        freq = np.bincount(y[row], minlength=3) / 4000.0
        np.testing.assert_allclose(freq, probs[row], atol=0.03)
    assert not np.any(y[1] == 1)                   # a class of probability 0 is never drawn


def test_sum_squares_and_dynamic_slice_export_as_standard_ops():
    """What the compiler makes of an L2 penalty (sum_squares) and a minibatch slice with bounds known at
    run time (dynamic_slice) exports as ReduceSumSquare and Slice, checked in ONNX's reference evaluator."""
    from cgvm.ops import elementwise as E, indexing as IX, reduce as R
    x = input_value(TensorType((6, 3), "float32"), "x")
    i = input_value(TensorType((), "int64"), "i")
    f = cgvm.compile([x, i], [R.sum(E.square(x)), IX.dynamic_slice(x, E.mul(i, 2), E.mul(E.add(i, 1), 2)),
                              IX.dynamic_slice(x, i, E.neg(i), axis=1, step=-1)])
    assert {"sum_squares", "dynamic_slice"} <= {n.op.name for n in f.graph.nodes}
    ref = ReferenceEvaluator(cgvm.onnx.export(f))
    xv = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    for iv in (0, 1, 2):
        got = ref.run(None, dict(zip(ref.input_names, (xv, np.array(iv)))))
        np.testing.assert_allclose(got[0], np.sum(xv.astype(np.float64) ** 2), rtol=1e-6)
        np.testing.assert_array_equal(got[1], xv[2 * iv:2 * iv + 2])
        np.testing.assert_array_equal(got[2], xv[:, iv:-iv:-1])
