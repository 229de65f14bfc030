"""Peak memory of a compiled program, by simulating its live bytes instruction by instruction.

``memory_report(function_or_graph, shapes)`` follows what the VM does with one input signature:
the weights, inputs and constants exist before the call; the planned buffers are allocated
once per signature and stay; every other value (outputs, multi-output kernels, values of
unknown size) is allocated by its kernel and freed at its FREE instruction, views sharing
their base's allocation. It reports, in bytes:

* ``peak``: weights + constants + inputs + planned buffers + the most dynamic bytes alive at once;
* ``activation_peak``: the intermediates alone (planned buffers + dynamic intermediates, no
  weights, inputs or outputs): what planning and recomputation act on;
* ``planned`` / ``unplanned``: the planned buffers vs every intermediate in its own buffer kept
  to the end (Caffe's footprint); ``liveness_peak``: every intermediate in its own buffer freed
  after its last use (no planning, an ideal allocator);
* ``two_largest_live``: the largest sum of two activations (inputs and intermediates) alive at
  the same instruction: the floor for inference, where every value is read once;
* with recomputation: ``activation_peak_without_recompute`` and the ratio ``recompute_saving``.

* ``scratch``: the largest kernel scratch (cgvm.ops.kernels.scratch) of one instruction. With planning,
  scratch that fits in memory no value holds at its instruction adds nothing; the rest counts as
  dynamic while its instruction runs. Without planning, and for temporaries a kernel does not
  declare, kernel scratch is not counted.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

from ..errors import CgvmError, ShapeError
from ..ir.graph import Graph
from ..ir.types import TensorType
from ..vm.bytecode import CALL, FREE, Program
from .codegen import generate
from .liveness import liveness as liveness_of
from .memory import MemoryPlan
from .passes import prepare_signature, run_passes
from .recompute import Recomputation

Shapes = Union[None, Mapping[str, Sequence[int]], Sequence[Sequence[int]]]


def memory_report(target: Any, shapes: Shapes = None, *, recompute: Any = None, plan: bool = True,
                  inplace: bool = True, train: bool = False) -> Dict[str, Any]:
    """Simulated memory of ``target`` (a ``cgvm.Function`` or a ``Graph``) for concrete input shapes.

    ``shapes`` gives the inputs' shapes (by input name, or a list in input order) where the
    graph leaves dimensions unknown. For a Graph: the pass pipeline runs first; ``train=True``
    differentiates its scalar output with respect to its float parameters (outputs: the loss and
    the gradients); ``recompute`` applies recomputation ("sqrt" or values to drop). A Function
    is reported as compiled (its own recomputation, parameters as the workspace holds them).
    """
    if isinstance(target, Graph):
        graph = training_graph(target) if train else target
        request = None if recompute is None else Recomputation(recompute)
        final = run_passes(graph, recompute=request)
        rplan = None if request is None else request.plan
        program = generate(final)
        params = {p.name: p.type for p in final.params}
    elif hasattr(target, "program") and hasattr(target, "graph"):
        if train or recompute is not None:
            raise CgvmError("memory_report: train= and recompute= apply to graphs; a Function is reported as "
                            "compiled (pass recompute= to cgvm.compile)")
        final, program, rplan = target.graph, target.program, getattr(target, "recompute_plan", None)
        params = {p.name: _param_type(target.workspace, p) for p in final.params}
    else:
        raise TypeError(f"memory_report needs a cgvm.Function or a Graph, got {type(target).__name__}")
    report = _report(program, final, shapes, params, plan, inplace)
    if rplan is not None:
        before = _report(generate(rplan.original), rplan.original, shapes, params, plan, inplace)
        report["activation_peak_without_recompute"] = before["activation_peak"]
        report["peak_without_recompute"] = before["peak"]
        report["recompute_saving"] = (report["activation_peak"] / before["activation_peak"]
                                      if before["activation_peak"] else 1.0)
        report["recompute_checkpoints"] = len(rplan.checkpoints)
        report["recompute_dropped"] = len(rplan.dropped)
        report["recomputed_nodes"] = rplan.duplicated_nodes
    return report


def training_graph(graph: Graph) -> Graph:
    """The graph's scalar float output (the loss) and its gradients for every float parameter."""
    from ..autodiff import grad_map  # autodiff builds graphs; only this helper needs it

    loss = next((v for v in graph.outputs if v.dtype.is_float and all(d == 1 for d in v.shape)), None)
    if loss is None:
        raise CgvmError(f"graph {graph.name!r} has no scalar float output to train (a loss); its outputs are "
                        + ", ".join(repr(v.type) for v in graph.outputs))
    params = [p for p in graph.params if p.dtype.is_float]
    grads = grad_map({loss: None}, params)
    outs = [loss] + [grads[id(p)] for p in params if id(p) in grads]
    return Graph(graph.inputs, outs, name=f"{graph.name}_train")


def _param_type(workspace: Any, p: Any) -> TensorType:
    array = workspace._data.get(p.name) if hasattr(workspace, "_data") else None
    return p.type if array is None else TensorType(array.shape, p.dtype)


def _report(program: Program, graph: Graph, shapes: Shapes, params: Mapping[str, TensorType], plan: bool,
            inplace: bool) -> Dict[str, Any]:
    known: Dict[int, TensorType] = {}
    for i, (v, s) in enumerate(zip(graph.inputs, program.input_slots)):
        shape = _input_shape(shapes, i, v.name, v.shape)
        if shape is None or any(d is None for d in shape):
            label = v.name or f"input{i}"
            raise ShapeError(f"input {label!r} has unknown dimensions {v.type!r}; give its shape (--shape "
                             f"{label}=D0,D1,... on the command line, shapes={{{label!r}: (...)}} in Python)")
        known[s] = TensorType(tuple(shape), v.dtype)
    for name, s in program.param_slots:
        known[s] = params[name]
    sig = prepare_signature(program, known, plan=plan, inplace=inplace)   # what the VM runs for this signature
    return simulate(sig.program, sig.types, sig.plan)


def _input_shape(shapes: Shapes, i: int, name: Optional[str], default: Sequence[Any]) -> Optional[Sequence[Any]]:
    if shapes is None:
        return default
    if isinstance(shapes, Mapping):
        return shapes.get(name, default) if name is not None else default
    return shapes[i] if i < len(shapes) else default


def simulate(program: Program, types: Sequence[TensorType], plan: Optional[MemoryPlan]) -> Dict[str, Any]:
    """Live bytes over the program's instructions (see the module docstring for the keys)."""
    def nbytes(s: int) -> int:
        t = types[s]
        return t.nbytes if t.is_concrete else 0

    weights = sum(nbytes(s) for _, s in program.param_slots)
    constants = sum(nbytes(s) for s, _ in program.const_slots)
    inputs = sum(nbytes(s) for s in program.input_slots)
    outputs = set(program.output_slots)
    external = program.leaf_slots
    pool = plan.planned_bytes if plan is not None else 0

    live = liveness_of(program)          # live.root(slot): the slot owning its memory (views share it)
    members: Dict[int, int] = {}         # owning slot -> how many of its slots are alive
    dynamic_live = dynamic_peak = intermediate_dynamic = intermediate_peak = 0
    unplanned = liveness = liveness_peak = 0
    logical: Dict[int, int] = {s: nbytes(s) for s in program.input_slots}   # activations alive, for the floor
    two_largest = _top_two(logical.values())

    scratch_left = plan.scratch_left if plan is not None else {}
    for pc, ins in enumerate(program.instrs):
        if ins.opcode == CALL:
            node = program.nodes[ins.node]
            for r in ins.results:
                if node.op.view and ins.args:
                    base = live.root(r)
                    if base in members:
                        members[base] += 1
                    continue
                size = nbytes(r)
                members[r] = 1
                logical[r] = size
                if r not in outputs:
                    unplanned += size
                    liveness += size
                if plan is None or plan.storage[r] is None:
                    dynamic_live += size
                    if r not in outputs:
                        intermediate_dynamic += size
            two_largest = max(two_largest, _top_two(logical.values()))
            dynamic_peak = max(dynamic_peak, dynamic_live + scratch_left.get(pc, 0))
            intermediate_peak = max(intermediate_peak, intermediate_dynamic)
            liveness_peak = max(liveness_peak, liveness)
        elif ins.opcode == FREE:
            for s in ins.args:
                base = live.root(s)
                if base in external or base not in members:
                    continue
                members[base] -= 1
                if members[base] == 0 and base not in outputs:
                    size = nbytes(base)
                    logical.pop(base, None)
                    liveness -= size
                    if plan is None or plan.storage[base] is None:
                        dynamic_live -= size
                        intermediate_dynamic -= size
    outputs_bytes = sum(nbytes(s) for s in outputs if live.root(s) == s and s not in external)
    return {
        "peak": weights + constants + inputs + pool + dynamic_peak,
        "activation_peak": pool + intermediate_peak,
        "weights": weights,
        "constants": constants,
        "inputs": inputs,
        "outputs": outputs_bytes,
        "planned": pool,
        "unplanned": unplanned,
        "liveness_peak": liveness_peak,
        "dynamic_peak": intermediate_peak,
        "two_largest_live": two_largest,
        "buffers": len(plan.storage_bytes) if plan is not None else 0,
        "inplace": len(plan.inplace) if plan is not None else 0,
        "dynamic_values": plan.dynamic_slots if plan is not None else 0,
        "instructions": program.n_calls,
        "scratch": max([b for _, _, b in plan.scratch.values()] + list(scratch_left.values()), default=0)
        if plan is not None else 0,
        "scratch_placed": len(plan.scratch) if plan is not None else 0,
        "scratch_unplaced": len(scratch_left),
    }


def _top_two(sizes: Any) -> int:
    first = second = 0
    for s in sizes:
        if s > first:
            first, second = s, first
        elif s > second:
            second = s
    return first + second


def format_report(report: Mapping[str, Any]) -> List[str]:
    """Lines for ``cgvm info --memory``."""
    mb = _mb
    lines = [f"memory: peak {mb(report['peak'])} = weights {mb(report['weights'])} + inputs {mb(report['inputs'])}"
             f" + activations {mb(report['activation_peak'])} + outputs and the rest",
             f"  planned {mb(report['planned'])} in {report['buffers']} buffers ({report['inplace']} in-place, "
             f"{report['dynamic_values']} dynamic values); unplanned {mb(report['unplanned'])} (every "
             f"intermediate kept), {mb(report['liveness_peak'])} (each freed after its last use)",
             f"  activations {report['activation_peak'] / max(report['unplanned'], 1):.2f}x the unplanned total; "
             f"two largest live activations {mb(report['two_largest_live'])}"]
    if report.get("scratch"):
        lines.append(f"  kernel scratch: largest {mb(report['scratch'])}; {report['scratch_placed']} kernels run in "
                     f"planned memory no value holds, {report['scratch_unplaced']} allocate their own")
    if "recompute_saving" in report:
        lines.append(f"  recomputation: activations {mb(report['activation_peak'])} vs "
                     f"{mb(report['activation_peak_without_recompute'])} without "
                     f"({report['recompute_saving']:.2f}x), {report['recompute_checkpoints']} checkpoints, "
                     f"{report['recompute_dropped']} activations dropped, {report['recomputed_nodes']} nodes "
                     "recomputed")
    return lines


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB" if n >= 2**10 else f"{n} B"
