"""Codegen: a graph in topological order becomes a Program over integer slots, with FREEs after last uses."""
from __future__ import annotations

from typing import Dict, List

from ..ir.graph import CONST, PARAM, Graph, Value
from ..vm.bytecode import CALL, FREE, RET, Instr, Program


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

    last_use: Dict[int, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last_use[id(v)] = i
    keep = {id(v) for v in graph.outputs}
    keep.update(id(v) for v in graph.inputs)
    keep.update(id(v) for v in graph.leaves() if v.kind in (PARAM, CONST))

    instrs: List[Instr] = []
    for i, node in enumerate(graph.nodes):
        args = tuple(slot_of[id(v)] for v in node.inputs)
        results = tuple(slot(o, node.name or node.op.name) for o in node.outputs)
        instrs.append(Instr(CALL, i, args, results))
        dead = sorted({slot_of[id(v)] for v in node.inputs if last_use[id(v)] == i and id(v) not in keep})
        dead += [slot_of[id(o)] for o in node.outputs if id(o) not in last_use and id(o) not in keep]
        if dead:
            instrs.append(Instr(FREE, -1, tuple(dead), ()))
    output_slots = tuple(slot_of[id(v)] for v in graph.outputs)
    instrs.append(Instr(RET, -1, output_slots, ()))
    return Program(instrs, graph.nodes, names, types, input_slots, param_slots, const_slots, output_slots,
                   name=graph.name)
