"""The IR: single-assignment Values, Nodes that apply an op, and Graphs in topological order.

A Value is produced by at most one Node; leaves are graph inputs, named parameters (bound to
Workspace entries by name) or constants. Nodes link to their inputs, so a graph can be
collected from its outputs (as Theano does); ``Graph`` freezes such a collection in
topological order. Nothing here mutates a built node or graph.
"""
from __future__ import annotations

import itertools
import os
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..errors import MissingInputError, VerifyError, where
from .types import DType, TensorType

_ids = itertools.count()

INPUT, PARAM, CONST, NODE = "input", "param", "const", "node"


class Value:
    """A single-assignment tensor in a graph."""

    __slots__ = ("type", "name", "kind", "node", "index", "data", "id", "__weakref__")

    def __init__(self, type: TensorType, *, name: Optional[str] = None, kind: str = NODE,
                 node: Optional["Node"] = None, index: int = 0, data: Optional[np.ndarray] = None):
        self.type = type
        self.name = name
        self.kind = kind
        self.node = node
        self.index = index
        self.data = data
        self.id = next(_ids)

    @property
    def shape(self):
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.type.shape)

    @property
    def source(self) -> Optional[str]:
        return self.node.source if self.node is not None else None

    def label(self) -> str:
        if self.kind == PARAM:
            return f"%{self.name}"
        return f"%{self.name or ''}{'.' if self.name else ''}{self.id}" if self.name else f"%{self.id}"

    def __repr__(self) -> str:
        return f"<Value {self.label()}: {self.type!r} {self.kind}>"


def input_value(type: TensorType, name: Optional[str] = None) -> Value:
    return Value(type, name=name, kind=INPUT)


def param_value(name: str, type: TensorType) -> Value:
    """A parameter: read from (and written back to) the Workspace entry ``name``."""
    return Value(type, name=name, kind=PARAM)


def const_value(data: Any, dtype: Any = None) -> Value:
    arr = np.array(data, dtype=None if dtype is None else DType(dtype).np)
    if arr.dtype == np.float64 and dtype is None and not isinstance(data, np.ndarray):
        arr = arr.astype(np.float32)
    arr.flags.writeable = False
    return Value(TensorType(arr.shape, arr.dtype), kind=CONST, data=arr)


class Node:
    """One application of an op. ``source`` says where the user wrote it."""

    __slots__ = ("op", "inputs", "outputs", "attrs", "name", "source", "id")

    def __init__(self, op: Any, inputs: Sequence[Value], attrs: Mapping[str, Any],
                 name: Optional[str] = None, source: Optional[str] = None):
        self.op = op
        self.inputs: Tuple[Value, ...] = tuple(inputs)
        self.outputs: Tuple[Value, ...] = ()
        self.attrs: Mapping[str, Any] = attrs
        self.name = name
        self.source = source
        self.id = next(_ids)

    def where(self) -> str:
        """``node 'name' op NAME (at SOURCE)`` (cgvm.errors.where)."""
        return where(name=self.name, op=self.op.name, source=self.source)

    def __repr__(self) -> str:
        return f"<Node {self.op.name} {self.name or ''} #{self.id}>"


# ----------------------------------------------------------------------------- source capture

_CGVM_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_source_override: ContextVar[Optional[str]] = ContextVar("cgvm_source", default=None)


@contextmanager
def source_scope(text: Optional[str]) -> Iterator[None]:
    """Nodes built inside carry ``text`` as their source (a frontend's file:line and layer)."""
    token = _source_override.set(text)
    try:
        yield
    finally:
        _source_override.reset(token)


def current_source() -> Optional[str]:
    """The frontend's scope if one is set, else the first Python frame outside cgvm."""
    text = _source_override.get()
    if text is not None:
        return text
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_CGVM_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


# ----------------------------------------------------------------------------- graphs


def toposort(outputs: Iterable[Value], stop: Iterable[Value] = ()) -> List[Node]:
    """Nodes that ``outputs`` depend on, inputs before users; values in ``stop`` are leaves."""
    stop_ids = {id(v) for v in stop}
    order: List[Node] = []
    seen: set = set()
    for out in outputs:
        if out.node is None or id(out) in stop_ids or id(out.node) in seen:
            continue
        stack = [(out.node, 0)]
        seen.add(id(out.node))
        while stack:
            node, i = stack.pop()
            if i < len(node.inputs):
                stack.append((node, i + 1))
                v = node.inputs[i]
                p = v.node
                if p is not None and id(v) not in stop_ids and id(p) not in seen:
                    seen.add(id(p))
                    stack.append((p, 0))
            else:
                order.append(node)
    return order


class Graph:
    """Inputs, parameters, nodes (topological) and outputs. Immutable by convention."""

    def __init__(self, inputs: Sequence[Value], outputs: Sequence[Value],
                 nodes: Optional[Sequence[Node]] = None, name: str = "graph"):
        self.inputs: Tuple[Value, ...] = tuple(inputs)
        self.outputs: Tuple[Value, ...] = tuple(outputs)
        self.name = name
        self.nodes: Tuple[Node, ...] = tuple(toposort(self.outputs, self.inputs) if nodes is None else nodes)
        self.params: Tuple[Value, ...] = self._collect_params()
        if nodes is None:
            self._check_closed()

    def _collect_params(self) -> Tuple[Value, ...]:
        """One Value per parameter name (several Values may read the same Workspace entry).

        A parameter listed among the inputs is fed by the caller, not read from the Workspace.
        """
        fed = {id(v) for v in self.inputs}
        seen: Dict[str, Value] = {}
        for v in self.leaves():
            if v.kind == PARAM and v.name not in seen and id(v) not in fed:
                seen[v.name] = v
        return tuple(seen.values())

    def leaves(self) -> Iterator[Value]:
        """Values read by the graph but produced by none of its nodes (and outputs that are leaves)."""
        produced = {id(o) for n in self.nodes for o in n.outputs}
        seen: set = set()
        for n in self.nodes:
            for v in n.inputs:
                if id(v) not in produced and id(v) not in seen:
                    seen.add(id(v))
                    yield v
        for v in self.outputs:
            if id(v) not in produced and id(v) not in seen:
                seen.add(id(v))
                yield v

    def _check_closed(self) -> None:
        inputs = {id(v) for v in self.inputs}
        for v in self.leaves():
            if v.kind in (PARAM, CONST) or id(v) in inputs:
                continue
            used_by = next((n for n in self.nodes if any(i is v for i in n.inputs)), None)
            where = f" used by {used_by.where()}" if used_by else ""
            made = f", computed at {v.source}" if v.source else ""
            raise MissingInputError(
                f"graph {self.name!r}: value {v.label()} ({v.type!r}{made}){where} is not among the "
                f"inputs; pass it as an input or give it a value")

    def values(self) -> Iterator[Value]:
        yield from self.inputs
        yield from self.params
        for n in self.nodes:
            yield from n.outputs

    def consumers(self) -> Dict[int, List[Node]]:
        users: Dict[int, List[Node]] = {}
        for n in self.nodes:
            for v in n.inputs:
                users.setdefault(id(v), []).append(n)
        return users

    def replace(self, nodes: Sequence[Node], outputs: Optional[Sequence[Value]] = None,
                inputs: Optional[Sequence[Value]] = None) -> "Graph":
        """A new graph with other nodes (already in topological order)."""
        return Graph(self.inputs if inputs is None else inputs,
                     self.outputs if outputs is None else outputs, nodes=nodes, name=self.name)

    def __str__(self) -> str:
        from .printer import format_graph  # printer imports graph; keep the cycle local

        return format_graph(self)

    def __repr__(self) -> str:
        return f"<Graph {self.name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes, {len(self.outputs)} outputs>"


def verify(graph: Graph) -> None:
    """Check IR invariants: topological order, single assignment, types agree with the op's rule."""
    defined = {id(v) for v in graph.inputs}
    produced: set = set()
    for node in graph.nodes:
        for v in node.inputs:
            if id(v) not in defined and v.kind not in (PARAM, CONST):
                raise VerifyError(f"{node.where()}: input {v.label()} is used before it is defined")
        for i, out in enumerate(node.outputs):
            if id(out) in produced:
                raise VerifyError(f"{node.where()}: output {out.label()} is assigned twice")
            if out.node is not node or out.index != i:
                raise VerifyError(f"{node.where()}: output {out.label()} does not point back to its node")
            produced.add(id(out))
            defined.add(id(out))
        try:
            expect = node.op.infer([v.type for v in node.inputs], node.attrs)
        except Exception as exc:  # a rule that fails here means the graph was built wrongly
            raise VerifyError(f"{node.where()}: type rule fails: {exc}") from exc
        for out, t in zip(node.outputs, expect):
            if not _type_compatible(out.type, t):
                raise VerifyError(f"{node.where()}: output {out.label()} has type {out.type!r}, rule says {t!r}")
    for v in graph.outputs:
        if id(v) not in defined and v.kind not in (PARAM, CONST):
            raise VerifyError(f"graph output {v.label()} is never computed")


def _type_compatible(have: TensorType, rule: TensorType) -> bool:
    if have.dtype is not rule.dtype or len(have.shape) != len(rule.shape):
        return False
    return all(a is None or b is None or a == b for a, b in zip(have.shape, rule.shape))
