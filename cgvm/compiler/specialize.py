"""Per-signature specialization: once input shapes are known, drop what they make unnecessary.

Graphs are compiled for unknown dimensions, so gradient rules keep shape adapters such as
``sum_to_like(g, x)`` ("sum g down to x's shape") that turn out to be identities for the
shapes that actually arrive. Worse, the adapter's shape-only input can keep a costly node
alive (a loop body's backward step recomputing a forward matmul only for its shape). Here,
with the concrete types of every slot, identity adapters become aliases of their input, and
instructions whose results nobody reads any more are dropped.

Values that then depend on nothing but constants and the shapes of their inputs (a gradient's
seed ``ones_like(loss)`` and the ``broadcast_like`` of it, a loop body's fills) are computed once,
here, and become constants of the signature's program: a tiny loop body ran them, and the
forward work they read only for its shape, on every step. Small constants that elementwise ops
broadcast (a mean row subtracted from every sample) are broadcast once, into arrays of the
operation's shape: NumPy's ufuncs take a fast path when every operand has the result's shape
and cost two to three times as much on tiny arrays when one has to be broadcast.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Set

import numpy as np

from ..ir.types import TensorType
from ..ops.registry import BROADCAST, ELEMWISE
from ..vm.bytecode import CALL, Instr, Program
from .codegen import assemble
from .liveness import live_calls


def specialize(program: Program, types: Sequence[TensorType], copied_outputs: Sequence[int] = ()) -> Program:
    """The program with identity adapters aliased away and dead instructions removed.

    ``copied_outputs``: positions of outputs that the caller copies at once (a loop's stacked
    per-step outputs). Such an output may become the same array as another output (BPTT's dz_t,
    returned once for each weight whose gradient sum reads it), where any other output must stay
    a fresh array of its own."""
    outputs = set(program.output_slots)
    copied_at = set(copied_outputs)
    copied = ({s for k, s in enumerate(program.output_slots) if k in copied_at}
              - {s for k, s in enumerate(program.output_slots) if k not in copied_at})
    leaves = program.leaf_slots
    alias: Dict[int, int] = {}
    returned: set = set()   # sources that an aliased output now returns
    freed_like = False      # some kept adapter no longer reads its "like" operand
    calls: List[Instr] = []
    for ins in program.instrs:
        if ins.opcode != CALL:
            continue
        args = tuple(alias.get(a, a) for a in ins.args)
        op = program.nodes[ins.node].op   # identity rules are the ops' own (@op.identity_when)
        if (op.may_be_identity and len(ins.results) == 1
                and all(types[s].is_concrete for s in args[:1] + ins.results)
                and op.is_identity([types[a] for a in args], types[ins.results[0]])):
            result, source = ins.results[0], args[0]
            # an output may become its source only when that is computed here and returned once:
            # it is then a fresh array like any output (not an input's memory, not a planned
            # buffer, not shared with another output)
            if result not in outputs or (source not in leaves and (
                    result in copied or (source not in outputs and source not in returned))):
                alias[result] = source
                if result in outputs:
                    returned.add(source)
                continue
            if len(args) == 2:   # still copied, but its "like" operand is no longer needed for a shape
                args, freed_like = (source, source), True
        calls.append(Instr(CALL, ins.node, args, ins.results))
    output_slots = tuple(alias.get(s, s) for s in program.output_slots)
    outputs = set(output_slots)
    folded = _fold_shape_constants(program, calls, types, outputs)
    widened = _broadcast_small_constants(program, calls, types, folded)
    if not alias and not freed_like and not folded and not widened:
        return program
    if folded:
        calls = [ins for ins in calls if not all(r in folded for r in ins.results)]
    kept = live_calls(calls, output_slots)
    read = outputs.union(*(ins.args for ins in kept))
    const_slots = tuple((s, widened.get(s, v)) for s, v in program.const_slots)
    const_slots += tuple((s, widened.get(s, v)) for s, v in folded.items() if s in read)
    return assemble(kept, output_slots, program, const_slots=const_slots)


def _owned_bytes(value: Any, inputs: Sequence[Any]) -> int:
    """The memory a folded value would keep alive beyond its inputs' (a view of an input: none)."""
    root = value
    while isinstance(root.base, np.ndarray):
        root = root.base
    return 0 if any(root is a or root is a.base for a in inputs) else root.nbytes


#: a folded value owning more memory than this stays an instruction (the planner reuses its buffer)
MAX_FOLDED_BYTES = 1 << 16


def _fold_shape_constants(program: Program, calls: List[Instr], types: Sequence[TensorType],
                          outputs: Set[int]) -> Dict[int, Any]:
    """Slot -> value of the instructions computable from constants and concrete shapes alone.

    A value stays computed at run time when it is an output or a view op reads it (either would
    hand out, or let out, the one constant array every call shares)."""
    consts: Dict[int, Any] = {s: a for s, a in program.const_slots}
    folded: Dict[int, Any] = {}
    at: Dict[int, int] = {}   # folded slot -> index of its instruction in calls
    for i, ins in enumerate(calls):
        op = program.nodes[ins.node].op
        if op.stateful or op.needs_runtime or not ins.results or any(r in outputs for r in ins.results):
            continue
        if not all(a in consts or (op.reads_only_shape(k) and types[a].is_concrete) for k, a in enumerate(ins.args)):
            continue
        if not all(types[r].is_concrete for r in ins.results):
            continue
        args = [consts[a] if a in consts else np.broadcast_to(np.zeros((), types[a].dtype.np), types[a].shape)
                for a in ins.args]
        try:
            result = op.bind(np, program.nodes[ins.node].attrs)(*args)
        except Exception:   # left to run time, where the error names the node's source
            continue
        results = result if len(ins.results) > 1 else (result,)
        values = [np.asarray(v, dtype=types[r].dtype.np) for r, v in zip(ins.results, results)]
        if any(v.shape != tuple(types[r].shape) or _owned_bytes(v, args) > MAX_FOLDED_BYTES
               for r, v in zip(ins.results, values)):
            continue
        for r, v in zip(ins.results, values):
            if not v.flags.c_contiguous and v.nbytes <= MAX_FOLDED_BYTES:   # ufuncs read small contiguous operands fastest
                v = np.ascontiguousarray(v)
            consts[r] = folded[r] = v
            at[r] = i
    if not folded:
        return folded
    # readers that stay instructions and would pass a constant's memory on: a view's result is its
    # input 0's memory (the others, a reshape's target shape, say, are only read)
    view_read: Set[int] = set()
    for i, ins in enumerate(calls):
        if program.nodes[ins.node].op.view and not all(r in folded for r in ins.results):
            view_read.update(ins.args[:1])
    for r in sorted(folded, key=lambda r: -at[r]):   # readers after writers: undo from the last one back
        if r in view_read:
            ins = calls[at[r]]
            for x in ins.results:
                folded.pop(x, None)
            if program.nodes[ins.node].op.view:
                view_read.update(ins.args[:1])
    return folded


def _broadcast_small_constants(program: Program, calls: List[Instr], types: Sequence[TensorType],
                               folded: Dict[int, Any]) -> Dict[int, Any]:
    """Const slot -> its value broadcast to the one result shape of the elementwise ops reading it,
    for small constants that every reader broadcasts to the same concrete shape."""
    consts: Dict[int, Any] = {s: a for s, a in program.const_slots}
    consts.update(folded)
    target: Dict[int, Any] = {}   # const slot -> the result shape its readers want, or None (leave it)
    for ins in calls:
        if all(r in folded for r in ins.results):
            continue
        op = program.nodes[ins.node].op
        elementwise = op.pattern in (ELEMWISE, BROADCAST) or op.name == "fused_elementwise"
        for k, a in enumerate(ins.args):
            if a not in consts:
                continue
            out = types[ins.results[0]] if len(ins.results) == 1 else None
            want = (tuple(out.shape) if elementwise and out is not None and out.is_concrete
                    and not op.reads_only_shape(k) else None)
            if target.get(a, want) != want:
                want = None
            target[a] = want
    widened: Dict[int, Any] = {}
    for a, shape in target.items():
        value = consts[a]
        if (shape is None or value.ndim == 0 or value.size <= 1 or tuple(value.shape) == shape
                or int(np.prod(shape)) * value.itemsize > MAX_FOLDED_BYTES):
            continue
        try:
            widened[a] = np.ascontiguousarray(np.broadcast_to(value, shape))
        except ValueError:   # does not broadcast: the kernel raises at run time, naming the node
            continue
    return widened
