"""The serialized form of a graph: ``Graph`` <-> ``cgvm.GraphProto`` (proto/cgvm.proto) <-> a file.

    save_graph(graph, "model.cgvm")       # binary protobuf (".pbtxt" / ".txt": protobuf text format)
    graph = load_graph("model.cgvm")

A file carries what the user chose: input, parameter and constant values (kinds, names, types
with unknown dimensions, constant data), and for each node its op, attributes (ints, floats,
bools, strings, tuples nested to any depth, None, dtypes, arrays and sub-graphs), name and
source, in the graph's node order. Loading rebuilds every node through the builder's ``apply``
with its stored source, so attributes and output types are checked again by the op's rules,
and errors about a loaded node still point to where the user wrote it.

Ops are found by name in the IR's op table (``opschema.get_op``): this module never imports
``cgvm.ops``; ``import cgvm`` registers the built-in ops before a graph is loaded. Anything
wrong with the data raises ``SerializationError`` saying which graph, node, value or attribute.

This module reads and writes files; the work is done in ``serialize_write`` (Graph -> GraphProto),
``serialize_read`` (GraphProto -> Graph), ``serialize_compare`` (``graph_difference``) and
``serialize_format`` (what writer and reader agree on).
"""
from __future__ import annotations

import os
from typing import Union

from google.protobuf import message as _pb_message
from google.protobuf import text_format

from ..errors import SerializationError
from . import cgvm_pb2 as pb
from .graph import Graph
from .serialize_compare import graph_difference
from .serialize_format import FORMAT_VERSION
from .serialize_read import graph_from_proto
from .serialize_write import graph_to_proto

__all__ = ["FORMAT_VERSION", "SerializationError", "graph_to_proto", "graph_from_proto", "save_graph",
           "load_graph", "graph_difference"]

#: file name endings saved and loaded in protobuf's text format instead of binary
TEXT_SUFFIXES = (".pbtxt", ".txt")

PathLike = Union[str, "os.PathLike[str]"]


def save_graph(graph: Graph, path: PathLike) -> None:
    """Write ``graph`` to ``path``: binary protobuf, or text format for names ending .pbtxt/.txt."""
    proto = graph_to_proto(graph)
    path = os.fspath(path)
    if path.endswith(TEXT_SUFFIXES):
        data = text_format.MessageToString(proto).encode("utf-8")
    else:
        data = proto.SerializeToString(deterministic=True)  # same graph, same bytes
    with open(path, "wb") as f:
        f.write(data)


def load_graph(path: PathLike) -> Graph:
    """Read a graph written by ``save_graph``; the ops it uses must be registered (``import cgvm``)."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        data = f.read()
    proto = pb.GraphProto()
    try:
        if path.endswith(TEXT_SUFFIXES):
            text_format.Parse(data.decode("utf-8"), proto)
        else:
            proto.ParseFromString(data)
    except (_pb_message.DecodeError, text_format.ParseError, UnicodeDecodeError) as exc:
        raise SerializationError(f"{path}: not a cgvm graph file ({exc})") from None
    try:
        return graph_from_proto(proto)
    except SerializationError as exc:
        raise SerializationError(f"{path}: {exc}") from exc
