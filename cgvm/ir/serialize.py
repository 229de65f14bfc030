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
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable, Dict, List, Optional, Union

import numpy as np
from google.protobuf import message as _pb_message
from google.protobuf import text_format

from ..errors import CgvmError, SerializationError
from . import cgvm_pb2 as pb
from .attrs import attr_key
from .builder import apply
from .graph import CONST, INPUT, NODE, PARAM, Graph, Node, Value, const_value, input_value, param_value
from .opschema import get_op
from .types import DType, TensorType

__all__ = ["FORMAT_VERSION", "SerializationError", "graph_to_proto", "graph_from_proto", "save_graph",
           "load_graph", "graph_difference"]

#: the GraphProto.format_version this module writes; it reads this one and older ones
FORMAT_VERSION = 1

#: file name endings saved and loaded in protobuf's text format instead of binary
TEXT_SUFFIXES = (".pbtxt", ".txt")

_KIND_TO_PROTO = {INPUT: pb.ValueProto.INPUT, PARAM: pb.ValueProto.PARAM, CONST: pb.ValueProto.CONST,
                  NODE: pb.ValueProto.NODE}
_KIND_FROM_PROTO = {v: k for k, v in _KIND_TO_PROTO.items()}
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_ARRAY_KINDS = "biufc"  # bool, signed, unsigned, float, complex: fixed-size numbers only

PathLike = Union[str, "os.PathLike[str]"]



# ============================================================================ Graph -> GraphProto
#
# Helpers raise SerializationError with a message about the thing at hand; callers that know
# the context (graph, node, attribute) catch it and prefix that, so no location text is built
# unless something is wrong.


def _located(prefix: str, exc: SerializationError) -> SerializationError:
    return SerializationError(f"{prefix}: {exc}")


def graph_to_proto(graph: Graph) -> pb.GraphProto:
    """The ``GraphProto`` of ``graph``; sub-graphs in attributes are nested GraphProtos."""
    out = pb.GraphProto()
    try:
        _write_graph(graph, out)
    except SerializationError as exc:
        raise _located(f"graph {graph.name!r}", exc) from None
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
            raise _located(f"node #{k} ({node.where()})", exc) from None
    out.inputs.extend(ids[id(v)] for v in graph.inputs)
    try:
        out.outputs.extend(leaf(v) for v in graph.outputs)
    except SerializationError as exc:
        raise _located("a graph output", exc) from None


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
            raise _located(f"attribute {key!r}", exc) from None
    if node.name is not None:
        out.name = node.name
    if node.source is not None:
        out.source = node.source


def _write_value(v: Value, vid: int, out: pb.ValueProto) -> None:
    out.id = vid
    out.kind = _KIND_TO_PROTO[v.kind]
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
            raise _located(f"constant {v.label()}", exc) from None


def _write_tensor(arr: np.ndarray, out: pb.TensorProto) -> None:
    arr = np.asarray(arr)
    if arr.dtype.kind not in _ARRAY_KINDS:
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
            raise _located(f"graph {value.name!r}", exc) from None
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
                    raise _located(f"item {i}", exc) from None
    else:
        raise SerializationError(f"a value of type {type(value).__name__} ({value!r:.60}) has no serialized "
                                 "form; attributes must be numbers, bools, strings, None, dtypes, arrays, graphs "
                                 "or tuples of these")


# ============================================================================ GraphProto -> Graph


def graph_from_proto(proto: pb.GraphProto) -> Graph:
    """Rebuild the graph of ``proto``: every node through ``apply``, so rules check it again."""
    if not isinstance(proto, pb.GraphProto):
        raise SerializationError(f"expected a cgvm GraphProto, got {type(proto).__name__}")
    try:
        return _read_graph(proto)
    except SerializationError as exc:
        raise _located(f"graph {proto.name!r}", exc) from None


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
            raise _located(f"value {vp.id}", exc) from None
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
            raise _located(f"node #{k} ({_node_text(np_)})", exc) from None
    outputs = []
    for vid in proto.outputs:
        try:
            outputs.append(lookup(vid))
        except SerializationError as exc:
            raise _located("a graph output", exc) from None
    return Graph(inputs, outputs, nodes=nodes, name=proto.name)


def _node_text(np_: pb.NodeProto) -> str:
    name = repr(np_.name) if np_.HasField("name") and np_.name else ""
    source = f"at {np_.source}" if np_.HasField("source") and np_.source else ""
    return " ".join(x for x in (np_.op, name, source) if x)


def _kind_name(kind: int) -> str:
    return _KIND_FROM_PROTO.get(kind, f"kind {kind}")


def _read_leaf(vp: pb.ValueProto, is_graph_input: bool) -> Optional[Value]:
    """The Value of an input, parameter or constant (None for a value a node computes)."""
    kind = _KIND_FROM_PROTO.get(vp.kind)
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
    if dtype.kind not in _ARRAY_KINDS:
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
            raise _located(f"graph {av.graph.name!r}", exc) from None
    if which == "none":
        return None
    items = []
    for i, x in enumerate(av.tuple.values):
        try:
            items.append(_read_attr(x))
        except SerializationError as exc:
            raise _located(f"item {i}", exc) from None
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
            raise _located(f"attribute {key!r}", exc) from None
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
            raise _located(f"output value {vid}", exc) from None
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


# ============================================================================ files


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


# ============================================================================ comparing graphs


def graph_difference(a: Graph, b: Graph) -> Optional[str]:
    """The first way in which ``b`` is not a faithful copy of ``a``, or None.

    Compares what serialization preserves: value kinds, names, types and constant data; node
    order, ops, attributes (sub-graphs recursively), names and sources; which value each node
    reads and which values are the inputs and outputs. Value identity numbers are ignored.
    """
    diff = _GraphComparison(a, b).run()
    return None if diff is None else f"graph {a.name!r}: {diff}"


class _GraphComparison:
    """Pairs the values of two graphs while walking them in step; each check returns a message or None."""

    def __init__(self, a: Graph, b: Graph):
        self.a, self.b = a, b
        self.pairs: Dict[int, Value] = {}  # id(value of a) -> its counterpart in b

    def run(self) -> Optional[str]:
        a, b = self.a, self.b
        if a.name != b.name:
            return f"named {b.name!r} in the copy"
        for what, xs, ys in (("inputs", a.inputs, b.inputs), ("nodes", a.nodes, b.nodes),
                             ("outputs", a.outputs, b.outputs), ("params", a.params, b.params)):
            if len(xs) != len(ys):
                return f"{len(xs)} {what}, the copy has {len(ys)}"
        for i, (x, y) in enumerate(zip(a.inputs, b.inputs)):
            diff = self.value(x, y)
            if diff:
                return f"input {i}: {diff}"
        for k, (n, m) in enumerate(zip(a.nodes, b.nodes)):
            diff = self.node(n, m)
            if diff:
                return f"node #{k} ({n.where()}): {diff}"
        for i, (x, y) in enumerate(zip(a.outputs, b.outputs)):
            diff = self.value(x, y)
            if diff:
                return f"output {i}: {diff}"
        for x, y in zip(a.params, b.params):
            if x.name != y.name or x.type != y.type:
                return f"parameter {x.label()}: {x.type!r}, the copy has {y.label()}: {y.type!r}"
        return None

    def node(self, n: Node, m: Node) -> Optional[str]:
        if n.name != m.name or n.source != m.source:
            return f"name {m.name!r} and source {m.source!r} in the copy"
        if n.op.name != m.op.name:
            return f"op {m.op.name!r} in the copy"
        if list(n.attrs) != list(m.attrs):
            return f"attributes {list(n.attrs)}, the copy has {list(m.attrs)}"
        for key in n.attrs:
            diff = _attr_difference(n.attrs[key], m.attrs[key])
            if diff:
                return f"attribute {key!r}: {diff}"
        if len(n.inputs) != len(m.inputs) or len(n.outputs) != len(m.outputs):
            return f"{len(m.inputs)} inputs and {len(m.outputs)} outputs in the copy"
        for i, (x, y) in enumerate(zip(n.inputs, m.inputs)):
            diff = self.value(x, y)
            if diff:
                return f"input {i}: {diff}"
        for i, (x, y) in enumerate(zip(n.outputs, m.outputs)):
            diff = f"{x.label()} was already defined" if id(x) in self.pairs else self.value(x, y)
            if diff:
                return f"output {i}: {diff}"
        return None

    def value(self, x: Value, y: Value) -> Optional[str]:
        seen = self.pairs.get(id(x))
        if seen is not None:
            return None if seen is y else f"{x.label()}, but the copy reads another value"
        if x.kind != y.kind or x.name != y.name or x.type != y.type:
            return f"{x.kind} {x.name!r} {x.type!r}, the copy has {y.kind} {y.name!r} {y.type!r}"
        if x.kind == CONST:
            diff = _attr_difference(x.data, y.data)
            if diff:
                return f"constant data: {diff}"
        self.pairs[id(x)] = y
        return None


def _attr_difference(x: Any, y: Any) -> Optional[str]:
    if isinstance(x, Graph) and isinstance(y, Graph):
        diff = _GraphComparison(x, y).run()
        return None if diff is None else f"graph {x.name!r}: {diff}"
    if type(x) is not type(y):
        return f"{type(x).__name__} {x!r:.60}, the copy has {type(y).__name__} {y!r:.60}"
    if isinstance(x, np.ndarray):  # same numbers; the byte order in memory is not part of the value
        if x.dtype.newbyteorder("=") != y.dtype.newbyteorder("=") or x.shape != y.shape or \
                _native_bytes(x) != _native_bytes(y):
            return f"{x.dtype}{list(x.shape)} array differs in the copy ({y.dtype}{list(y.shape)})"
        return None
    if isinstance(x, (tuple, list)):
        if len(x) != len(y):
            return f"{len(x)} items, the copy has {len(y)}"
        for i, (p, q) in enumerate(zip(x, y)):
            diff = _attr_difference(p, q)
            if diff:
                return f"item {i}: {diff}"
        return None
    if attr_key(x) != attr_key(y):
        return f"{x!r:.60}, the copy has {y!r:.60}"
    return None


def _native_bytes(arr: np.ndarray) -> bytes:
    return np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("=")).tobytes()
