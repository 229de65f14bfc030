"""Saving and loading graphs: files, data that cannot be loaded, graphs that cannot be saved.

The round trips themselves are in test_serialize.py; here every way of failing must raise
SerializationError saying where: the file, graph, node (with the user's source), value or attribute.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

import cgvm
from cgvm.ir import Graph, OpSchema, TensorType, apply, graph_from_proto, graph_to_proto, input_value, param_value
from cgvm.ir import cgvm_pb2 as pb
from cgvm.ir import load_graph, save_graph
from cgvm.ir.attrs import Any_, Array, GraphAttr, Int, Ints
from cgvm.ir.graph import const_value
from cgvm.ir.opschema import OPS
from cgvm.ir.serialize import FORMAT_VERSION, SerializationError, graph_difference
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R

REPO_ROOT = Path(__file__).resolve().parents[2]


def f32(*shape):
    return TensorType(shape, "float32")


def chain() -> Graph:
    """add, neg, exp, mul, tanh, relu: nodes #0-#5 of graph 'chain'."""
    x = input_value(TensorType([None, 4], "float32"), "x")
    y = input_value(f32(4), "y")
    return Graph([x, y], [E.relu(E.tanh(E.mul(E.add(x, y), E.exp(E.neg(y)))), negative_slope=0.25)],
                 name="chain")


def leaves() -> Graph:
    """Parameters and constants; the first constant is a bool[3] mask."""
    x = input_value(f32(3), "x")
    w = param_value("w", f32(3))
    mask = const_value(np.array([True, False, True]))
    table = const_value(np.arange(6.0).reshape(2, 3))
    return Graph([x], [E.add(E.mul(x, w), E.cast(mask, dtype="float32")), R.sum(table, axis=0)], name="leaves")


def grads() -> Graph:
    x = input_value(TensorType([None, 3], "float64"), "x")
    w = param_value("w", TensorType([3], "float64"))
    cost = R.sum(E.tanh(E.mul(x, w)))
    return Graph([x], [cost] + cgvm.grad(cost, [w, x]), name="grads")


@pytest.fixture
def attr_op():
    """An IR-only op (never compiled) whose attributes take any value: for values that cannot be saved."""
    op = OpSchema("_test_serialize_errors_attrs", infer=lambda types, **_: types[0],
                  attrs={"i": Int(0), "ints": Ints(()), "table": Array(None), "body": GraphAttr(None),
                         "any": Any_(None)})
    yield op
    del OPS[op.name]


# ============================================================================ graphs that cannot be saved


def test_unsupported_attribute_values_cannot_be_saved(attr_op):
    x = input_value(f32(2), "x")
    for bad, what in ((print, "builtin_function_or_method"), ((1, {2: 3}), "dict"),
                      (np.array(["a"]), "dtype <U1")):
        y = apply(attr_op, [x], {"any": bad} if not isinstance(bad, np.ndarray) else {"table": bad},
                  name="holder")
        with pytest.raises(SerializationError) as info:
            graph_to_proto(Graph([x], [y], name="g"))
        msg = str(info.value)
        assert "graph 'g'" in msg and "node 'holder'" in msg and what in msg


def test_ints_beyond_64_bits_cannot_be_saved(attr_op):
    x = input_value(f32(2), "x")
    for attrs in ({"i": 2 ** 64}, {"ints": (1, -(2 ** 70))}, {"any": (2 ** 63,)}):
        y = apply(attr_op, [x], attrs)
        with pytest.raises(SerializationError, match="64 bits"):
            graph_to_proto(Graph([x], [y]))


# ============================================================================ files


def test_save_and_load_binary_and_text(tmp_path):
    graph = grads()
    for name in ("g.cgvm", "g.pbtxt"):
        path = tmp_path / name
        save_graph(graph, path)
        copy = load_graph(str(path))
        assert graph_difference(graph, copy) is None
    assert (tmp_path / "g.pbtxt").read_text().startswith("format_version: 1\nname: \"grads\"")


def test_saving_is_deterministic(tmp_path):
    graph = leaves()
    save_graph(graph, tmp_path / "a.cgvm")
    save_graph(load_graph(tmp_path / "a.cgvm"), tmp_path / "b.cgvm")
    assert (tmp_path / "a.cgvm").read_bytes() == (tmp_path / "b.cgvm").read_bytes()


def test_constants_are_little_endian_raw_bytes():
    x = input_value(TensorType([2], "int32"), "x")
    y = E.add(x, np.array([1, 256], np.int32))
    proto = graph_to_proto(Graph([x], [y]))
    const = next(v for v in proto.values if v.kind == pb.ValueProto.CONST)
    assert const.data.dtype == "int32" and list(const.data.dims) == [2]
    assert const.data.raw_data == b"\x01\x00\x00\x00\x00\x01\x00\x00"
    assert list(proto.values[0].type.dims) == [2] and proto.values[0].kind == pb.ValueProto.INPUT
    unknown = graph_to_proto(Graph([input_value(TensorType([None, 3], "float32"))], []))
    assert list(unknown.values[0].type.dims) == [-1, 3]


# ============================================================================ corrupt data


def _proto(graph: Optional[Graph] = None) -> pb.GraphProto:
    return graph_to_proto(graph if graph is not None else chain())


def _load_fails(proto: pb.GraphProto, *fragments: str) -> str:
    with pytest.raises(SerializationError) as info:
        graph_from_proto(pb.GraphProto.FromString(proto.SerializeToString()))
    msg = str(info.value)
    for fragment in fragments:
        assert fragment in msg, msg
    return msg


def test_not_a_graph_file(tmp_path):
    for name, data in (("junk.cgvm", b"\xff\xfe\x00garbage"), ("empty.cgvm", b""),
                       ("truncated.cgvm", graph_to_proto(grads()).SerializeToString()[:-7]),
                       ("junk.pbtxt", b"values { id: ")):
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(SerializationError) as info:
            load_graph(path)
        assert str(info.value).startswith(str(path)), info.value


def test_format_version():
    proto = _proto()
    proto.format_version = FORMAT_VERSION + 1
    _load_fails(proto, f"format {FORMAT_VERSION + 1}", "newer cgvm")
    proto.format_version = 0
    _load_fails(proto, "not a cgvm graph")


def test_unknown_op_says_to_import_it():
    proto = _proto()
    proto.nodes[1].op = "frobnicate"
    _load_fails(proto, "graph 'chain'", "node #1", "unknown op 'frobnicate'", "import cgvm")


def test_node_reads_an_undefined_value_or_a_value_computed_later():
    proto = _proto()
    proto.nodes[0].inputs[0] = 999
    _load_fails(proto, "node #0", "reads value 999", "does not define")
    proto = _proto()
    proto.nodes[0].inputs[0] = proto.nodes[2].outputs[0]
    _load_fails(proto, "node #0", "before the node computing it")


def test_bad_attribute_value_names_node_attribute_and_source():
    proto = _proto()
    relu = next(n for n in proto.nodes if n.op == "relu")
    relu.attrs["negative_slope"].s = "steep"
    msg = _load_fails(proto, "relu", "cannot be rebuilt", "'negative_slope'", "expected a number")
    assert __file__ in msg  # the node's stored source: where the user wrote it
    relu.attrs["negative_slope"].Clear()
    _load_fails(proto, "attribute 'negative_slope'", "has no value")
    relu.attrs["negative_slope"].f = 0.5
    relu.attrs["speed"].i = 3
    _load_fails(proto, "no attribute 'speed'")


def test_stored_output_type_must_agree_with_the_rule():
    proto = _proto()
    out_id = proto.nodes[0].outputs[0]
    proto.values[out_id].type.dims[-1] = 5
    _load_fails(proto, "output 0 is stored as float32[?,5]", "gives float32[?,4]")
    proto = _proto()
    proto.values[proto.nodes[0].outputs[0]].type.dtype = "int64"
    _load_fails(proto, "stored as int64")


def test_bad_types_and_tensors():
    graph = leaves()
    cases = [
        (lambda p: setattr(p.values[0].type, "dtype", "float128x"), "not a dtype"),
        (lambda p: p.values[0].type.dims.__setitem__(0, -3), "bad dimensions"),
        (lambda p: setattr(_const(p).data, "raw_data", _const(p).data.raw_data[:-1]), "truncated or corrupt"),
        (lambda p: setattr(_const(p).data, "dtype", "object"), "cannot be loaded"),
        (lambda p: _const(p).data.dims.append(2), "bytes"),
        (lambda p: setattr(_const(p, "bool").data, "raw_data", b"\x02\x00\x01"), "other than 0 and 1"),
        (lambda p: _const(p).ClearField("data"), "a constant without data"),
        (lambda p: setattr(_const(p).data, "dtype", "int8"), "constant data is int8[3] but its type says bool[3]"),
    ]
    for corrupt, fragment in cases:
        proto = _proto(graph)
        corrupt(proto)
        _load_fails(proto, "graph 'leaves'", fragment)


def _const(proto: pb.GraphProto, dtype: Optional[str] = None) -> pb.ValueProto:
    return next(v for v in proto.values if v.kind == pb.ValueProto.CONST and (dtype is None or v.data.dtype == dtype))


def test_bad_values():
    proto = _proto(leaves())
    param = next(v for v in proto.values if v.kind == pb.ValueProto.PARAM)
    param.ClearField("name")
    _load_fails(proto, "a parameter without a name")
    proto = _proto()
    proto.values[0].kind = pb.ValueProto.KIND_UNSPECIFIED
    _load_fails(proto, "value 0", "unknown value kind")
    proto = _proto()
    proto.values.add().CopyFrom(proto.values[0])
    _load_fails(proto, "value id 0 is defined twice")
    proto = _proto()
    proto.inputs.append(proto.inputs[0])
    _load_fails(proto, "given twice as an input")
    proto = _proto()
    del proto.inputs[1]
    _load_fails(proto, "an input value that is not among the graph's inputs")
    proto = _proto()
    proto.outputs.append(12345)
    _load_fails(proto, "a graph output: reads value 12345")
    proto = _proto()
    proto.nodes[0].outputs.append(proto.nodes[1].outputs[0])
    _load_fails(proto, "node #0", "2 stored outputs", "gives 1")
    proto = _proto()
    proto.nodes[1].outputs[0] = proto.nodes[0].outputs[0]
    _load_fails(proto, "node #1", "already has a value")


def test_corrupt_sub_graph_names_the_path_to_it(attr_op):
    x = input_value(f32(2), "x")
    a = input_value(f32(2), "a")
    inner = apply(attr_op, [E.exp(a)], {}, source="inner.py:3")
    y = apply(attr_op, [x], {"body": Graph([a], [inner], name="body1")}, name="outer_node")
    proto = graph_to_proto(Graph([x], [y], name="main"))
    inner = proto.nodes[0].attrs["body"].graph
    inner.nodes[1].op = "nope"
    _load_fails(proto, "graph 'main': node #0 (_test_serialize_errors_attrs 'outer_node' at ",
                "attribute 'body': graph 'body1': node #1 (nope at inner.py:3): unknown op 'nope'")


def test_unclosed_graphs_cannot_be_saved():
    x = input_value(f32(2), "x")
    stray = input_value(f32(2), "stray")
    y = E.add(x, stray)
    with pytest.raises(SerializationError, match=r"reads %stray.*neither a graph input"):
        graph_to_proto(Graph([x], [y], nodes=[y.node]))
    a = E.exp(x)
    b = E.tanh(a)
    with pytest.raises(SerializationError, match="not in topological order"):
        graph_to_proto(Graph([x], [b], nodes=[b.node, a.node]))


def test_not_a_proto():
    with pytest.raises(SerializationError, match="expected a cgvm GraphProto"):
        graph_from_proto(b"bytes")


# ============================================================================ the generated module


def test_checked_in_module_matches_a_fresh_generation():
    pytest.importorskip("grpc_tools", reason="grpcio-tools is needed to run protoc")
    spec = importlib.util.spec_from_file_location("gen_proto", REPO_ROOT / "scripts" / "gen_proto.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    fresh = generator.generate_source("cgvm")
    assert generator.output_file("cgvm").read_text(encoding="utf-8") == fresh, \
        "cgvm/ir/cgvm_pb2.py is stale: run python scripts/gen_proto.py cgvm"


def test_checked_in_module_has_no_runtime_version_gate():
    text = (REPO_ROOT / "cgvm" / "ir" / "cgvm_pb2.py").read_text(encoding="utf-8")
    assert "ValidateProtobufRuntimeVersion" not in text and "runtime_version" not in text
