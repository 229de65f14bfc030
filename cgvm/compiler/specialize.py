"""Per-signature specialization: once input shapes are known, drop what they make unnecessary.

Graphs are compiled for unknown dimensions, so gradient rules keep shape adapters such as
``sum_to_like(g, x)`` ("sum g down to x's shape") that turn out to be identities for the
shapes that actually arrive. Worse, the adapter's shape-only input can keep a costly node
alive (a loop body's backward step recomputing a forward matmul only for its shape). Here,
with the concrete types of every slot, identity adapters become aliases of their input, and
instructions whose results nobody reads any more are dropped.
"""
from __future__ import annotations

from typing import Dict, List, Sequence

from ..ir.types import TensorType
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
    if not alias and not freed_like:
        return program
    output_slots = tuple(alias.get(s, s) for s in program.output_slots)
    return assemble(live_calls(calls, output_slots), output_slots, program)
