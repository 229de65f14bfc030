"""The builder: arity and attribute checks, type inference, sources in errors, constants, rebuilding."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import cgvm  # noqa: F401  (registers the ops)
from cgvm.errors import GraphBuildError, ShapeError
from cgvm.ir import CONST, DType, TensorType, apply, as_value, clone_node, input_value, rebuild, source_scope
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R

HERE = __file__


def _line() -> int:
    return inspect.currentframe().f_back.f_lineno


def f32(*shape):
    return TensorType(shape, "float32")


def test_unknown_attribute_names_it_and_the_users_line():
    x = input_value(f32(2, 3), "x")
    with pytest.raises(GraphBuildError) as info:
        line = _line(); E.relu(x, slope=0.1)  # noqa: E702
    msg = str(info.value)
    assert "'slope'" in msg and "relu" in msg
    assert "negative_slope" in msg  # what the op does take
    assert f"{HERE}:{line}" in msg
    assert not isinstance(info.value, ShapeError)


def test_bad_attribute_value_names_the_attribute():
    x = input_value(f32(2, 3), "x")
    with pytest.raises(GraphBuildError) as info:
        line = _line(); R.sum(x, axis="rows")  # noqa: E702
    msg = str(info.value)
    assert "'axis'" in msg and "'sum'" in msg and f"{HERE}:{line}" in msg


def test_missing_required_attribute():
    x = input_value(f32(2, 3), "x")
    with pytest.raises(GraphBuildError, match=r"needs attribute 'axis'"):
        cgvm.ops.shape.expand_dims(x)


def test_wrong_number_of_inputs():
    x = input_value(f32(2, 3), "x")
    with pytest.raises(GraphBuildError) as info:
        line = _line(); E.add(x)  # noqa: E702
    msg = str(info.value)
    assert "'add' takes 2 inputs, got 1" in msg and f"{HERE}:{line}" in msg
    with pytest.raises(GraphBuildError, match="takes 1 inputs, got 2"):
        E.exp(x, x)


def test_shape_mismatch_is_a_shape_error_with_the_types_and_source():
    x = input_value(f32(2, 3), "x")
    y = input_value(f32(4), "y")
    with pytest.raises(ShapeError) as info:
        line = _line(); E.add(x, y)  # noqa: E702
    msg = str(info.value)
    assert "add(float32[2,3], float32[4])" in msg
    assert "do not broadcast" in msg
    assert f"{HERE}:{line}" in msg


def test_rule_errors_quote_a_frontend_source():
    x = input_value(f32(2, 3), "x")
    with source_scope("deploy.prototxt:40 (layer fc7)"):
        with pytest.raises(ShapeError, match=r"\(at deploy\.prototxt:40 \(layer fc7\)\)"):
            R.sum(x, axis=5)


def test_explicit_source_wins_over_scope_and_stack():
    x = input_value(f32(2), "x")
    with source_scope("scope"):
        y = apply(E.exp, [x], source="given.py:1")
    assert y.node.source == "given.py:1"


def test_output_types_are_inferred_with_unknown_dims():
    x = input_value(TensorType([None, 3], "float32"), "x")
    y = input_value(TensorType([4, 1, None], "float32"), "y")
    z = E.add(x, y)
    assert z.type == TensorType([4, None, 3], "float32")
    s = R.sum(z, axis=(0, -1), keepdims=True)
    assert s.type == TensorType([1, None, 1], "float32")


def test_node_records_op_inputs_checked_attrs_name_and_outputs():
    x = input_value(f32(2, 3), "x")
    line = _line(); s = R.sum(x, axis=1, name="total")  # noqa: E702
    node = s.node
    assert node.op is R.sum and node.inputs == (x,)
    assert dict(node.attrs) == {"axis": (1,), "keepdims": False}  # int -> 1-tuple, default filled
    assert node.name == "total" and node.source == f"{HERE}:{line}"
    assert node.outputs == (s,) and s.index == 0
    assert "node 'total' op sum (at " in node.where()


def test_python_scalars_take_the_dtype_of_the_tensor_beside_them():
    x64 = input_value(TensorType([2], "float64"), "x")
    i32 = input_value(TensorType([2], "int32"), "i")
    assert E.add(x64, 1.5).dtype is DType("float64")
    assert E.add(i32, 2).dtype is DType("int32")
    assert E.add(i32, 2.5).dtype is DType("float64")  # a float beside ints: NumPy's promotion
    c = as_value(3)
    assert c.kind == CONST and c.dtype is DType("int64")
    assert as_value(True).dtype is DType("bool")
    assert as_value([1.0, 2.0]).dtype is DType("float32")
    assert as_value(np.array([1.0, 2.0])).dtype is DType("float64")


def test_constants_are_read_only():
    c = as_value(np.arange(3.0))
    with pytest.raises(ValueError):
        c.data[0] = 5


def test_non_tensor_argument_is_a_build_error():
    x = input_value(f32(2), "x")
    with pytest.raises(GraphBuildError, match="cannot use"):
        E.add(x, object())


def test_clone_node_keeps_name_and_source_and_reinfers_types():
    x = input_value(f32(2, 3), "x")
    with source_scope("orig"):
        s = R.sum(x, axis=0, name="s")
    wider = input_value(TensorType([None, 5], "float32"), "w")
    (t,) = clone_node(s.node, [wider])
    assert t.type == TensorType([5], "float32")
    assert t.node.name == "s" and t.node.source == "orig" and t.node is not s.node
    (u,) = clone_node(s.node, [x], attrs={"axis": (1,), "keepdims": True})
    assert u.type == TensorType([2, 1], "float32")


def test_rebuild_swaps_values_and_rebuilds_only_downstream_nodes():
    x = input_value(f32(2), "x")
    a = E.exp(x)
    b = E.neg(x)
    c = E.add(a, b)
    x2 = input_value(TensorType([None], "float32"), "x2")
    (c2,) = rebuild([c], {id(b): E.tanh(x2)})
    assert c2.node is not c.node
    assert c2.node.inputs[0] is a  # untouched upstream node is shared
    assert c2.node.inputs[1].node.op.name == "tanh"
    assert c2.type == TensorType([2], "float32")
