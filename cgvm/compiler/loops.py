"""Loop optimizations on scan nodes.

- hoist_loop_invariants: work in a body that reads only non-sequences runs once, outside;
  the value enters the body as a new non-sequence. A hoisted transpose that a GEMM in the body
  reads enters as a contiguous copy: the copy is made once, and every step's GEMM runs on a
  plain matrix (the backward step of an RNN, ``g @ U^T``, took 20 us instead of 8-12) -- unless
  the GEMM multiplies it by one vector (one sentence's ``dz_t @ U^T``), which costs the same either way.
- prune_loop_outputs: per-step outputs nobody reads are dropped from the body (so the work
  behind them goes too), and carries whose stacked history nobody reads are not stacked. The
  last row of a carry's stack (``all_pos[-1]``, an HMC sampler's final position) is read from the
  final carry, where the loop surely runs all its steps and at least one: the history is then
  often read by nobody (Theano's scan_save_mem).
"""
from __future__ import annotations

from typing import Dict, List

from ..ir.builder import clone_node, rebuild
from ..ir.graph import CONST, Graph, Value, input_value
from ..ops.shape import contiguous
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
    gemm_read = {id(v) for n in body.nodes if n.op.runs_gemm and n not in invariant
                 for k, v in enumerate(n.inputs) if not _times_a_vector(n, k)}
    # a transpose is the strided view a hoisted GEMM operand usually is (autodiff's x.T): copied
    # contiguous once outside the loop rather than strided on every step
    entering = [contiguous(outer[id(v)]) if id(v) in gemm_read and v.node is not None
                and v.node.op.name == "transpose" else outer[id(v)] for v in needed]
    return clone_node(node, list(inputs[:S + C + len(outer_nonseq)]) + entering + list(tail), attrs)


def _times_a_vector(n, k: int) -> bool:
    """Whether operand k of GEMM node n multiplies a single row or column: BLAS then streams a
    strided matrix as fast as a contiguous one (200x200: 6.4 us either way, the copy 16 us)."""
    if n.op.name != "matmul" or len(n.inputs) != 2:   # the one product whose operands' roles are plain
        return False
    other = n.inputs[1 - k]
    if other.ndim == 1:
        return True
    return (other.shape[-2] if k == 1 else other.shape[-1]) == 1 and other.ndim == 2


def hoist_loop_invariants(graph: Graph) -> Graph:
    def rule(node, inputs):
        if node.op.name != "scan":   # the loop this pass is about
            return None
        return _hoist_scan(node, inputs)

    return rewrite(graph, rule)


def _computed_in_body(v: Value) -> bool:
    """``v`` is made by a node of the body, not (a view of) a body input the step hands back as is."""
    while v.node is not None and v.node.op.view:
        v = v.node.inputs[0]
    return v.node is not None


def _last_row_of_stack(node, inputs):
    """``squeeze(stack[-1:], 0)`` of a carry's stack -> the scan's final carry."""
    if node.op.name != "squeeze" or tuple(node.attrs["axis"] or ()) != (0,):
        return None
    sl = inputs[0].node
    if sl is None or sl.op.name != "slice" or tuple(sl.attrs["axes"] or ()) != (0,):
        return None
    if (tuple(sl.attrs["starts"] or ()) != (-1,) or tuple(sl.attrs["stops"] or (None,)) != (None,)
            or tuple(sl.attrs["steps"] or (None,)) not in ((None,), (1,))):
        return None
    scan = sl.inputs[0].node
    if scan is None or scan.op.name != "scan":
        return None
    a = scan.attrs
    steps = a["n_steps"]
    if (steps is None or steps < 1 or a["dyn_steps"] or a["has_until"] or a["truncate"] >= 0
            or (a["seq_order"] and a["go_backwards"])):
        return None
    C = a["n_carry"]
    stacked = list(range(C)) if a["stacked"] is None else list(a["stacked"])
    j = next((j for j, v in enumerate(scan.outputs[C:C + len(stacked)]) if v is sl.inputs[0]), None)
    if j is None:
        return None
    k = stacked[j]
    final = scan.outputs[k]
    if not _computed_in_body(a["body"].outputs[k]) or final.type != node.outputs[0].type:
        return None
    return [final]


def prune_loop_outputs(graph: Graph) -> Graph:
    graph = rewrite(graph, _last_row_of_stack)
    used = {id(v) for n in graph.nodes for v in n.inputs} | {id(v) for v in graph.outputs}

    def rule(node, inputs):
        if node.op.name != "scan":   # the loop this pass is about
            return None
        a = node.attrs
        body: Graph = a["body"]
        C = a["n_carry"]
        stacked = list(range(C)) if a["stacked"] is None else list(a["stacked"])
        n_ys = len(body.outputs) - C - (1 if a["has_until"] else 0)
        outs = node.outputs
        stack_outs = outs[C:C + len(stacked)]
        ys_outs = outs[C + len(stacked):]
        keep_stacked = [k for k, v in zip(stacked, stack_outs) if id(v) in used]
        keep_ys = [j for j, v in enumerate(ys_outs) if id(v) in used]
        if len(keep_stacked) == len(stacked) and len(keep_ys) == n_ys:
            return None
        attrs = dict(a)
        attrs["stacked"] = tuple(keep_stacked)
        if len(keep_ys) != n_ys:
            body_outs = list(body.outputs[:C]) + [body.outputs[C + j] for j in keep_ys]
            if a["has_until"]:
                body_outs.append(body.outputs[-1])
            attrs["body"] = Graph(body.inputs, body_outs, name=body.name)
        new = clone_node(node, inputs, attrs)
        mapping = list(new[:C])
        it_stack = iter(new[C:C + len(keep_stacked)])
        it_ys = iter(new[C + len(keep_stacked):])
        # outputs that are dropped are unused: map them to any value of the right kind (never read)
        for k, v in zip(stacked, stack_outs):
            mapping.append(next(it_stack) if k in keep_stacked else v)
        for j, v in enumerate(ys_outs):
            mapping.append(next(it_ys) if j in keep_ys else v)
        return mapping

    return rewrite(graph, rule)
