"""One walk that rewrites a graph node by node; passes supply the per-node rule."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

from ..ir.builder import clone_node
from ..ir.graph import Graph, Node, Value

# rule(node, new_inputs) -> replacement outputs, or None to keep the node (rebuilt if inputs changed)
Rule = Callable[[Node, List[Value]], Optional[Sequence[Value]]]


def rewrite(graph: Graph, rule: Rule, *, lookup: bool = False) -> Graph:
    """A new graph where each node went through ``rule``; unchanged nodes are shared, not copied.

    With ``lookup`` the rule is called as ``rule(node, new_inputs, rebuilt)``: ``rebuilt(v)`` is
    what an old value has become so far (itself if unchanged), for rules that build over values
    other than their node's inputs (the inputs of the nodes a fusion swallows).
    """
    memo: Dict[int, Value] = {}

    def rebuilt(v: Value) -> Value:
        return memo.get(id(v), v)

    nodes: List[Node] = []
    emitted: set = set()
    changed = False
    for node in graph.nodes:
        new_inputs = [rebuilt(v) for v in node.inputs]
        repl = rule(node, new_inputs, rebuilt) if lookup else rule(node, new_inputs)
        if repl is not None:
            changed = True
            for old, new in zip(node.outputs, repl):
                memo[id(old)] = memo.get(id(new), new)  # a replacement may itself have been rebuilt
            continue
        if any(a is not b for a, b in zip(new_inputs, node.inputs)):
            changed = True
            outs = clone_node(node, new_inputs)
            for old, new in zip(node.outputs, outs):
                memo[id(old)] = new
            node = outs[0].node
        if id(node) not in emitted:
            emitted.add(id(node))
            nodes.append(node)
    if not changed:
        return graph
    outputs = [memo.get(id(v), v) for v in graph.outputs]
    # replacements may have created nodes outside the list (a rule's helper nodes) or dropped some
    return Graph(graph.inputs, outputs, name=graph.name)
