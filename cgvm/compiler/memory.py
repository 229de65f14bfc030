"""Memory planning (NNVM's PlanMemory): liveness by reference counts, in-place, reuse of freed buffers.

Planning runs per concrete input-shape signature. It simulates the program: each value an op
writes into a buffer gets a storage id; a storage whose last reader has run goes back to a
free list and is handed to the next value of fitting size (bytes, so ``dtype.itemsize``
counts). An op's declared in-place pairs let an output take over an input that dies there.
View ops (reshape, transpose, ...) alias their input's storage and extend its life. Values
that leave the program (outputs, and anything they alias) are never planned, so a buffer
handed to the user is never reused underneath them.
"""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Sequence

from ..errors import ShapeError
from ..ir.types import TensorType
from ..vm.bytecode import CALL, Program


class MemoryPlan:
    """storage[slot] is a storage id or None (allocated by the kernel); storage_bytes[sid] its size."""

    def __init__(self, storage: List[Optional[int]], storage_bytes: List[int], inplace: Dict[int, int],
                 unplanned_bytes: int, dynamic_slots: int, aliases: set):
        self.storage = storage
        self.aliases = aliases                  # slots holding a view into another slot's storage
        self.storage_bytes = storage_bytes
        self.inplace = inplace                  # result slot -> the input slot it overwrote
        self.unplanned_bytes = unplanned_bytes  # every intermediate in its own buffer
        self.dynamic_slots = dynamic_slots      # intermediates left to the kernels (unknown shape etc.)

    @property
    def planned_bytes(self) -> int:
        return sum(self.storage_bytes)

    def summary(self) -> str:
        return (f"{len(self.storage_bytes)} buffers, {self.planned_bytes} bytes planned "
                f"(vs {self.unplanned_bytes} unplanned), {len(self.inplace)} in-place, "
                f"{self.dynamic_slots} dynamic")


def infer_slot_types(program: Program, known: Dict[int, TensorType]) -> List[TensorType]:
    """Types of every slot for concrete input/param types; shape errors name the node's source."""
    types = list(program.slot_types)
    for s, t in known.items():
        types[s] = t
    for ins in program.instrs:
        if ins.opcode != CALL:
            continue
        node = program.nodes[ins.node]
        try:
            outs = node.op.infer([types[a] for a in ins.args], node.attrs)
        except (ShapeError, TypeError, ValueError, IndexError) as exc:
            raise ShapeError(f"{node.where()}: {exc} (input types "
                             + ", ".join(repr(types[a]) for a in ins.args) + ")") from None
        for r, t in zip(ins.results, outs):
            types[r] = t
    return types


def plan_memory(program: Program, types: Sequence[TensorType], *, inplace: bool = True,
                match_range: int = 16) -> MemoryPlan:
    n = program.n_slots
    calls = [ins for ins in program.instrs if ins.opcode == CALL]
    uses = [0] * n
    for ins in calls:
        for a in ins.args:
            uses[a] += 1

    # alias groups: a view's result shares its input's memory
    parent = list(range(n))

    def find(s: int) -> int:
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    for ins in calls:
        if program.nodes[ins.node].op.view:
            for r in ins.results:  # every output of a view op (split) may alias input 0
                parent[find(r)] = find(ins.args[0])
    external = {find(s) for s in program.output_slots}
    external.update(find(s) for s in program.input_slots)
    external.update(find(s) for _, s in program.param_slots)
    external.update(find(s) for s, _ in program.const_slots)

    storage: List[Optional[int]] = [None] * n
    st_bytes: List[int] = []
    st_uses: List[int] = []
    free: List[tuple] = []  # sorted (bytes, sid)
    inplace_map: Dict[int, int] = {}
    unplanned = 0
    dynamic = 0
    aliases: set = set()

    def release(sid: int) -> None:
        bisect.insort(free, (st_bytes[sid], sid))

    def request(nbytes: int) -> int:
        i = bisect.bisect_left(free, (nbytes, -1))
        if i < len(free) and free[i][0] <= nbytes * match_range:
            return free.pop(i)[1]
        if i > 0:  # grow the largest smaller block rather than open a new one (never shrink a larger one)
            _, sid = free.pop(i - 1)
            st_bytes[sid] = nbytes
            return sid
        st_bytes.append(nbytes)
        st_uses.append(0)
        return len(st_bytes) - 1

    for ins in calls:
        op = program.nodes[ins.node].op
        claimed = set()
        for k, r in enumerate(ins.results):
            t = types[r]
            if find(r) in external:
                continue
            if t.is_concrete:
                unplanned += t.nbytes
            if op.view:
                sid = storage[ins.args[0]]
                if sid is not None:
                    storage[r] = sid
                    st_uses[sid] += uses[r]
                    aliases.add(r)
                continue
            if len(ins.results) > 1 or not op.writes_out or not t.is_concrete or t.nbytes == 0:
                dynamic += 1
                continue
            nbytes = t.nbytes
            sid = None
            if inplace:
                for i, o in op.inplace:
                    if o != k or i >= len(ins.args):
                        continue
                    a = ins.args[i]
                    cand = storage[a]
                    if (cand is not None and a not in aliases and cand not in claimed and st_uses[cand] == 1
                            and ins.args.count(a) == 1 and types[a].nbytes == nbytes
                            and types[a].dtype is t.dtype):
                        sid = cand
                        inplace_map[r] = a
                        break
            if sid is None:
                sid = request(nbytes)
            claimed.add(sid)
            storage[r] = sid
            st_uses[sid] += uses[r]
        for a in ins.args:
            sid = storage[a]
            if sid is not None:
                st_uses[sid] -= 1
                if st_uses[sid] == 0:
                    release(sid)
        for r in ins.results:
            sid = storage[r]
            if sid is not None and uses[r] == 0 and st_uses[sid] == 0 and (st_bytes[sid], sid) not in free:
                release(sid)
    return MemoryPlan(storage, st_bytes, inplace_map, unplanned, dynamic, aliases)
