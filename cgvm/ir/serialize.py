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
import re
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


#: how deep messages may nest in a graph file: protobuf's binary parser stops at this depth too, and
#: the text parser (pure Python, recursive) would exhaust the stack long before its own limit
MAX_NESTING = 100

_TEXT_STRINGS_AND_COMMENTS = re.compile(rb'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|#[^\n]*')


def _text_nesting(data: bytes) -> int:
    """How deep ``{``/``<`` blocks nest in protobuf text ``data`` (strings and comments skipped)."""
    import numpy as np

    b = np.frombuffer(_TEXT_STRINGS_AND_COMMENTS.sub(b'""', data), np.uint8)
    steps = ((b == ord("{")) | (b == ord("<"))).astype(np.int64) - ((b == ord("}")) | (b == ord(">")))
    return int(np.cumsum(steps).max()) if steps.size else 0


def load_graph(path: PathLike) -> Graph:
    """Read a graph written by ``save_graph``; the ops it uses must be registered (``import cgvm``).

    Every problem with the file raises ``SerializationError`` naming it (the library's error as the
    cause); nothing outside the returned graph is changed.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise SerializationError(f"{path} is a directory, not a cgvm graph file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SerializationError(f"{path} cannot be read: {exc}") from exc
    proto = pb.GraphProto()
    try:
        if path.endswith(TEXT_SUFFIXES):
            depth = _text_nesting(data)
            if depth > MAX_NESTING:
                raise SerializationError(f"{path}: blocks nested {depth} deep, more than the {MAX_NESTING} a "
                                         "graph file may use (a corrupt or hostile file)")
            text_format.Parse(data.decode("utf-8"), proto)
        else:
            proto.ParseFromString(data)
    except SerializationError:
        raise
    except (_pb_message.DecodeError, text_format.ParseError, UnicodeDecodeError, RecursionError, ValueError,
            TypeError, OverflowError) as exc:
        raise SerializationError(f"{path}: not a cgvm graph file ({exc})") from exc
    try:
        return graph_from_proto(proto)
    except SerializationError as exc:
        raise SerializationError(f"{path}: {exc}") from exc
    except RecursionError as exc:
        raise SerializationError(f"{path}: sub-graphs nested too deep to rebuild") from exc
