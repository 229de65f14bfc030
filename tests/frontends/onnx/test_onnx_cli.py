"""`cgvm run/export/time/draw/info/dis/compile` with .onnx models, run as a user runs them
(a subprocess of this Python, importing the tree under test)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def cgvm_cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "cgvm.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


@pytest.fixture
def model_file(tmp_path):
    w = (np.arange(6, dtype=np.float32).reshape(3, 2) / 6)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                           helper.make_node("Softmax", ["h"], ["y"], axis=1, name="sm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                          [numpy_helper.from_array(w, "w")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path, w


def test_run_prints_and_saves_outputs(model_file, tmp_path):
    path, w = model_file
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = cgvm_cli("run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--output", str(tmp_path / "out.npz"),
                 cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "y: float32[4, 2]" in r.stdout
    h = x @ w
    want = np.exp(h - h.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    np.testing.assert_allclose(np.load(tmp_path / "out.npz")["y"], want, rtol=1e-5)


def test_export_time_draw_info_dis_compile(model_file, tmp_path):
    path, _ = model_file
    r = cgvm_cli("export", str(path), "-o", str(tmp_path / "again.onnx"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    onnx.checker.check_model(onnx.load(str(tmp_path / "again.onnx")), full_check=True)
    r = cgvm_cli("time", "--model", str(path), "--iterations", "3", cwd=tmp_path)
    assert r.returncode == 0 and "ms per call" in r.stdout, r.stderr
    r = cgvm_cli("draw", str(path), str(tmp_path / "m.dot"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "MatMul" in (tmp_path / "m.dot").read_text()
    r = cgvm_cli("info", str(path), cwd=tmp_path)
    assert r.returncode == 0 and "matmul" in r.stdout and "input x: float32[?,3]" in r.stdout, r.stderr
    r = cgvm_cli("dis", str(path), cwd=tmp_path)
    assert r.returncode == 0 and "CALL matmul" in r.stdout, r.stderr
    r = cgvm_cli("compile", str(path), cwd=tmp_path)
    assert r.returncode == 0 and "node 'mm' (op MatMul" in r.stdout, r.stderr


def test_export_caffe_net_with_weights(tmp_path):
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    import cgvm.caffe as caffe

    proto = os.path.join(ROOT, "models", "lenet", "lenet_deploy.prototxt")
    net = caffe.Net(proto, caffe.TEST)
    weights = tmp_path / "lenet.caffemodel"
    net.save(str(weights))
    r = cgvm_cli("export", proto, "--weights", str(weights), "-o", str(tmp_path / "lenet.onnx"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    x = np.random.default_rng(1).random(tuple(net.blobs[net.inputs[0]].shape)).astype(np.float32)
    want = net.forward(**{net.inputs[0]: x})[net.outputs[0]]
    sess = ort.InferenceSession(str(tmp_path / "lenet.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(None, {sess.get_inputs()[0].name: x})[0], want, rtol=1e-4, atol=1e-6)


def test_errors_are_one_line_and_exit_2(model_file, tmp_path):
    path, _ = model_file
    r = cgvm_cli("run", str(tmp_path / "missing.onnx"), "--input", "x.npy", cwd=tmp_path)
    assert r.returncode == 2 and "no such ONNX file" in r.stderr
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(path.read_bytes()[:40])
    r = cgvm_cli("info", str(bad), cwd=tmp_path)
    assert r.returncode == 2 and "bad.onnx" in r.stderr and "Traceback" not in r.stderr
