"""Cutting closed sub-graphs (scan bodies, ifelse branches) out of the graph the user wrote.

Theano lets a step function or a branch read any outer variable. cgvm's control-flow nodes take
closed sub-graphs instead, so the frontend decides which nodes go inside, clones them over fresh
inner inputs, and passes every outer value they read (shared variables, intermediate results)
as an explicit operand. For scan, the nodes inside are exactly those that depend on a per-step
input; everything else is loop-invariant and computed once, outside the loop.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Sequence, Tuple

from ...ir.builder import clone_node
from ...ir.graph import CONST, Graph, Node, Value, input_value, toposort


def dependent_nodes(outputs: Sequence[Value], step_inputs: Iterable[Value]) -> List[Node]:
    """Nodes (topological) between ``step_inputs`` and ``outputs`` that read a step input, directly or not."""
    dep = {id(v) for v in step_inputs}
    inside = []
    for node in toposort(outputs):
        if any(id(i) in dep for i in node.inputs):
            inside.append(node)
            dep.update(id(o) for o in node.outputs)
    return inside


def extract(outputs: Sequence[Value], inner_inputs: Sequence[Value], inside: Sequence[Node],
            name: str = "body") -> Tuple[Graph, List[Value], List[Value]]:
    """A closed graph computing ``outputs`` from ``inner_inputs`` plus captured operands.

    ``inside`` are the nodes to clone into the graph. Returns (graph, captured outer values,
    their inner inputs); the graph's inputs are ``inner_inputs`` followed by the captured ones.
    Constants stay inside as constants.
    """
    produced = {id(o) for n in inside for o in n.outputs}
    own = {id(v) for v in inner_inputs}
    captured: Dict[int, Value] = {}

    def capture(v: Value) -> None:
        if id(v) not in produced and id(v) not in own and v.kind != CONST and id(v) not in captured:
            captured[id(v)] = v

    for n in inside:
        for i in n.inputs:
            capture(i)
    for o in outputs:
        capture(o)
    outer = list(captured.values())
    inner_caps = [input_value(v.type, f"c{k}") for k, v in enumerate(outer)]
    memo: Dict[int, Value] = {id(o): i for o, i in zip(outer, inner_caps)}
    for n in inside:
        new = clone_node(n, [memo.get(id(i), i) for i in n.inputs])
        for old, nv in zip(n.outputs, new):
            memo[id(old)] = nv
    body_outputs = [memo.get(id(o), o) for o in outputs]
    graph = Graph(list(inner_inputs) + inner_caps, body_outputs, name=name)
    return graph, outer, inner_caps
