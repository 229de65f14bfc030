"""Whether one graph is a faithful copy of another (``graph_difference``): what a save/load round trip
must preserve, checked by the serialization tests and the suite-wide round trip in tests/conftest.py.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

from .attrs import attr_key
from .graph import CONST, Graph, Node, Value


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
        diff = self.values("input", a.inputs, b.inputs)
        if diff:
            return diff
        for k, (n, m) in enumerate(zip(a.nodes, b.nodes)):
            diff = self.node(n, m)
            if diff:
                return f"node #{k} ({n.where()}): {diff}"
        diff = self.values("output", a.outputs, b.outputs)
        if diff:
            return diff
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
        diff = self.values("input", n.inputs, m.inputs)
        if diff:
            return diff
        for i, (x, y) in enumerate(zip(n.outputs, m.outputs)):
            diff = f"{x.label()} was already defined" if id(x) in self.pairs else self.value(x, y)
            if diff:
                return f"output {i}: {diff}"
        return None

    def values(self, what: str, xs: Sequence[Value], ys: Sequence[Value]) -> Optional[str]:
        """The first of ``xs`` whose counterpart in ``ys`` differs, as "<what> <position>: ..."."""
        for i, (x, y) in enumerate(zip(xs, ys)):
            diff = self.value(x, y)
            if diff:
                return f"{what} {i}: {diff}"
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
