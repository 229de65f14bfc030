"""Common-subexpression elimination: nodes with the same op, inputs and attributes are computed once."""
from __future__ import annotations

from typing import Any, Dict

from ..ir.attrs import attr_key
from ..ir.graph import CONST, Graph, Value
from .rewrite import rewrite

#: constants up to this many elements are compared by content
SMALL_CONST = 64


def _value_key(v: Value) -> Any:
    if v.kind == CONST and v.data.size <= SMALL_CONST:
        return ("c", v.dtype.name, v.data.shape, v.data.tobytes())
    return id(v)


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    seen: Dict[Any, Any] = {}
    consts: Dict[Any, Value] = {}

    def canon(v: Value) -> Value:
        if v.kind == CONST and v.data.size <= SMALL_CONST:
            return consts.setdefault(_value_key(v), v)
        return v

    def rule(node, inputs):
        if node.op.stateful:
            return None
        inputs[:] = [canon(v) for v in inputs]
        key = (node.op.name, tuple(_value_key(v) for v in inputs),
               tuple((k, attr_key(a)) for k, a in node.attrs.items()))
        hit = seen.get(key)
        if hit is not None:
            return hit
        seen[key] = node.outputs
        return None

    return rewrite(graph, rule)

