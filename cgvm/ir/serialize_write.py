"""Graph -> ``cgvm.GraphProto``: values, nodes and attributes (sub-graphs nested) in the graph's order.

Leaves (parameters, constants) are written when a node first reads them; anything a node reads
that the graph cannot account for is refused with a ``SerializationError`` saying where.
"""
from __future__ import annotations

from typing import Any, Callable, Dict

import numpy as np

from ..errors import SerializationError
from . import cgvm_pb2 as pb
from .graph import CONST, PARAM, Graph, Node, Value
from .serialize_format import FORMAT_VERSION, KIND_TO_PROTO, located, storable
from .types import DType

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def graph_to_proto(graph: Graph) -> pb.GraphProto:
    """The ``GraphProto`` of ``graph``; sub-graphs in attributes are nested GraphProtos."""
    out = pb.GraphProto()
    try:
        _write_graph(graph, out)
    except SerializationError as exc:
        raise located(f"graph {graph.name!r}", exc) from None
    return out


def _write_graph(graph: Graph, out: pb.GraphProto) -> None:
    out.format_version = FORMAT_VERSION
    out.name = graph.name
    ids: Dict[int, int] = {}  # id(Value) -> value id in this GraphProto
    produced = {id(o) for n in graph.nodes for o in n.outputs}

    def add(v: Value) -> int:
        vid = len(out.values)
        ids[id(v)] = vid
        _write_value(v, vid, out.values.add())
        return vid

    def leaf(v: Value) -> int:
        """The id of a value being read; leaves are written when first read."""
        vid = ids.get(id(v))
        if vid is not None:
            return vid
        if id(v) in produced:
            raise SerializationError(f"reads {v.label()} before the node computing it; the nodes are not in "
                                     "topological order")
        if v.kind not in (PARAM, CONST):
            made = f" (computed at {v.source})" if v.source else ""
            raise SerializationError(f"reads {v.label()} ({v.type!r}){made}, which is neither a graph input, "
                                     "a parameter, a constant nor computed by a node of the graph")
        return add(v)

    for v in graph.inputs:
        if id(v) in ids:
            raise SerializationError(f"{v.label()} is given twice as an input")
        add(v)
    for k, node in enumerate(graph.nodes):
        try:
            _write_node(node, out.nodes.add(), leaf, add, ids)
        except SerializationError as exc:
            raise located(f"node #{k} ({node.where()})", exc) from None
    out.inputs.extend(ids[id(v)] for v in graph.inputs)
    try:
        out.outputs.extend(leaf(v) for v in graph.outputs)
    except SerializationError as exc:
        raise located("a graph output", exc) from None


def _write_node(node: Node, out: pb.NodeProto, leaf: Callable[[Value], int], add: Callable[[Value], int],
                ids: Dict[int, int]) -> None:
    out.op = node.op.name
    out.inputs.extend(leaf(v) for v in node.inputs)
    for o in node.outputs:
        if id(o) in ids:
            raise SerializationError(f"computes {o.label()}, which already has a value (a graph input or "
                                     "another node's output)")
        out.outputs.append(add(o))
    for key, value in node.attrs.items():
        try:
            _write_attr(value, out.attrs[key])
        except SerializationError as exc:
            raise located(f"attribute {key!r}", exc) from None
    if node.name is not None:
        out.name = node.name
    if node.source is not None:
        out.source = node.source


def _write_value(v: Value, vid: int, out: pb.ValueProto) -> None:
    out.id = vid
    out.kind = KIND_TO_PROTO[v.kind]
    out.type.dims.extend(-1 if d is None else d for d in v.type.shape)
    out.type.dtype = v.type.dtype.name
    if v.name is not None:
        out.name = v.name
    if v.kind == CONST:
        try:
            if v.data is None:
                raise SerializationError("it has no data")
            _write_tensor(v.data, out.data)
        except SerializationError as exc:
            raise located(f"constant {v.label()}", exc) from None


def _write_tensor(arr: np.ndarray, out: pb.TensorProto) -> None:
    arr = np.asarray(arr)
    if not storable(arr.dtype):
        raise SerializationError(f"arrays of dtype {arr.dtype} cannot be saved; only numbers and bools")
    out.dtype = arr.dtype.name
    out.dims.extend(arr.shape)
    out.raw_data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_float(x: Any) -> bool:
    return isinstance(x, (float, np.floating))


def _check_int64(x: Any) -> int:
    if not _INT64_MIN <= x <= _INT64_MAX:
        raise SerializationError(f"{x} does not fit in 64 bits")
    return int(x)


def _write_attr(value: Any, out: pb.AttrValue) -> None:
    if value is None:
        out.none.SetInParent()
    elif isinstance(value, (bool, np.bool_)):
        out.b = bool(value)
    elif _is_int(value):
        out.i = _check_int64(value)
    elif _is_float(value):
        out.f = float(value)
    elif isinstance(value, str):
        out.s = value
    elif isinstance(value, DType):
        out.dtype = value.name
    elif isinstance(value, np.ndarray):
        _write_tensor(value, out.tensor)
    elif isinstance(value, Graph):
        try:
            _write_graph(value, out.graph)
        except SerializationError as exc:
            raise located(f"graph {value.name!r}", exc) from None
    elif isinstance(value, (tuple, list)):
        items = list(value)
        if items and all(_is_int(x) for x in items):
            out.ints.values.extend(_check_int64(x) for x in items)
        elif items and all(_is_float(x) for x in items):
            out.floats.values.extend(float(x) for x in items)
        elif items and all(isinstance(x, str) for x in items):
            out.strings.values.extend(items)
        else:  # nested, mixed or empty: one AttrValue per item keeps every item's kind
            out.tuple.SetInParent()
            for i, x in enumerate(items):
                try:
                    _write_attr(x, out.tuple.values.add())
                except SerializationError as exc:
                    raise located(f"item {i}", exc) from None
    else:
        raise SerializationError(f"a value of type {type(value).__name__} ({value!r:.60}) has no serialized "
                                 "form; attributes must be numbers, bools, strings, None, dtypes, arrays, graphs "
                                 "or tuples of these")
