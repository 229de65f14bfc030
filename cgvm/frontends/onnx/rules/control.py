"""Control flow: If, Loop and Scan, translated inline where the decision or the trip count is known
when the model is translated (If on a static condition, Loop and Scan unrolled over a known
number of steps); sub-graphs see the outer graph's names."""
from __future__ import annotations

import numpy as np

from cgvm.ir.graph import CONST
from cgvm.ops import indexing as I
from cgvm.ops import join as J
from cgvm.ops import shape as shp

from ..translate import rule
from .common import axis_of, ints


@rule("If")
def _if(n):
    cond = n.static(0)
    if cond is None:
        raise n.error("If's condition must be known when the model is translated (a condition computed "
                      "at run time is not supported)")
    branch = n.subgraph("then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch")
    return n.run_subgraph(branch, {})


@rule("Loop")
def _loop(n):
    trip = n.static(0) if n.has_input(0) else None
    cond = n.static(1) if n.has_input(1) else None
    if n.has_input(0) and trip is None:
        raise n.error("Loop's trip count must be known when the model is translated")
    if n.has_input(1) and cond is None:
        raise n.error("Loop's initial condition must be known when the model is translated")
    body = n.subgraph("body")
    steps = int(np.asarray(trip).reshape(-1)[0]) if trip is not None else None
    go = bool(np.asarray(cond).reshape(-1)[0]) if cond is not None else True
    carried = [n.input(i) for i in range(2, len(n.inputs))]
    n_carried = len(carried)
    scans = []
    i = 0
    limit = steps if steps is not None else 10000
    while go and i < limit:
        bound = {"iter": np.asarray(i, np.int64), "cond": np.asarray(go)}
        for k, v in enumerate(carried):
            bound[f"c{k}"] = v
        outs = n.run_subgraph(body, bound)
        c = outs[0]
        if c.kind != CONST:
            raise n.error("Loop's condition computed at run time is not supported (it must fold to a constant)")
        go = bool(np.asarray(c.data).reshape(-1)[0])
        carried = outs[1:1 + n_carried]
        scans.append(outs[1 + n_carried:])
        i += 1
    if steps is None and go:
        raise n.error("Loop ran 10000 steps without its condition turning false")
    results = list(carried)
    n_scan = len(body.output) - 1 - n_carried
    for k in range(n_scan):
        if not scans:
            raise n.error("Loop ran no iteration: its scan outputs would be empty with an unknown shape")
        results.append(J.stack(*[s[k] for s in scans], axis=0))
    return results


@rule("Scan")
def _scan(n):
    body = n.subgraph("body")
    m = int(n.attr("num_scan_inputs"))
    offset = 1 if n.opset < 9 else 0        # Scan-8 takes a sequence_lens first and a batch axis
    if offset:
        raise n.error("Scan before opset 9 (batched) is not supported")
    ins = n.inputs
    n_state = len(ins) - m
    states = list(ins[:n_state])
    seqs = list(ins[n_state:])
    in_axes = ints(n.attr("scan_input_axes", [0] * m))
    in_dirs = ints(n.attr("scan_input_directions", [0] * m))
    n_out = len(body.output) - n_state
    out_axes = ints(n.attr("scan_output_axes", [0] * n_out))
    out_dirs = ints(n.attr("scan_output_directions", [0] * n_out))
    axes = [axis_of(a, s.ndim) for a, s in zip(in_axes, seqs)]
    length = seqs[0].shape[axes[0]]
    if length is None:
        raise n.error("Scan over a sequence of unknown length is not supported")
    collected = [[] for _ in range(n_out)]
    for t in range(length):
        bound = {}
        for k, s in enumerate(states):
            bound[f"s{k}"] = s
        for k, (s, a, d) in enumerate(zip(seqs, axes, in_dirs)):
            pos = length - 1 - t if d else t
            bound[f"x{k}"] = shp.squeeze(I.slice(s, starts=(pos,), stops=(pos + 1,), steps=(1,), axes=(a,)),
                                         axis=(a,))
        outs = n.run_subgraph(body, bound)
        states = outs[:n_state]
        for k in range(n_out):
            collected[k].append(outs[n_state + k])
    results = list(states)
    for k in range(n_out):
        parts = collected[k][::-1] if out_dirs[k] else collected[k]
        nd = parts[0].ndim + 1
        results.append(J.stack(*parts, axis=axis_of(out_axes[k], nd)))
    return results
