"""Malformed cgvm graph files (binary and ``.pbtxt``), each written here from a valid one: every
``load_graph`` fails with a SerializationError naming the file and the graph / node / value at
fault (the protobuf error chained where protobuf raised one), never a RecursionError, and changes
nothing outside (the op table, the default Workspace).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from google.protobuf import message as pb_message
from google.protobuf import text_format

import cgvm
from cgvm.errors import SerializationError
from cgvm.ir import TensorType, input_value, param_value, save_graph, load_graph
from cgvm.ir import cgvm_pb2 as pb
from cgvm.ir.graph import Graph, const_value
from cgvm.ir.opschema import OPS
from cgvm.ops import elementwise as E
from cgvm.vm import default_workspace


def graph() -> Graph:
    x = input_value(TensorType([None, 3], "float32"), "x")
    w = param_value("w", TensorType([3], "float32"))
    c = const_value(np.arange(3, dtype=np.float32))
    return Graph([x], [E.add(E.mul(x, w), c)], name="corpus")


def state() -> Any:
    return tuple(sorted(OPS)), tuple(sorted(default_workspace().keys()))


def failed(path: Path, match: str) -> SerializationError:
    before = state()
    with pytest.raises(SerializationError, match=match) as info:
        load_graph(path)
    assert str(path) in str(info.value)
    assert state() == before
    return info.value


def proto() -> pb.GraphProto:
    from cgvm.ir import graph_to_proto

    return graph_to_proto(graph())


def write(tmp_path: Path, name: str, p: pb.GraphProto) -> Path:
    path = tmp_path / name
    path.write_bytes(text_format.MessageToString(p).encode() if name.endswith(".pbtxt") else p.SerializeToString())
    return path


def nested_text(depth: int) -> str:
    return ('format_version: 1\nname: "deep"\nnodes { op: "add" attrs { key: "x" value { '
            + "tuple { values { " * depth + "i: 1" + " } }" * depth + " } } }\n")


def _varint(x: int) -> bytes:
    out = b""
    while True:
        b, x = x & 0x7F, x >> 7
        if not x:
            return out + bytes([b])
        out += bytes([b | 0x80])


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def nested_binary(depth: int) -> bytes:
    av = _varint(1 << 3) + _varint(1)             # AttrValue.i = 1
    for _ in range(depth):
        av = _field(12, _field(1, av))            # AttrValue.tuple -> AttrList.values
    node = _field(1, b"add") + _field(4, _field(1, b"x") + _field(2, av))
    return _varint(1 << 3) + _varint(1) + _field(6, node)


@pytest.mark.parametrize("depth", [200, 5000])
def test_text_nested_deep(tmp_path, depth):
    path = tmp_path / "deep.pbtxt"
    path.write_text(nested_text(depth))
    failed(path, f"nested {2 * depth + 3} deep")


def test_binary_nested_deep(tmp_path):
    path = tmp_path / "deep.cgvm"
    path.write_bytes(nested_binary(200))
    err = failed(path, "not a cgvm graph file")
    assert isinstance(err.__cause__, pb_message.DecodeError)


def test_braces_in_strings_and_comments_do_not_count(tmp_path):
    p = proto()
    p.name = "{" * 300 + "<"
    path = write(tmp_path, "braces.pbtxt", p)
    path.write_text("# " + "{" * 300 + "\n" + path.read_text())
    assert load_graph(path).name == p.name


@pytest.mark.parametrize("suffix", [".cgvm", ".pbtxt"])
@pytest.mark.parametrize("case", ["garbage", "truncated", "not_utf8"])
def test_not_a_graph_file(tmp_path, suffix, case):
    good = write(tmp_path, f"good{suffix}", proto()).read_bytes()
    data = {"garbage": b"\xff\x00 junk {{ ]] " * 20, "truncated": good[: len(good) // 2],
            "not_utf8": b"\xff\xfe" + good}[case]
    path = tmp_path / f"{case}{suffix}"
    path.write_bytes(data)
    err = failed(path, "graph")
    assert err.__cause__ is not None or "graph" in str(err)


EDITS: dict = {
    "newer_format": (lambda p: setattr(p, "format_version", 99), "newer cgvm"),
    "no_format": (lambda p: setattr(p, "format_version", 0), "format_version"),
    "unknown_op": (lambda p: setattr(p.nodes[0], "op", "no_such_op"), "no_such_op"),
    "input_undefined": (lambda p: p.nodes[0].inputs.__setitem__(0, 12345), "12345"),
    "huge_dims_constant": (lambda p: next(v for v in p.values if v.kind == pb.ValueProto.CONST).data.dims.__setitem__(
        0, 2 ** 62), "bytes"),
    "negative_dims": (lambda p: next(v for v in p.values if v.kind == pb.ValueProto.CONST).type.dims.__setitem__(
        0, -7), "dimensions"),
    "object_dtype": (lambda p: setattr(next(v for v in p.values if v.kind == pb.ValueProto.CONST).data, "dtype", "O"),
                     "dtype"),
    "bad_kind": (lambda p: setattr(p.values[0], "kind", 99), "kind 99"),
    "duplicate_id": (lambda p: setattr(p.values[1], "id", p.values[0].id), "twice"),
    "output_type_lies": (lambda p: next(v for v in p.values if v.kind == pb.ValueProto.NODE).type.dims.append(5),
                         "stored as"),
}


@pytest.mark.parametrize("suffix", [".cgvm", ".pbtxt"])
@pytest.mark.parametrize("case", list(EDITS))
def test_corrupt_contents(tmp_path, suffix, case):
    change, match = EDITS[case]
    p = proto()
    change(p)
    failed(write(tmp_path, f"{case}{suffix}", p), match)


def test_a_directory(tmp_path):
    with pytest.raises(SerializationError, match="directory"):
        load_graph(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_graph(tmp_path / "missing.cgvm")


def test_the_valid_file_loads(tmp_path):
    """The seed of every case above loads and computes as saved (so the failures are the edits')."""
    for suffix in (".cgvm", ".pbtxt"):
        path = tmp_path / f"ok{suffix}"
        save_graph(graph(), path)
        g = load_graph(path)
        ws = cgvm.Workspace()
        ws["w"] = np.array([1, 2, 3], np.float32)
        f = cgvm.compile(list(g.inputs), g.outputs[0], workspace=ws)
        np.testing.assert_allclose(f(np.ones((2, 3), np.float32)), np.array([[1, 3, 5]] * 2, np.float32))
