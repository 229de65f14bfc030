"""Codegen: a graph in topological order becomes a Program over integer slots, with FREEs after last uses."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ..ir.graph import CONST, PARAM, Graph, Value
from ..vm.bytecode import CALL, FREE, RET, Instr, Program, leaf_slots
from .liveness import last_reads


def with_frees(calls: Sequence[Instr], keep: Set[int]) -> List[Instr]:
    """CALLs with a FREE after each value's last use (and right after results nobody reads)."""
    last_use = last_reads(calls)
    out: List[Instr] = []
    for i, ins in enumerate(calls):
        out.append(ins)
        dead = sorted({a for a in ins.args if last_use[a] == i and a not in keep})
        dead += [r for r in ins.results if r not in last_use and r not in keep]
        if dead:
            out.append(Instr(FREE, -1, tuple(dead), ()))
    return out


def assemble(calls: Sequence[Instr], output_slots: Sequence[int], like: Program,
             const_slots: Optional[Sequence[Tuple[int, Any]]] = None) -> Program:
    """``like`` with these CALLs and outputs (and constants, if given): a FREE after each value's
    last use (never of what comes from or leaves the program), then RET."""
    return _program(calls, tuple(output_slots), like.nodes, like.slot_names, like.slot_types, like.input_slots,
                    like.param_slots, like.const_slots if const_slots is None else const_slots, like.name)


def _program(calls: Sequence[Instr], output_slots: Tuple[int, ...], nodes: Sequence[Any], names: Sequence[str],
             types: Sequence[Any], input_slots: Sequence[int], param_slots: Sequence[Tuple[str, int]],
             const_slots: Sequence[Tuple[int, Any]], name: str) -> Program:
    keep = set(output_slots) | leaf_slots(input_slots, param_slots, const_slots)
    instrs = with_frees(calls, keep)
    instrs.append(Instr(RET, -1, output_slots, ()))
    return Program(instrs, nodes, names, types, input_slots, param_slots, const_slots, output_slots, name=name)


def generate(graph: Graph) -> Program:
    slot_of: Dict[int, int] = {}
    names: List[str] = []
    types: List = []

    def slot(v: Value, label: str) -> int:
        s = slot_of.get(id(v))
        if s is None:
            s = slot_of[id(v)] = len(names)
            names.append(label)
            types.append(v.type)
        return s

    input_slots = [slot(v, v.name or f"input{i}") for i, v in enumerate(graph.inputs)]
    param_slots = [(p.name, slot(p, p.name)) for p in graph.params]
    by_name = {name: s for name, s in param_slots}
    for v in graph.leaves():  # other Values reading an already-seen parameter share its slot
        if v.kind == PARAM and id(v) not in slot_of:
            slot_of[id(v)] = by_name[v.name]
    const_slots = []
    for v in graph.leaves():
        if v.kind == CONST and id(v) not in slot_of:
            const_slots.append((slot(v, "const"), v.data))

    calls = [Instr(CALL, i, tuple(slot_of[id(v)] for v in node.inputs),
                   tuple(slot(o, node.name or node.op.name) for o in node.outputs))
             for i, node in enumerate(graph.nodes)]
    output_slots = tuple(slot_of[id(v)] for v in graph.outputs)
    return _program(calls, output_slots, graph.nodes, names, types, input_slots, param_slots, const_slots,
                    graph.name)
