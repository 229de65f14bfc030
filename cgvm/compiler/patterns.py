"""Pattern-matching helpers shared by the simplification rules (simplify, fold_conv).

A rule looks at a node and its rewritten inputs and asks who computed them. While a walk runs,
the graph's inputs are leaves even where a node computed them before the graph was cut there
(prune's ``given``), so ``made`` answers None for them.
"""
from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Dict, Optional, Sequence

from ..ir.builder import apply
from ..ir.graph import Node, Value

CUT: ContextVar[frozenset] = ContextVar("cgvm_simplify_cut", default=frozenset())


def made(v: Value) -> Optional[Node]:
    """The node computing ``v`` inside this graph (None for inputs, parameters and constants)."""
    return None if id(v) in CUT.get() else v.node


def producer(v: Value, *names: str) -> Optional[Node]:
    """The node computing ``v`` if its op is one of ``names``."""
    n = made(v)
    return n if n is not None and n.op.name in names else None


def build(op: Any, inputs: Sequence[Value], attrs: Dict[str, Any], node: Node) -> Value:
    """A node of ``op`` carrying the rewritten node's name and source."""
    return apply(op, list(inputs), attrs, name=node.name, source=node.source)
