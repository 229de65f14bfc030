"""The pass pipeline. The list PIPELINE is the documentation of what compiling does, in order.

Each pass is ``Graph -> Graph`` and declares what it needs; in debug mode the verifier runs
after every pass, and ``print_after`` shows the IR after the named passes.
"""
from __future__ import annotations

import sys
from typing import Callable, Iterable, List, NamedTuple, Optional, Sequence, TextIO

from ..ir.graph import Graph, verify
from .accumulate import fuse_accumulations
from .collectives import schedule_collectives
from .cse import eliminate_common_subexpressions
from .fold import fold_constants
from .fuse import fuse_elementwise, fuse_epilogues
from .layout import sink_transposes
from .loop_pushout import push_out_loop_work
from .loops import hoist_loop_invariants, prune_loop_outputs
from .prune import prune
from .schedule import schedule_for_memory
from .simplify import simplify


class Pass(NamedTuple):
    name: str
    run: Callable[[Graph], Graph]
    needs: tuple = ()
    doc: str = ""


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
    Pass("accumulate", fuse_accumulations, ("simplify",), "beta * c + alpha * (a @ b) as one gemm adding "
                                                          "into c (SGD and momentum weight updates)"),
    Pass("epilogues", fuse_epilogues, ("simplify",), "matmul + bias (+ activation) as gemm_bias_act, "
                                                     "conv + activation as conv_bias_act"),
    Pass("fuse", fuse_elementwise, ("epilogues",), "chains of elementwise ops as one fused_elementwise kernel "
                                                  "running in one buffer"),
    # keep last: passes that rebuild the graph from its outputs restore the depth-first order
    Pass("schedule", schedule_for_memory, ("prune",), "order the backward pass so that values die early"),
    Pass("collectives", schedule_collectives, ("schedule",), "start gradient allreduces early, wait late"),
]


def pass_names() -> List[str]:
    return [p.name for p in PIPELINE]


def run_passes(graph: Graph, *, passes: Optional[Sequence[str]] = None, debug: bool = False,
               print_after: Iterable[str] = (), out: Optional[TextIO] = None) -> Graph:
    """Run the pipeline (or the named subset, in pipeline order)."""
    wanted = set(pass_names() if passes is None else passes)
    unknown = wanted - set(pass_names())
    if unknown:
        raise ValueError(f"unknown pass {sorted(unknown)[0]!r}; passes are {pass_names()}")
    out = sys.stdout if out is None else out
    show = set(print_after)
    if "all" in show:
        show = set(pass_names())
    done: set = set()
    if debug:
        verify(graph)
    for p in PIPELINE:
        if p.name not in wanted:
            continue
        graph = p.run(graph)
        done.add(p.name)
        if debug:
            verify(graph)
        if p.name in show:
            print(f"// after {p.name}", file=out)
            print(graph, file=out)
    return graph
