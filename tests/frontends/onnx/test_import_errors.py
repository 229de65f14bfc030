"""Bad ONNX input gets a clear cgvm.errors error naming the file, node and op, and nothing is half
loaded: the Workspace is untouched when an import fails."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import cgvm  # noqa: E402
import cgvm.onnx  # noqa: E402
from cgvm.errors import CgvmError  # noqa: E402
from cgvm.frontends.onnx.errors import OnnxFileError, OnnxImportError  # noqa: E402


def _model(nodes, inputs, outputs, initializers=(), opset=17, domain_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)] + list(domain_opsets))


def _linear(w=None):
    w = np.ones((3, 2), np.float32) if w is None else w
    return _model([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                   helper.make_node("Relu", ["h"], ["y"], name="act")],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                  [numpy_helper.from_array(w, "w")])


def test_a_good_model_loads_and_runs(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_linear(), str(path))
    m = cgvm.onnx.load(str(path), workspace=cgvm.Workspace())
    np.testing.assert_allclose(m(np.full((4, 3), -1.0, np.float32)), np.zeros((4, 2)))
    np.testing.assert_allclose(m(np.ones((1, 3), np.float32)), np.full((1, 2), 3.0))


def test_truncated_file_is_named(tmp_path):
    data = _linear().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxFileError, match="cut.onnx"):
        cgvm.onnx.load(str(path))


def test_garbage_and_empty_and_missing_files(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\xfe not a protobuf \x00\x01" * 10)
    with pytest.raises(OnnxFileError, match="bad.onnx"):
        cgvm.onnx.load(str(bad))
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(OnnxFileError, match="empty"):
        cgvm.onnx.load(str(empty))
    with pytest.raises(OnnxFileError, match="no such ONNX file"):
        cgvm.onnx.load(str(tmp_path / "nope.onnx"))


def test_unknown_op_names_node_and_op_and_loads_nothing():
    ws = cgvm.Workspace()
    m = _linear()
    m.graph.node.append(helper.make_node("FrobnicateTensor", ["y"], ["z"], name="weird"))
    m.graph.output[0].name = "z"
    with pytest.raises(OnnxImportError, match=r"node 'weird' \(op FrobnicateTensor.*not supported"):
        cgvm.onnx.load(m, workspace=ws)
    assert len(ws) == 0


def test_unknown_domain_is_named():
    m = _linear()
    m.graph.node.append(helper.make_node("Thing", ["y"], ["z"], name="custom", domain="com.example"))
    m.graph.output[0].name = "z"
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(OnnxImportError, match=r"node 'custom' \(op com.example.Thing.*domain 'com.example'"):
        cgvm.onnx.load(m, workspace=cgvm.Workspace())


def test_opset_newer_than_supported():
    m = _linear()
    m.opset_import[0].version = cgvm.onnx.MAX_OPSET + 1
    with pytest.raises(OnnxImportError, match=f"opset {cgvm.onnx.MAX_OPSET + 1} .* newer"):
        cgvm.onnx.load(m, workspace=cgvm.Workspace())


def test_initializer_whose_data_disagrees_with_its_dims():
    ws = cgvm.Workspace()
    m = _linear()
    t = m.graph.initializer[0]
    t.raw_data = t.raw_data[:-4]                 # one float short of 3x2
    with pytest.raises(OnnxImportError, match=r"tensor 'w'.*dims \[3, 2\] need 6 values but the data holds 5"):
        cgvm.onnx.load(m, workspace=ws)
    assert len(ws) == 0
    huge = _linear()
    del huge.graph.initializer[0].dims[:]
    huge.graph.initializer[0].dims.extend([1 << 40, 1 << 20])   # claims 2^60 floats: never allocated
    with pytest.raises(OnnxImportError, match="need"):
        cgvm.onnx.load(huge, workspace=ws)


def test_initializer_shape_that_does_not_fit_the_node_names_the_node():
    m = _linear(np.ones((4, 2), np.float32))     # x is (N, 3): MatMul cannot take a (4, 2) weight
    ws = cgvm.Workspace()
    with pytest.raises(OnnxImportError, match=r"node 'mm' \(op MatMul.*float32\[4,2\]"):
        cgvm.onnx.load(m, workspace=ws)
    assert len(ws) == 0


def test_a_node_reading_a_missing_value_is_named():
    m = _model([helper.make_node("Relu", ["ghost"], ["y"], name="r")],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    with pytest.raises(OnnxImportError, match=r"node 'r' \(op Relu.*'ghost' is not produced"):
        cgvm.onnx.load(m, workspace=cgvm.Workspace())


def test_wrong_inputs_at_call_time():
    model = cgvm.onnx.load(_linear(), workspace=cgvm.Workspace())
    with pytest.raises(CgvmError, match="takes 1 inputs"):
        model(np.ones((2, 3), np.float32), np.ones(2, np.float32))
    with pytest.raises(CgvmError, match=r"input 'x' has shape \(2, 4\)"):
        model(np.ones((2, 4), np.float32))
    with pytest.raises(CgvmError, match="dtype float64"):
        model(np.ones((2, 3)))


def test_external_data_is_read_and_its_absence_is_named(tmp_path):
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    m = _linear(w)
    path = tmp_path / "ext.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location="ext.bin",
                    size_threshold=0)
    assert (tmp_path / "ext.bin").exists()
    model = cgvm.onnx.load(str(path), workspace=cgvm.Workspace())
    np.testing.assert_allclose(model(np.ones((1, 3), np.float32)), np.maximum(np.ones((1, 3)) @ w, 0))
    (tmp_path / "ext.bin").unlink()
    with pytest.raises(OnnxFileError, match="external data"):
        cgvm.onnx.load(str(path), workspace=cgvm.Workspace())
