"""``cgvm.GraphProto`` -> Graph: every node is rebuilt through the builder's ``apply`` with its stored
source, so the op's rules check attributes and output types again.

Stored data is never trusted: ids, kinds, dtypes, dimensions and array byte counts are checked,
and ops are found by name in the IR's op table (``opschema.get_op``), never imported.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ..errors import CgvmError, SerializationError
from . import cgvm_pb2 as pb
from .builder import apply
from .graph import CONST, INPUT, NODE, PARAM, Graph, Node, Value, const_value, input_value, param_value
from .opschema import get_op
from .serialize_format import FORMAT_VERSION, KIND_FROM_PROTO, located, storable
from .types import DType, TensorType


def graph_from_proto(proto: pb.GraphProto) -> Graph:
    """Rebuild the graph of ``proto``: every node through ``apply``, so rules check it again."""
    if not isinstance(proto, pb.GraphProto):
        raise SerializationError(f"expected a cgvm GraphProto, got {type(proto).__name__}")
    try:
        return _read_graph(proto)
    except SerializationError as exc:
        raise located(f"graph {proto.name!r}", exc) from None


def _read_graph(proto: pb.GraphProto) -> Graph:
    if proto.format_version < 1:
        raise SerializationError("no format_version; this is not a cgvm graph (or it is empty)")
    if proto.format_version > FORMAT_VERSION:
        raise SerializationError(f"written in format {proto.format_version} by a newer cgvm; this one reads "
                                 f"formats up to {FORMAT_VERSION}")
    stored: Dict[int, pb.ValueProto] = {}
    for vp in proto.values:
        if vp.id in stored:
            raise SerializationError(f"value id {vp.id} is defined twice")
        stored[vp.id] = vp
    graph_inputs = set(proto.inputs)
    if len(graph_inputs) != len(proto.inputs):
        raise SerializationError("a value is given twice as an input")
    env: Dict[int, Value] = {}  # value id -> Value, filled as values become defined
    for vp in proto.values:
        try:
            value = _read_leaf(vp, vp.id in graph_inputs)
        except SerializationError as exc:
            raise located(f"value {vp.id}", exc) from None
        if value is not None:
            env[vp.id] = value

    def lookup(vid: int) -> Value:
        hit = env.get(vid)
        if hit is not None:
            return hit
        if vid in stored:
            raise SerializationError(f"reads value {vid} before the node computing it")
        raise SerializationError(f"reads value {vid}, which the graph does not define")

    inputs = []
    for vid in proto.inputs:
        if vid not in env:  # every stored value listed as an input is in env by now
            raise SerializationError(f"input value {vid} is not defined")
        inputs.append(env[vid])
    nodes: List[Node] = []
    for k, np_ in enumerate(proto.nodes):
        try:
            nodes.append(_read_node(np_, stored, env, lookup))
        except SerializationError as exc:
            raise located(f"node #{k} ({_node_text(np_)})", exc) from None
    outputs = []
    for vid in proto.outputs:
        try:
            outputs.append(lookup(vid))
        except SerializationError as exc:
            raise located("a graph output", exc) from None
    return Graph(inputs, outputs, nodes=nodes, name=proto.name)


def _node_text(np_: pb.NodeProto) -> str:
    name = repr(np_.name) if np_.HasField("name") and np_.name else ""
    source = f"at {np_.source}" if np_.HasField("source") and np_.source else ""
    return " ".join(x for x in (np_.op, name, source) if x)


def _kind_name(kind: int) -> str:
    return KIND_FROM_PROTO.get(kind, f"kind {kind}")


def _read_leaf(vp: pb.ValueProto, is_graph_input: bool) -> Optional[Value]:
    """The Value of an input, parameter or constant (None for a value a node computes)."""
    kind = KIND_FROM_PROTO.get(vp.kind)
    if kind is None:
        raise SerializationError(f"unknown value kind {vp.kind}")
    if kind == NODE and not is_graph_input:
        return None
    type_ = _read_type(vp.type)
    name = vp.name if vp.HasField("name") else None
    if kind == INPUT:
        if not is_graph_input:
            raise SerializationError("an input value that is not among the graph's inputs")
        return input_value(type_, name)
    if kind == PARAM:
        if not name:
            raise SerializationError("a parameter without a name")
        return param_value(name, type_)
    if kind == CONST:
        if not vp.HasField("data"):
            raise SerializationError("a constant without data")
        data = _read_tensor(vp.data)
        if data.shape != type_.shape or data.dtype != type_.dtype.np:
            raise SerializationError(f"constant data is {data.dtype}{list(data.shape)} but its type says {type_!r}")
        value = const_value(data, type_.dtype)
        value.name = name
        return value
    # a graph cut by pruning: a value some node computed, now fed from outside
    return Value(type_, name=name, kind=NODE)


def _read_type(tp: pb.TensorTypeProto) -> TensorType:
    dims = [None if d == -1 else d for d in tp.dims]
    if any(d is not None and d < 0 for d in dims):
        raise SerializationError(f"bad dimensions {list(tp.dims)} (-1 is unknown, others are sizes)")
    return TensorType(dims, _read_dtype(tp.dtype))


def _read_dtype(name: str) -> DType:
    hit = _DTYPES.get(name)  # a plain dict hit: loading checks a dtype for every value
    if hit is not None:
        return hit
    try:
        dtype = DType(name)
    except CgvmError as exc:  # DTypeError: not a dtype, or one cgvm does not support
        raise SerializationError(str(exc)) from None
    if dtype.name == name:
        _DTYPES[name] = dtype
    return dtype


_DTYPES: Dict[str, DType] = {}


def _read_tensor(tp: pb.TensorProto) -> np.ndarray:
    try:
        dtype = np.dtype(tp.dtype)
    except TypeError:
        raise SerializationError(f"unknown array dtype {tp.dtype!r}") from None
    if not storable(dtype):
        raise SerializationError(f"arrays of dtype {dtype} cannot be loaded; only numbers and bools")
    dims = tuple(tp.dims)
    if any(d < 0 for d in dims):
        raise SerializationError(f"bad array dimensions {list(dims)}")
    count = math.prod(dims)
    if len(tp.raw_data) != count * dtype.itemsize:
        raise SerializationError(f"array data has {len(tp.raw_data)} bytes; {dtype}{list(dims)} needs "
                                 f"{count * dtype.itemsize} (the data is truncated or corrupt)")
    raw = np.frombuffer(tp.raw_data, dtype=dtype.newbyteorder("<"), count=count)
    if dtype.kind == "b" and count and raw.view(np.uint8).max() > 1:
        raise SerializationError("bool array data holds bytes other than 0 and 1")
    arr = raw.reshape(dims).astype(dtype)  # a native-order, writable copy, then frozen as attrs are
    arr.flags.writeable = False
    return arr


def _read_attr(av: pb.AttrValue) -> Any:
    which = av.WhichOneof("value")
    if which is None:
        raise SerializationError("the attribute has no value")
    if which in ("i", "f", "b", "s"):
        return getattr(av, which)
    if which == "ints":
        return tuple(int(x) for x in av.ints.values)
    if which == "floats":
        return tuple(float(x) for x in av.floats.values)
    if which == "strings":
        return tuple(str(x) for x in av.strings.values)
    if which == "dtype":
        return _read_dtype(av.dtype)
    if which == "tensor":
        return _read_tensor(av.tensor)
    if which == "graph":
        try:
            return _read_graph(av.graph)
        except SerializationError as exc:
            raise located(f"graph {av.graph.name!r}", exc) from None
    if which == "none":
        return None
    items = []
    for i, x in enumerate(av.tuple.values):
        try:
            items.append(_read_attr(x))
        except SerializationError as exc:
            raise located(f"item {i}", exc) from None
    return tuple(items)


def _read_node(np_: pb.NodeProto, stored: Dict[int, pb.ValueProto], env: Dict[int, Value],
               lookup: Callable[[int], Value]) -> Node:
    try:
        op = get_op(np_.op)
    except KeyError:
        raise SerializationError(f"unknown op {np_.op!r}; import the module that defines it before loading "
                                 "(`import cgvm` registers the built-in ops)") from None
    args = [lookup(vid) for vid in np_.inputs]
    attrs = {}
    for key in sorted(np_.attrs):
        try:
            attrs[key] = _read_attr(np_.attrs[key])
        except SerializationError as exc:
            raise located(f"attribute {key!r}", exc) from None
    name = np_.name if np_.HasField("name") else None
    source = np_.source if np_.HasField("source") else None
    try:
        # "" rather than None: None would make apply take the source from the Python stack (ours)
        built = apply(op, args, attrs, name=name, source="" if source is None else source)
    except Exception as exc:  # a rule rejecting loaded data: the data is corrupt or from another op version
        raise SerializationError(f"cannot be rebuilt: {exc}") from exc
    outs = built if isinstance(built, tuple) else (built,)
    if len(outs) != len(np_.outputs):
        raise SerializationError(f"{len(np_.outputs)} stored outputs, but op {np_.op!r} gives {len(outs)}")
    node = outs[0].node
    node.source = source
    for i, (out, vid) in enumerate(zip(outs, np_.outputs)):
        vp = stored.get(vid)
        if vp is None or vp.kind != pb.ValueProto.NODE:
            what = "is not defined" if vp is None else f"is a {_kind_name(vp.kind)}, not a node output"
            raise SerializationError(f"output value {vid} {what}")
        if vid in env:
            raise SerializationError(f"output value {vid} already has a value")
        try:
            want = _read_type(vp.type)
        except SerializationError as exc:
            raise located(f"output value {vid}", exc) from None
        if not _compatible(out.type, want):
            raise SerializationError(f"output {i} is stored as {want!r} but op {np_.op!r} gives {out.type!r} "
                                     "for these inputs")
        out.type = want  # as saved: it may know dimensions the rule leaves open
        out.name = vp.name if vp.HasField("name") else None
        env[vid] = out
    return node


def _compatible(have: TensorType, want: TensorType) -> bool:
    if have.dtype is not want.dtype or have.ndim != want.ndim:
        return False
    return all(a is None or b is None or a == b for a, b in zip(have.shape, want.shape))
