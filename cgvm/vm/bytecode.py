"""Bytecode: a Program is a tuple of instructions over integer slots, with side tables.

Like a CPython code object: instructions name slots by number; the nodes (op, attributes,
source), slot names and types, constants and parameter names live in side tables. Opcodes:

    CALL node, args -> results   run the node's kernel
    FREE slot                    drop the slot's reference (the value is dead)
    RET  slots                   the program's results
"""
from __future__ import annotations

from typing import Any, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

import numpy as np

from ..errors import where

CALL, FREE, RET = "CALL", "FREE", "RET"


class Instr(NamedTuple):
    opcode: str
    node: int                    # index into Program.nodes (CALL), else -1
    args: Tuple[int, ...]
    results: Tuple[int, ...]


def leaf_slots(input_slots: Iterable[int], param_slots: Iterable[Tuple[str, int]],
               const_slots: Iterable[Tuple[int, Any]]) -> Set[int]:
    """The slots whose values come from outside a program: its inputs, parameters and constants."""
    return set(input_slots) | {s for _, s in param_slots} | {s for s, _ in const_slots}


class Program:
    """Compiled form of a graph, independent of backend and of concrete input shapes."""

    def __init__(self, instrs: Sequence[Instr], nodes: Sequence[Any], slot_names: Sequence[str],
                 slot_types: Sequence[Any], input_slots: Sequence[int], param_slots: Sequence[Tuple[str, int]],
                 const_slots: Sequence[Tuple[int, np.ndarray]], output_slots: Sequence[int], name: str = "program"):
        self.instrs = tuple(instrs)
        self.nodes = tuple(nodes)
        self.slot_names = tuple(slot_names)
        self.slot_types = tuple(slot_types)
        self.input_slots = tuple(input_slots)
        self.param_slots = tuple(param_slots)
        self.const_slots = tuple(const_slots)
        self.output_slots = tuple(output_slots)
        self.name = name

    @property
    def n_slots(self) -> int:
        return len(self.slot_names)

    @property
    def leaf_slots(self) -> Set[int]:
        """Inputs, parameters and constants: slots no instruction computes (see leaf_slots)."""
        return leaf_slots(self.input_slots, self.param_slots, self.const_slots)

    @property
    def n_calls(self) -> int:
        return sum(1 for i in self.instrs if i.opcode == CALL)

    def where(self, pc: int) -> str:
        """The instruction at ``pc``, disassembled, with its node and source (cgvm.errors.where)."""
        ins = self.instrs[pc]
        if ins.opcode != CALL:
            return where(pc=pc, instr=format_instr(self, ins))
        node = self.nodes[ins.node]
        return where(pc=pc, instr=format_instr(self, ins), name=node.name, op=node.op.name, source=node.source)

    def __repr__(self) -> str:
        return f"<Program {self.name}: {len(self.instrs)} instrs, {self.n_slots} slots>"


def _slot(program: Program, s: int) -> str:
    return f"r{s}"


def format_instr(program: Program, ins: Instr, buffers: Optional[Sequence[Optional[int]]] = None) -> str:
    if ins.opcode == CALL:
        node = program.nodes[ins.node]
        attrs = ", ".join(f"{k}={v!r}" for k, v in node.attrs.items() if not hasattr(v, "nodes")
                          and not isinstance(v, np.ndarray))
        res = ", ".join(_slot(program, s) for s in ins.results)
        args = ", ".join(_slot(program, s) for s in ins.args)
        text = f"CALL {node.op.name:<14} {res} <- ({args})"
        if attrs:
            text += f" {{{attrs}}}"
        if buffers is not None:
            bufs = [buffers[s] for s in ins.results]
            if any(b is not None for b in bufs):
                text += "  buf " + ",".join("-" if b is None else f"#{b}" for b in bufs)
        return text
    if ins.opcode == FREE:
        return "FREE " + ", ".join(_slot(program, s) for s in ins.args)
    return "RET  " + ", ".join(_slot(program, s) for s in ins.args)


def dis(program: Program, plan: Any = None) -> str:
    """Disassembly: slot table, then one line per instruction (with planned buffers if given)."""
    lines: List[str] = [f"program {program.name}: {program.n_slots} slots, {len(program.instrs)} instructions"]
    for s in program.input_slots:
        lines.append(f"  in    r{s}: {program.slot_types[s]!r} {program.slot_names[s]}")
    for name, s in program.param_slots:
        lines.append(f"  param r{s}: {program.slot_types[s]!r} {name}")
    for s, arr in program.const_slots:
        shown = repr(arr.item()) if arr.size == 1 else f"<{arr.dtype}{list(arr.shape)}>"
        lines.append(f"  const r{s}: {shown}")
    buffers = getattr(plan, "storage", None)
    for pc, ins in enumerate(program.instrs):
        lines.append(f"  {pc:4d}  {format_instr(program, ins, buffers)}")
    return "\n".join(lines)
