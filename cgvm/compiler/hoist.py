"""Loop-invariant code motion: work in a scan body that reads only non-sequences runs once, outside.

A hoisted value is computed by the outer graph and enters the body as a new non-sequence.
"""
from __future__ import annotations

from typing import Dict, List

from ..ir.builder import clone_node, rebuild
from ..ir.graph import CONST, Graph, Value, input_value
from .rewrite import rewrite


def _hoist_scan(node, inputs):
    a = node.attrs
    body: Graph = a["body"]
    S, C = a["n_seqs"], a["n_carry"]
    n_body = len(body.inputs)
    outer_nonseq = inputs[S + C:S + C + (n_body - S - C)]
    tail = inputs[S + C + len(outer_nonseq):]  # n_steps when dynamic
    outer: Dict[int, Value] = {id(v): o for v, o in zip(body.inputs[S + C:], outer_nonseq)}
    invariant: List = []
    for n in body.nodes:
        if n.op.stateful or getattr(n.op, "needs_runtime", False):
            continue
        if all(v.kind == CONST or id(v) in outer for v in n.inputs):
            outs = clone_node(n, [v if v.kind == CONST else outer[id(v)] for v in n.inputs])
            for old, new in zip(n.outputs, outs):
                outer[id(old)] = new
            invariant.append(n)
    if not invariant:
        return None
    hoisted_ids = {id(o) for n in invariant for o in n.outputs}
    needed: List[Value] = []
    seen = set()
    for n in body.nodes:
        if n in invariant:
            continue
        for v in n.inputs:
            if id(v) in hoisted_ids and id(v) not in seen:
                seen.add(id(v))
                needed.append(v)
    for v in body.outputs:
        if id(v) in hoisted_ids and id(v) not in seen:
            seen.add(id(v))
            needed.append(v)
    if not needed:
        return None
    new_inputs = [input_value(v.type, f"hoisted{i}") for i, v in enumerate(needed)]
    new_outs = rebuild(list(body.outputs), {id(v): n for v, n in zip(needed, new_inputs)})
    new_body = Graph(list(body.inputs) + new_inputs, new_outs, name=body.name)
    attrs = dict(a)
    attrs["body"] = new_body
    return clone_node(node, list(inputs[:S + C + len(outer_nonseq)]) + [outer[id(v)] for v in needed] + list(tail),
                      attrs)


def hoist_loop_invariants(graph: Graph) -> Graph:
    def rule(node, inputs):
        if node.op.name != "scan":
            return None
        return _hoist_scan(node, inputs)

    return rewrite(graph, rule)
