"""Liveness and aliasing of a program's slots, worked out once and read by every consumer.

What shares memory (a view's result is its input's memory; every output of a view op may alias
input 0), what leaves the program or comes from outside it (outputs, inputs, parameters,
constants, and everything aliasing them), how often and until when each slot is read
(``last_reads``, which codegen also uses to place FREEs), which instructions the outputs need at
all (``live_calls``: dead-code elimination, after specialization has aliased adapters away), and which
parameters an instruction's result may still alias (views, and ops that hand back arrays of
their own choosing: scan carries, cond branches). The memory planner (cgvm.compiler.memory),
the memory report (cgvm.compiler.memory_report) and the per-signature plan of parameter updates
and recycled output buffers (``update_plan``) all read one ``Liveness``; the VM only executes
what they decided.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Set

from ..ir.types import TensorType
from ..vm.bytecode import CALL, Instr, Program


def last_reads(calls: Sequence[Instr]) -> Dict[int, int]:
    """Slot -> index (in ``calls``) of the last CALL reading it: where each value dies."""
    last: Dict[int, int] = {}
    for i, ins in enumerate(calls):
        for a in ins.args:
            last[a] = i
    return last


def live_calls(calls: Sequence[Instr], outputs: Iterable[int]) -> List[Instr]:
    """The CALLs whose results ``outputs`` need, in their order: dead-code elimination on a program
    (a Graph is built from its outputs, so a graph holds only what they need already)."""
    live = set(outputs)
    kept: List[Instr] = []
    for ins in reversed(calls):
        if any(r in live for r in ins.results):
            kept.append(ins)
            live.update(ins.args)
    kept.reverse()
    return kept


class UpdatePlan(NamedTuple):
    """Per signature, what the caller's recycle bin does (cgvm.compiled_function.Function's parameter updates).

    ``recycled``: output slot -> recycle-bin index, for recyclable outputs whose kernel writes a
    buffer whole (the previous call's array is handed back as that buffer). ``in_place``: parameter
    slot -> the bin index of the update that may overwrite the parameter's own array (checked on each
    call: only when the workspace alone holds that array)."""
    recycled: Dict[int, int]
    in_place: Dict[int, int]


class Liveness:
    """Alias roots, outside memory, read counts and last reads of ``program``'s slots."""

    def __init__(self, program: Program):
        self.program = program
        n = program.n_slots
        self.calls = [(pc, ins) for pc, ins in enumerate(program.instrs) if ins.opcode == CALL]
        self.uses = [0] * n                  # CALL reads of each slot
        self.last_read = [-1] * n            # pc of the last CALL reading each slot
        for s, i in last_reads([ins for _, ins in self.calls]).items():
            self.last_read[s] = self.calls[i][0]
        self._parent = list(range(n))
        for pc, ins in self.calls:
            for a in ins.args:
                self.uses[a] += 1
            if program.nodes[ins.node].op.view:
                for r in ins.results:
                    self._parent[self.root(r)] = self.root(ins.args[0])
        self.external_roots = {self.root(s) for s in set(program.output_slots) | program.leaf_slots}

    def root(self, s: int) -> int:
        """The slot owning ``s``'s memory (``s`` itself unless it is a view)."""
        parent = self._parent
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    def is_external(self, s: int) -> bool:
        """Whether ``s``'s memory leaves the program or comes from outside it (never planned)."""
        return self.root(s) in self.external_roots

    # -- parameters and the caller's recycle bin -----------------------------------------
    def _parameter_aliases(self):
        params = {s for _, s in self.program.param_slots}
        aliased: Dict[int, Set[int]] = {s: {s} for s in params}   # slot -> parameters it may alias
        last_read: Dict[int, int] = {}
        for pc, ins in self.calls:
            read = set().union(*(aliased.get(a, ()) for a in ins.args))
            for p in read:
                last_read[p] = pc
            if read:
                node = self.program.nodes[ins.node]
                for r, positions in zip(ins.results, node.op.aliased_inputs(node)):
                    shared = set().union(*(aliased.get(ins.args[k], ()) for k in positions if k < len(ins.args)))
                    if shared:
                        aliased[r] = shared
        return params, aliased, last_read

    def updates_in_place(self, updates: Sequence[int]) -> Dict[int, int]:
        """Parameter slot -> the output slot (among the positions ``updates``) whose kernel may
        overwrite that parameter.

        An update ``w' = f(w, ...)`` may be written into ``w``'s own array when ``f``'s op declares
        that input in-place, its instruction is the last to read ``w`` or anything that may alias
        it and reads no such alias besides, and no output may alias ``w``.
        """
        prog = self.program
        params, aliased, last_read = self._parameter_aliases()
        outputs = list(prog.output_slots)
        exposed = set().union(*(aliased.get(s, ()) for s in outputs))
        producer = {ins.results[0]: pc for pc, ins in self.calls if len(ins.results) == 1}
        found: Dict[int, int] = {}
        for position in updates:
            out = outputs[position]
            pc = producer.get(out)
            if pc is None or outputs.count(out) != 1:
                continue
            ins = prog.instrs[pc]
            for i, o in prog.nodes[ins.node].op.inplace:
                s = ins.args[i] if i < len(ins.args) else None
                if (o == 0 and s in params and s not in exposed and s not in found and last_read.get(s) == pc
                        and sum(s in aliased.get(a, ()) for a in ins.args) == 1):
                    found[s] = out
                    break
        return found

    def recycled_outputs(self, recyclable: Sequence[int], types: Sequence[TensorType],
                         updates: Sequence[int]) -> Dict[int, int]:
        """Output slot -> recycle-bin index, for recyclable outputs a kernel writes into whole.
        ``updates``: the recyclable positions that are parameter updates."""
        prog = self.program
        produced = {ins.results[0]: prog.nodes[ins.node].op for _, ins in self.calls if len(ins.results) == 1}
        out: Dict[int, int] = {}
        slots = list(prog.output_slots)
        for index, position in enumerate(recyclable):
            s = slots[position]
            op = produced.get(s)
            # a plain output repeated among the outputs takes the buffer at its first position (the caller
            # copies the others from it); a parameter update only when it is the slot's one use
            alone = slots.count(s) == 1 or position not in updates
            if (op is not None and op.writes_out and not op.view and types[s].is_concrete
                    and alone and s not in out):
                out[s] = index
        return out

    def update_plan(self, recyclable: Sequence[int], types: Sequence[TensorType],
                    updates: Optional[Sequence[int]] = None) -> UpdatePlan:
        """``recyclable``: output positions the caller hands buffers back for; ``updates``: those of
        them that are parameter updates (all, when None), which may overwrite their parameter."""
        updates = tuple(recyclable) if updates is None else tuple(updates)
        recycled = self.recycled_outputs(recyclable, types, updates)
        in_place = {s: recycled[out] for s, out in self.updates_in_place(updates).items() if out in recycled}
        return UpdatePlan(recycled, in_place)


def liveness(program: Program) -> Liveness:
    """The analysis of ``program`` (cached on it: a program is immutable once generated)."""
    cached = getattr(program, "_liveness", None)
    if cached is None or cached.program is not program:
        cached = Liveness(program)
        try:
            program._liveness = cached
        except AttributeError:   # a Program without a __dict__ slot: compute each time
            pass
    return cached


__all__ = ["Liveness", "UpdatePlan", "last_reads", "live_calls", "liveness"]
