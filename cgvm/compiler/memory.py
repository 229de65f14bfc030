"""Memory planning (NNVM's PlanMemory): liveness by reference counts, in-place, reuse of freed buffers.

Planning runs per concrete input-shape signature. It simulates the program: each value an op
writes into a buffer gets a block of a storage; a block whose last reader has run is freed and
handed to the next value that fits (bytes, so ``dtype.itemsize`` counts). An op's declared
in-place pairs let an output take over an input that dies there. View ops (reshape,
transpose, ...) alias their input's block and extend its life. Values that leave the program
(outputs, and anything they alias) are never planned, so a buffer handed to the user is never
reused underneath them.

Kernel scratch (cgvm.ops.kernels.scratch), which lives during one instruction, is fitted after the
values are placed, into memory no value holds at that instruction: the first of the kernel's
alternatives (fastest first: Winograd, then im2col) that fits; scratch that fits nowhere is left
to its kernel to allocate. Placed among the values instead, a scratch block raised the
whole plan wherever it met the most activations alive (ResNet-18 training: +21 MiB, for every
instruction, where the kernel's own allocation costs that only while it runs).

The simulation yields blocks with lifetimes; two allocators place them and the smaller plan
wins (as NNVM searches its match range): NNVM's free list, where a freed storage is reused whole
by a block of similar size (at most ``match_range`` times smaller), and one arena where blocks,
largest first, take the best-fitting gap between the blocks alive at the same time (TFLite's
greedy-by-size offsets). The arena lets the 49 MiB of a ResNet stem later hold four 12 MiB
activations, and the activations a training step's backward pass has freed hold one large weight
gradient.
"""
from __future__ import annotations

import bisect
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..errors import ShapeError
from ..ir.types import TensorType
from ..ops.kernels.scratch import ALIGN   # arena blocks start on cache lines, as kernel temporaries do
from ..vm.bytecode import CALL, Program
from .liveness import liveness


class MemoryPlan:
    """storage[slot] is a storage id or None (allocated by the kernel), offsets[slot] the byte offset of
    the slot's block in it; storage_bytes[sid] is the storage's size."""

    def __init__(self, storage: List[Optional[int]], storage_bytes: List[int], inplace: Dict[int, int],
                 unplanned_bytes: int, dynamic_slots: int, aliases: set, offsets: Optional[List[int]] = None,
                 scratch: Optional[Dict[int, Tuple[int, int, int]]] = None,
                 scratch_left: Optional[Dict[int, int]] = None):
        self.storage = storage
        self.offsets = offsets if offsets is not None else [0] * len(storage)
        self.aliases = aliases                  # slots holding a view into another slot's storage
        self.storage_bytes = storage_bytes
        self.inplace = inplace                  # result slot -> the input slot it overwrote
        self.unplanned_bytes = unplanned_bytes  # every intermediate in its own buffer
        self.dynamic_slots = dynamic_slots      # intermediates left to the kernels (unknown shape etc.)
        self.scratch = scratch or {}            # pc -> (storage id, offset, bytes) of its kernel's scratch
        self.scratch_left = scratch_left or {}  # pc -> bytes of scratch that fit nowhere (the kernel allocates)

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
    """The smaller of the whole-storage (NNVM) plan and the arena plan; ties keep NNVM's. Then kernel
    scratch goes into the memory each instruction leaves free."""
    life = _lifetimes(program, types, inplace)
    best = _whole_storages(life.blocks, match_range)
    if sum(best[1]) > _live_bytes_bound(life.blocks):     # the arena can only help above the bound
        arena = _arena(life.blocks)
        if sum(arena[1]) < sum(best[1]):
            best = arena
    where, storage_bytes = best
    storage: List[Optional[int]] = [None] * program.n_slots
    offsets = [0] * program.n_slots
    for s, b in enumerate(life.block_of):
        if b is not None:
            storage[s], offsets[s] = where[b]
    scratch, left = _fit_scratch(life.blocks, where, storage_bytes, life.scratch)
    return MemoryPlan(storage, storage_bytes, life.inplace, life.unplanned, life.dynamic, life.aliases, offsets,
                      scratch, left)


def _fit_scratch(blocks: Sequence["_Block"], where: List[Tuple[int, int]], storage_bytes: List[int],
                 requests: Sequence[Tuple[int, int, Tuple[int, ...]]]
                 ) -> Tuple[Dict[int, Tuple[int, int, int]], Dict[int, int]]:
    """Place each scratch request (pc, time, bytes of each alternative) in the tightest gap of a
    storage at its time, the first alternative that fits: ``({pc: (storage id, offset, bytes)},
    {pc: bytes of the first alternative, where none fits})``."""
    placed: Dict[int, Tuple[int, int, int]] = {}
    left: Dict[int, int] = {}
    alive = {time: [k for k, b in enumerate(blocks) if b.start <= time <= b.end] for _, time, _ in requests}
    for pc, time, options in requests:
        gaps = []     # (bytes, storage id, offset) of the memory free at this instruction
        for sid in range(len(storage_bytes)):
            spans = sorted((where[k][1], where[k][1] + blocks[k].nbytes) for k in alive[time] if where[k][0] == sid)
            top = 0
            for low, high in spans + [(storage_bytes[sid], storage_bytes[sid])]:
                start = -(-top // ALIGN) * ALIGN
                if low > start:
                    gaps.append((low - start, sid, start))
                top = max(top, high)
        for nbytes in options:
            fits = [g for g in gaps if g[0] >= nbytes]
            if fits:
                _, sid, start = min(fits)
                placed[pc] = (sid, start, nbytes)
                break
        else:
            left[pc] = options[0]
    return placed, left



#: a block never released lives to the end of the program
FOREVER = 1 << 62

Placement = Tuple[List[Tuple[int, int]], List[int]]     # (storage id, offset) per block; storage sizes


class _Block(NamedTuple):
    nbytes: int
    start: int      # index of the CALL that writes it first
    end: int        # index of the CALL after which it is free (its last reader)


class _Lifetimes(NamedTuple):
    blocks: List[_Block]
    block_of: List[Optional[int]]   # slot -> its block
    inplace: Dict[int, int]
    unplanned: int
    dynamic: int
    aliases: set
    scratch: List[Tuple[int, int, Tuple[int, ...]]]   # (pc, time, bytes per alternative) of kernel scratch


def _live_bytes_bound(blocks: Sequence[_Block]) -> int:
    """The most bytes of blocks alive at one instruction: no placement needs less."""
    delta: Dict[int, int] = {}
    for b in blocks:
        delta[b.start] = delta.get(b.start, 0) + b.nbytes
        if b.end < FOREVER:
            delta[b.end + 1] = delta.get(b.end + 1, 0) - b.nbytes
    live = peak = 0
    for t in sorted(delta):
        live += delta[t]
        peak = max(peak, live)
    return peak


def _whole_storages(blocks: Sequence[_Block], match_range: int) -> Placement:
    """NNVM's free list over the blocks in time order: a freed storage is reused whole by a block at
    most ``match_range`` times smaller, else the largest smaller free storage grows, else a new one."""
    sizes: List[int] = []
    free: List[Tuple[int, int]] = []            # sorted (bytes, sid)
    where: List[Tuple[int, int]] = [(0, 0)] * len(blocks)
    # at one CALL, the blocks it writes are taken before the blocks it reads last are freed
    events = sorted([(b.start, 0, k) for k, b in enumerate(blocks)] + [(b.end, 1, k) for k, b in enumerate(blocks)
                                                                      if b.end < FOREVER])
    for _, is_free, k in events:
        if is_free:
            sid = where[k][0]
            bisect.insort(free, (sizes[sid], sid))
            continue
        nbytes = blocks[k].nbytes
        i = bisect.bisect_left(free, (nbytes, -1))
        if i < len(free) and free[i][0] <= nbytes * match_range:
            sid = free.pop(i)[1]
        elif i > 0:  # grow the largest smaller block rather than open a new one (never shrink a larger one)
            _, sid = free.pop(i - 1)
            sizes[sid] = nbytes
        else:
            sid = len(sizes)
            sizes.append(nbytes)
        where[k] = (sid, 0)
    return where, sizes


def _arena(blocks: Sequence[_Block]) -> Placement:
    """Greedy by size: largest blocks first, each at the best-fitting gap among the blocks placed so far
    that are alive at the same time (or above them all)."""
    n = len(blocks)
    order = sorted(range(n), key=lambda k: (-blocks[k].nbytes, blocks[k].start))
    lows, highs = np.zeros(n, np.int64), np.zeros(n, np.int64)       # placed blocks, in placement order
    starts, ends = np.zeros(n, np.int64), np.zeros(n, np.int64)
    where: List[Tuple[int, int]] = [(0, 0)] * n
    used = 0
    for count, k in enumerate(order):
        b = blocks[k]
        size = -(-b.nbytes // ALIGN) * ALIGN
        alive = np.nonzero((starts[:count] <= b.end) & (ends[:count] >= b.start))[0]
        best_gap, offset, top = None, None, 0
        for i in alive[np.argsort(lows[alive], kind="stable")].tolist():
            gap = int(lows[i]) - top
            if gap >= size and (best_gap is None or gap < best_gap):
                best_gap, offset = gap, top
            top = max(top, int(highs[i]))
        if offset is None:
            offset = top
        lows[count], highs[count], starts[count], ends[count] = offset, offset + size, b.start, b.end
        where[k] = (0, offset)
        used = max(used, offset + b.nbytes)
    return where, ([used] if blocks else [])


def _lifetimes(program: Program, types: Sequence[TensorType], inplace: bool) -> _Lifetimes:
    """Simulate the program's reference counts: which values share a block (in place, views) and when
    each block is written first and read last."""
    n = program.n_slots
    live = liveness(program)   # alias groups (views share their input's memory), outside memory, read counts
    pcs = [pc for pc, _ in live.calls]
    calls = [ins for _, ins in live.calls]
    uses = live.uses

    block: List[Optional[int]] = [None] * n
    sizes: List[int] = []
    starts: List[int] = []
    ends: List[int] = []
    block_uses: List[int] = []
    inplace_map: Dict[int, int] = {}
    unplanned = 0
    dynamic = 0
    aliases: set = set()
    scratch: List[Tuple[int, int, Tuple[int, ...]]] = []

    for time, ins in enumerate(calls):
        op = program.nodes[ins.node].op
        arg_types = [types[a] for a in ins.args]
        if all(t.is_concrete for t in arg_types):
            need = op.scratch_bytes(arg_types, program.nodes[ins.node].attrs)
            if need:
                scratch.append((pcs[time], time, need))
        claimed = set()
        for k, r in enumerate(ins.results):
            t = types[r]
            if live.is_external(r):
                continue
            if t.is_concrete:
                unplanned += t.nbytes
            if op.view:
                b = block[ins.args[0]]
                if b is not None:
                    block[r] = b
                    block_uses[b] += uses[r]
                    aliases.add(r)
                continue
            if (len(ins.results) > 1 and not op.multi_out) or not op.writes_out or not t.is_concrete or t.nbytes == 0:
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
                b = len(sizes)
                sizes.append(nbytes)
                starts.append(time)
                ends.append(FOREVER)
                block_uses.append(0)
            claimed.add(b)
            block[r] = b
            block_uses[b] += uses[r]
        for a in ins.args:
            b = block[a]
            if b is not None:
                block_uses[b] -= 1
                if block_uses[b] == 0:
                    ends[b] = time
        for r in ins.results:
            b = block[r]
            if b is not None and uses[r] == 0 and block_uses[b] == 0:
                ends[b] = min(ends[b], time)
    blocks = [_Block(sz, st, en) for sz, st, en in zip(sizes, starts, ends)]
    return _Lifetimes(blocks, block, inplace_map, unplanned, dynamic, aliases, scratch)
