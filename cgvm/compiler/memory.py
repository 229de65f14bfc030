"""Memory planning (NNVM's PlanMemory): liveness by reference counts, in-place, reuse of freed buffers.

Planning runs per concrete input-shape signature. It simulates the program: each value an op
writes into a buffer gets a block of a storage; a block whose last reader has run is freed and
handed to the next value that fits (bytes, so ``dtype.itemsize`` counts). An op's declared
in-place pairs let an output take over an input that dies there. View ops (reshape,
transpose, ...) alias their input's block and extend its life. Values that leave the program
(outputs, and anything they alias) are never planned, so a buffer handed to the user is never
reused underneath them.

Two allocators simulate the same program and the smaller plan wins (as NNVM searches its
match range): NNVM's, where a freed storage is reused whole by a value of similar size (at
most ``match_range`` times smaller), and an arena that splits a freed storage among smaller
values, merges neighbouring free blocks again and grows a storage whose end is free (as heap
simulators do), so the 49 MiB of a ResNet stem can later hold four 12 MiB activations at once.
"""
from __future__ import annotations

import bisect
from typing import Dict, List, Optional, Sequence, Tuple

from ..errors import ShapeError
from ..ir.types import TensorType
from ..vm.bytecode import CALL, Program


class MemoryPlan:
    """storage[slot] is a storage id or None (allocated by the kernel), offsets[slot] the byte offset of
    the slot's block in it; storage_bytes[sid] is the storage's size."""

    def __init__(self, storage: List[Optional[int]], storage_bytes: List[int], inplace: Dict[int, int],
                 unplanned_bytes: int, dynamic_slots: int, aliases: set, offsets: Optional[List[int]] = None):
        self.storage = storage
        self.offsets = offsets if offsets is not None else [0] * len(storage)
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
    """The smaller of the whole-storage (NNVM) plan and the arena plan; ties keep NNVM's."""
    whole = _simulate(program, types, inplace, _WholeStorages(match_range))
    arena = _simulate(program, types, inplace, _Arena())
    return arena if arena.planned_bytes < whole.planned_bytes else whole


#: arena blocks start at multiples of this many bytes (cache lines; every dtype's alignment)
ALIGN = 64


def _round_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class _WholeStorages:
    """NNVM's free list: a freed storage is reused whole by a request at most ``match_range`` times smaller,
    else the largest smaller free storage grows, else a new storage opens."""

    def __init__(self, match_range: int):
        self.match_range = match_range
        self.bytes: List[int] = []
        self.free: List[Tuple[int, int]] = []     # sorted (bytes, sid)

    def allocate(self, nbytes: int) -> Tuple[int, int]:
        i = bisect.bisect_left(self.free, (nbytes, -1))
        if i < len(self.free) and self.free[i][0] <= nbytes * self.match_range:
            return self.free.pop(i)[1], 0
        if i > 0:  # grow the largest smaller block rather than open a new one (never shrink a larger one)
            _, sid = self.free.pop(i - 1)
            self.bytes[sid] = nbytes
            return sid, 0
        self.bytes.append(nbytes)
        return len(self.bytes) - 1, 0

    def release(self, sid: int, offset: int, nbytes: int) -> None:
        bisect.insort(self.free, (self.bytes[sid], sid))

    def storage_bytes(self) -> List[int]:
        return list(self.bytes)


class _Arena:
    """Storages carved into blocks: best fit with splitting, neighbours merged on release, a storage
    whose end is free grown in place, a new storage only when nothing else can serve."""

    def __init__(self):
        self.capacity: List[int] = []             # rounded end of each storage
        self.used: List[int] = []                 # exact end of the furthest block placed in it
        self.free: List[Tuple[int, int, int]] = []    # sorted (size, sid, offset)
        self.starts: List[Dict[int, int]] = []    # per storage: free block offset -> size
        self.ends: List[Dict[int, int]] = []      # per storage: free block end -> offset

    def _add(self, sid: int, offset: int, size: int) -> None:
        bisect.insort(self.free, (size, sid, offset))
        self.starts[sid][offset] = size
        self.ends[sid][offset + size] = offset

    def _remove(self, sid: int, offset: int, size: int) -> None:
        del self.free[bisect.bisect_left(self.free, (size, sid, offset))]
        del self.starts[sid][offset]
        del self.ends[sid][offset + size]

    def allocate(self, nbytes: int) -> Tuple[int, int]:
        size = _round_up(nbytes)
        i = bisect.bisect_left(self.free, (size, -1, -1))
        if i < len(self.free):
            have, sid, offset = self.free[i]
            self._remove(sid, offset, have)
            if have > size:
                self._add(sid, offset + size, have - size)
        else:
            tails = [(cap - self.ends[sid][cap], sid) for sid, cap in enumerate(self.capacity) if cap in self.ends[sid]]
            if tails:
                have, sid = max(tails)
                offset = self.capacity[sid] - have
                self._remove(sid, offset, have)
                self.capacity[sid] = offset + size
            else:
                sid, offset = len(self.capacity), 0
                self.capacity.append(size)
                self.used.append(0)
                self.starts.append({})
                self.ends.append({})
        self.used[sid] = max(self.used[sid], offset + nbytes)
        return sid, offset

    def release(self, sid: int, offset: int, nbytes: int) -> None:
        size = _round_up(nbytes)
        after = self.starts[sid].get(offset + size)
        if after is not None:
            self._remove(sid, offset + size, after)
            size += after
        before = self.ends[sid].get(offset)
        if before is not None:
            self._remove(sid, before, offset - before)
            size += offset - before
            offset = before
        self._add(sid, offset, size)

    def storage_bytes(self) -> List[int]:
        return list(self.used)


def _simulate(program: Program, types: Sequence[TensorType], inplace: bool, allocator) -> MemoryPlan:
    """Run the program's liveness through ``allocator`` (``allocate(nbytes) -> (sid, offset)``, ``release``)."""
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
    offsets: List[int] = [0] * n
    block: List[Optional[int]] = [None] * n      # slot -> its block (index into the lists below)
    blocks: List[Tuple[int, int, int]] = []      # (sid, offset, nbytes)
    block_uses: List[int] = []
    released: List[bool] = []
    inplace_map: Dict[int, int] = {}
    unplanned = 0
    dynamic = 0
    aliases: set = set()

    def release(b: int) -> None:
        released[b] = True
        allocator.release(*blocks[b])

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
                b = block[ins.args[0]]
                if b is not None:
                    block[r] = b
                    storage[r], offsets[r] = blocks[b][0], blocks[b][1]
                    block_uses[b] += uses[r]
                    aliases.add(r)
                continue
            if len(ins.results) > 1 or not op.writes_out or not t.is_concrete or t.nbytes == 0:
                dynamic += 1
                continue
            nbytes = t.nbytes
            b = None
            if inplace:
                for i, o in op.inplace:
                    if o != k or i >= len(ins.args):
                        continue
                    a = ins.args[i]
                    cand = block[a]
                    if (cand is not None and a not in aliases and cand not in claimed and block_uses[cand] == 1
                            and ins.args.count(a) == 1 and types[a].nbytes == nbytes
                            and types[a].dtype is t.dtype):
                        b = cand
                        inplace_map[r] = a
                        break
            if b is None:
                sid, offset = allocator.allocate(nbytes)
                b = len(blocks)
                blocks.append((sid, offset, nbytes))
                block_uses.append(0)
                released.append(False)
            claimed.add(b)
            block[r] = b
            storage[r], offsets[r] = blocks[b][0], blocks[b][1]
            block_uses[b] += uses[r]
        for a in ins.args:
            b = block[a]
            if b is not None:
                block_uses[b] -= 1
                if block_uses[b] == 0:
                    release(b)
        for r in ins.results:
            b = block[r]
            if b is not None and uses[r] == 0 and block_uses[b] == 0 and not released[b]:
                release(b)
    return MemoryPlan(storage, allocator.storage_bytes(), inplace_map, unplanned, dynamic, aliases, offsets)
