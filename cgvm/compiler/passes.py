"""The pipeline, declared: what compiling does, in order, as two lists of the same Pass records.

* PIPELINE: the graph passes, each ``Graph -> Graph``, run once per compiled function; the last,
  recomputation, only when a compilation asks for it (``recompute=``).
* SIGNATURE_STAGES: the stages run once per input signature (the shapes a call brings), each
  ``Signature -> Signature``: slot types, specialization, memory planning, the update plan.

Each pass declares the passes it ``needs``; one runner runs both lists, and a selection of
passes also runs every pass the selected ones need (as TVM's pass manager does with
``required``), so no pass ever sees a graph its needs have not prepared. A pass with an
``option`` runs exactly when the compilation gives that option, and is handed its value.
In debug mode the verifier runs after every graph pass, and ``print_after`` shows the IR after
the named passes: in full after the first one shown, then only the lines each pass wrote.
"""
from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Sequence, TextIO, Tuple

from ..ir.graph import Graph, verify
from ..ir.types import TensorType
from ..vm.bytecode import Program
from .accumulate import fuse_accumulations
from .collectives import schedule_collectives
from .cse import eliminate_common_subexpressions
from .fold import fold_constants
from .fuse import fuse_elementwise, fuse_epilogues
from .layout import sink_transposes
from .loop_pushout import push_out_loop_work
from .loops import hoist_loop_invariants, prune_loop_outputs
from .liveness import UpdatePlan, liveness
from .memory import MemoryPlan, infer_slot_types, plan_memory
from .pool_act import pool_before_activation
from .prune import prune
from .recompute import Recomputation
from .reductions import fuse_square_sums
from .schedule import schedule_for_memory
from .simplify import simplify
from .specialize import specialize


class Pass(NamedTuple):
    """One step of a pipeline: ``run(subject) -> subject`` (a Graph, or a Signature)."""
    name: str
    run: Callable[..., Any]
    needs: tuple = ()     # passes that must run before this one (in the same list)
    doc: str = ""
    option: str = ""      # if set: runs only when the compilation gives this option, as run(subject, value)


PIPELINE: List[Pass] = [
    Pass("prune", prune, (), "keep only what the requested outputs need"),
    Pass("fold", fold_constants, ("prune",), "evaluate nodes whose inputs are all constants"),
    Pass("cse", eliminate_common_subexpressions, ("fold",), "compute identical nodes once"),
    Pass("layout", sink_transposes, ("cse",), "sink transposes through elementwise ops; cancel inverse pairs"),
    Pass("loop_outputs", prune_loop_outputs, ("prune",), "drop loop outputs and stacks nobody reads"),
    Pass("hoist", hoist_loop_invariants, ("cse",), "move loop-invariant work out of scan bodies"),
    Pass("pushout", push_out_loop_work, ("hoist", "loop_outputs"), "sequence products before scans; summing "
                                                                   "carries as one product after them"),
    Pass("simplify", simplify, ("cse",), "algebraic identities, stable log-softmax/cross-entropy forms; batch norm, "
                                         "scale and bias folded into the preceding conv"),
    Pass("sum_squares", fuse_square_sums, ("simplify",), "sum(square(x)) over every axis as one BLAS dot "
                                                         "(L2 penalties)"),
    Pass("pool_act", pool_before_activation, ("simplify",), "max_pool(relu(z)) as relu(max_pool(z)), and its "
                                                           "gradient: the activation on the pooled map"),
    Pass("accumulate", fuse_accumulations, ("simplify",), "beta * c + alpha * (a @ b) as one gemm adding "
                                                          "into c (SGD and momentum weight updates)"),
    Pass("epilogues", fuse_epilogues, ("simplify",), "matmul + bias (+ activation) as gemm_bias_act, "
                                                     "conv + activation as conv_bias_act"),
    Pass("fuse", fuse_elementwise, ("epilogues",), "chains of elementwise ops as one fused_elementwise kernel "
                                                  "running in one buffer"),
    # keep last: passes that rebuild the graph from its outputs restore the depth-first order
    Pass("schedule", schedule_for_memory, ("prune",), "order the backward pass so that values die early"),
    # after schedule when both run (pipeline order), but it does not need it: it places collectives in any order
    Pass("collectives", schedule_collectives, (), "start gradient allreduces early, wait late"),
    # after every other pass: CSE would merge its duplicates back, fusion would hide the values it drops.
    # Its split into forward and backward reads the node order of a graph of what the outputs need.
    Pass("recompute", lambda graph, request: request(graph), ("prune",),
         "drop forward activations and recompute them in the backward pass (sublinear training memory)",
         option="recompute"),
]


@dataclass
class Signature:
    """What the per-signature stages work on: the program, the types the call brings (input and
    parameter slots), and what the stages add (every slot's type, the memory plan)."""
    program: Program
    known: Dict[int, TensorType]
    types: Optional[List[TensorType]] = None
    plan: Optional[MemoryPlan] = None
    copied_outputs: Tuple[int, ...] = ()   # outputs the caller copies at once (see specialize)
    inplace: bool = True                   # let the planner update inputs in place
    recyclable: Tuple[int, ...] = ()       # output positions whose previous arrays the caller hands back
    update_positions: Optional[Tuple[int, ...]] = None   # those of them that are parameter updates (None: all)
    updates: Optional[UpdatePlan] = None   # recycled output buffers, parameters updated in place


def _slot_types(sig: Signature) -> Signature:
    return replace(sig, types=infer_slot_types(sig.program, sig.known))


def _specialize(sig: Signature) -> Signature:
    return replace(sig, program=specialize(sig.program, sig.types, copied_outputs=sig.copied_outputs))


def _plan_memory(sig: Signature) -> Signature:
    return replace(sig, plan=plan_memory(sig.program, sig.types, inplace=sig.inplace))


def _plan_updates(sig: Signature) -> Signature:
    return replace(sig, updates=liveness(sig.program).update_plan(sig.recyclable, sig.types, sig.update_positions))


SIGNATURE_STAGES: List[Pass] = [
    Pass("slot_types", _slot_types, (), "the type of every slot, from the shapes of the inputs and parameters"),
    Pass("specialize", _specialize, ("slot_types",), "shape adapters that are identities for these types "
                                                     "aliased away; instructions nobody reads dropped"),
    Pass("plan_memory", _plan_memory, ("slot_types",), "buffers and their reuse, in-place updates and kernel "
                                                       "scratch for this signature"),
    Pass("plan_updates", _plan_updates, ("slot_types",), "which outputs write into the caller's recycled "
                                                         "arrays, and which parameter updates overwrite the "
                                                         "parameter's own array"),
]


def _check_declared(pipeline: Sequence[Pass]) -> None:
    """Every need names a pass earlier in the same list that always runs (checked once, at import)."""
    seen: set = set()
    optional = {p.name for p in pipeline if p.option}
    for p in pipeline:
        late = [n for n in p.needs if n not in seen or n in optional]
        if late:
            raise AssertionError(f"pass {p.name!r} needs {late}, which is not an earlier pass of its list "
                                 "that runs without an option")
        seen.add(p.name)


_check_declared(PIPELINE)
_check_declared(SIGNATURE_STAGES)


def pass_names() -> List[str]:
    return [p.name for p in PIPELINE]


def stage_names() -> List[str]:
    return [p.name for p in SIGNATURE_STAGES]


def select(pipeline: Sequence[Pass], names: Optional[Iterable[str]],
           options: Optional[Dict[str, Any]] = None) -> List[Pass]:
    """The passes of ``pipeline`` named in ``names`` (all for None) and, as TVM's pass manager does
    with ``required``, every pass they need, transitively; in pipeline order. A pass with an
    ``option`` is in exactly when ``options`` gives that option (not None), named or not.
    ValueError for a name the pipeline lacks."""
    known = {p.name: p for p in pipeline}
    wanted = set(known if names is None else names)
    unknown = wanted - set(known)
    if unknown:
        raise ValueError(f"unknown pass {sorted(unknown)[0]!r}; passes are {list(known)}")
    given = options or {}
    wanted = {n for n in wanted if not known[n].option}
    wanted |= {p.name for p in pipeline if p.option and given.get(p.option) is not None}
    todo = list(wanted)
    while todo:
        for need in known[todo.pop()].needs:
            if need not in wanted:
                wanted.add(need)
                todo.append(need)
    return [p for p in pipeline if p.name in wanted]


def run_pipeline(subject: Any, pipeline: Sequence[Pass], names: Optional[Iterable[str]] = None,
                 after: Optional[Callable[[Pass, Any], None]] = None, options: Optional[Dict[str, Any]] = None) -> Any:
    """Run the selected passes of ``pipeline`` on ``subject`` in order; ``after(pass, result)`` follows each.
    ``options``: option name -> value, for the passes that run only when given one."""
    for p in select(pipeline, names, options):
        subject = p.run(subject, options[p.option]) if p.option else p.run(subject)
        if after is not None:
            after(p, subject)
    return subject


def print_after_names(names: Iterable[str]) -> set:
    """The graph passes to print after: known names or "all"; ValueError for any other name."""
    shown = set(names)
    if "all" in shown:
        return set(pass_names())
    unknown = shown - set(pass_names())
    if unknown:
        raise ValueError(f"unknown pass {sorted(unknown)[0]!r} to print after; passes are "
                         f"{', '.join(pass_names())} (or all)")
    return shown


class _Printer:
    """Prints the IR after the chosen passes: whole after the first, then what each pass changed."""

    def __init__(self, show: set, out: TextIO):
        self.show, self.out, self.last = show, out, None

    def __call__(self, p: Pass, graph: Graph) -> None:
        if p.name not in self.show:
            return
        text = str(graph)
        if self.last is None:
            print(f"// after {p.name}", file=self.out)
            print(text, file=self.out)
        elif text == self.last:
            print(f"// after {p.name}: no change", file=self.out)
        else:   # the lines the pass wrote, and how many it took away
            diff = [d for d in difflib.ndiff(self.last.splitlines(), text.splitlines()) if d[:1] in "+-"]
            added = [d[2:] for d in diff if d[0] == "+"]
            print(f"// after {p.name}: {len(diff) - len(added)} lines removed, {len(added)} written:", file=self.out)
            for line in added:
                print(line, file=self.out)
        self.last = text


def run_passes(graph: Graph, *, passes: Optional[Sequence[str]] = None, debug: bool = False,
               print_after: Iterable[str] = (), out: Optional[TextIO] = None, recompute: Any = None) -> Graph:
    """Run the graph pipeline (or the named subset, in pipeline order).

    ``recompute``: a strategy ("sqrt", or forward values to drop) or a ``Recomputation`` (whose
    ``plan`` then says what the pass decided) turns on the ``recompute`` pass."""
    printer = _Printer(print_after_names(print_after), sys.stdout if out is None else out)
    request = recompute if recompute is None or isinstance(recompute, Recomputation) else Recomputation(recompute)
    if request is not None:
        graph = request.anchor(graph)
    if debug:
        verify(graph)

    def after(p: Pass, g: Graph) -> None:
        if debug:
            verify(g)
        printer(p, g)

    return run_pipeline(graph, PIPELINE, passes, after, {"recompute": request})


def prepare_signature(program: Program, known: Dict[int, TensorType], *, plan: bool = True, inplace: bool = True,
                      copied_outputs: Sequence[int] = (), recyclable: Sequence[int] = (),
                      update_positions: Optional[Sequence[int]] = None,
                      stages: Optional[Sequence[str]] = None) -> Signature:
    """Run the per-signature stages (all, or the named ones; ``plan=False`` leaves out planning)."""
    names = stage_names() if stages is None else list(stages)
    if not plan:
        names = [n for n in names if n != "plan_memory"]
    sig = Signature(program, dict(known), copied_outputs=tuple(copied_outputs), inplace=inplace,
                    recyclable=tuple(recyclable),
                    update_positions=None if update_positions is None else tuple(update_positions))
    return run_pipeline(sig, SIGNATURE_STAGES, names)
