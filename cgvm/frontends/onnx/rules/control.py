"""Control flow: If, Loop and Scan on cgvm's control ops (``cond`` and ``scan``).

If with a condition known when the model is translated is inlined (only the taken branch is
translated); otherwise it is a ``cond`` node whose branches are closed sub-graphs over the outer
values they read. Loop is a ``scan`` with the trip count as its run-time step count and the
negated condition as its ``until`` output; Scan is a ``scan`` over its sequences moved to axis 0
(reversed where a direction says so). The same compiled program then runs any condition, trip
count or sequence length. Loops that carry sequences or optionals (whose length changes from
step to step) and bodies that need static values of their inputs are unrolled instead, which
needs the trip count when the model is translated (the backend specializes on it).
"""
from __future__ import annotations

from typing import Any, List

import numpy as np

from cgvm.errors import CgvmError
from cgvm.ir import TensorType
from cgvm.ir.graph import CONST
from cgvm.ops import control as C
from cgvm.ops import elementwise as E
from cgvm.ops import indexing as I
from cgvm.ops import join as J
from cgvm.ops import shape as shp
from cgvm.ops.scan_plumbing import reverse

from ..errors import OnnxImportError
from ..subgraph import translate_body, translate_body_fixpoint
from ..translate import OptionalValue, Sequence, rule
from .common import axis_of, cast_to, const, ints

INT64_MAX = np.iinfo(np.int64).max


def _known(n, i):
    """Input ``i``'s value when it is a constant of the model (never read from the run-time inputs)."""
    if not n.has_input(i):
        return None
    v = n.inputs[i]
    return np.asarray(v.data) if getattr(v, "kind", None) == CONST else None


def _scalar(v):
    return v if v.ndim == 0 else shp.reshape(v, shape=())


def _is_plumbing(v) -> bool:
    return isinstance(v, (Sequence, OptionalValue))


# --------------------------------------------------------------------------- If

@rule("If")
def _if(n):
    cond = _known(n, 0)
    if cond is not None:
        return _if_inline(n, cond)
    try:
        return _if_cond(n)
    except (OnnxImportError, CgvmError) as exc:
        # branches that return sequences, need static values, or disagree in rank: specialize
        cond = n.static(0)
        if cond is None:
            raise n.error(f"If's condition must be known when the model is translated here ({exc})") from None
        return _if_inline(n, cond)


def _if_inline(n, cond):
    if np.asarray(cond).size != 1:
        raise n.error(f"If's condition must hold one value, has shape {np.asarray(cond).shape}")
    branch = n.subgraph("then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch")
    return n.run_subgraph(branch, {})


def _if_cond(n):
    pred = n.input(0)
    if pred.shape and any(d is not None and d != 1 for d in pred.shape):
        raise n.error(f"If's condition must hold one value, has shape {pred.shape}")
    then_b = translate_body(n.tr, n.subgraph("then_branch"), [], "then")
    else_b = translate_body(n.tr, n.subgraph("else_branch"), [], "else")
    if len(then_b.outputs) != len(else_b.outputs):
        raise n.error(f"If's branches return {len(then_b.outputs)} and {len(else_b.outputs)} values")
    if any(_is_plumbing(v) for v in then_b.outputs + else_b.outputs):
        raise OnnxImportError(f"{n.where()}: a branch returns a sequence or an optional")
    operands = then_b.outer + [v for v in else_b.outer if all(v is not c for c in then_b.outer)]
    res = C.cond(_scalar(cast_to(pred, np.bool_)), *operands, then_graph=then_b.graph(operands=operands),
                 else_graph=else_b.graph(operands=operands))
    return list(res) if isinstance(res, tuple) else [res]


# --------------------------------------------------------------------------- Loop

@rule("Loop")
def _loop(n):
    carried = list(n.inputs[2:])
    if not any(_is_plumbing(v) for v in carried):
        try:
            return _loop_scan(n, carried)
        except (OnnxImportError, CgvmError) as exc:
            if "unroll" not in str(exc) and not _unrollable(n):
                raise
    return _loop_unrolled(n)


def _unrollable(n) -> bool:
    return (not n.has_input(0) or n.static(0) is not None) and (not n.has_input(1) or n.static(1) is not None)


def _loop_scan(n, carried: List[Any]):
    body = n.subgraph("body")
    n_carried = len(carried)
    if len(body.input) != 2 + n_carried:
        raise n.error(f"Loop's body takes {len(body.input)} inputs for {n_carried} loop-carried values")
    if not n.has_input(0) and not n.has_input(1):
        raise n.error("Loop has neither a trip count nor a condition: it would never end")
    i64 = TensorType((), np.int64)
    specs = [i64, np.asarray(True)] + [v.type for v in carried]
    b = translate_body_fixpoint(n.tr, body, specs, [(2 + k, 1 + k) for k in range(n_carried)], "loop_body")
    outs = b.outputs
    if any(_is_plumbing(v) for v in outs):
        raise OnnxImportError(f"{n.where()}: the body returns a sequence or an optional (unroll)")
    it = b.inputs[0]
    step_outs = [E.add(it, const(1, dtype=np.int64))] + list(outs[1:1 + n_carried]) + list(outs[1 + n_carried:])
    has_until = n.has_input(1)
    if has_until:
        step_outs.append(_scalar(E.logical_not(cast_to(outs[0], np.bool_))))
    graph = b.graph(outputs=step_outs)
    if n.has_input(0):
        steps = cast_to(_scalar(n.input(0)), np.int64)
    else:
        steps = const(INT64_MAX, dtype=np.int64)
    if has_until:   # a false initial condition runs no step
        steps = E.where(_scalar(cast_to(n.input(1), np.bool_)), steps, const(0, dtype=np.int64))
    init = [const(0, dtype=np.int64)] + carried
    stacked = _stackable(b.inputs[1:], carried)
    res = C.scan(*init, *b.outer, steps, body=graph, n_seqs=0, n_carry=1 + n_carried, has_until=has_until,
                 dyn_steps=True, stacked=stacked)
    res = list(res) if isinstance(res, tuple) else [res]
    nc = 1 + n_carried
    return res[1:nc] + res[nc + (nc if stacked is None else 0):]


def _stackable(body_inputs, initial):
    """None (every carry stacked, which scan's gradient needs) when the carries keep their shapes
    from step to step; else () (a carry that grows cannot be stacked, and is not differentiated)."""
    same = all(tuple(b.shape) == tuple(v.shape) for b, v in zip(body_inputs, initial))
    return None if same else ()


def _loop_unrolled(n):
    trip = n.static(0) if n.has_input(0) else None
    cond = n.static(1) if n.has_input(1) else None
    if n.has_input(0) and trip is None:
        raise n.error("Loop's trip count must be known when the model is translated (the loop carries "
                      "sequences or its body needs static values)")
    if n.has_input(1) and cond is None:
        raise n.error("Loop's initial condition must be known when the model is translated (the loop carries "
                      "sequences or its body needs static values)")
    body = n.subgraph("body")
    steps = int(np.asarray(trip).reshape(-1)[0]) if trip is not None else None
    go = bool(np.asarray(cond).reshape(-1)[0]) if cond is not None else True
    carried = [n.inputs[i] for i in range(2, len(n.inputs))]
    n_carried = len(carried)
    scans = []
    i = 0
    limit = steps if steps is not None else 10000
    while go and i < limit:
        bound = {"iter": np.asarray(i, np.int64), "cond": np.asarray(go)}
        for k, v in enumerate(carried):
            bound[f"c{k}"] = v
        outs = n.run_subgraph(body, bound)
        if n.has_input(1):
            c = outs[0]
            if c.kind != CONST:
                raise n.error("Loop's condition computed at run time is not supported when the loop is unrolled "
                              "(it must fold to a constant)")
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


# --------------------------------------------------------------------------- Scan

def _to_front(x, axis):
    if axis == 0:
        return x
    perm = [axis] + [d for d in range(x.ndim) if d != axis]
    return shp.transpose(x, perm=tuple(perm))


def _from_front(y, axis):
    if axis == 0:
        return y
    rest = list(range(1, y.ndim))
    perm = rest[:axis] + [0] + rest[axis:]
    return shp.transpose(y, perm=tuple(perm))


def _scan_over(n, body, states, seqs, in_axes, in_dirs, out_axes, out_dirs):
    """One cgvm scan for the opset-9 form: states, sequences with their axes and directions."""
    m, n_state = len(seqs), len(states)
    fronts = []
    for s, a, d in zip(seqs, in_axes, in_dirs):
        f = _to_front(s, axis_of(a, s.ndim))
        fronts.append(reverse(f) if d else f)
    specs = [v.type for v in states] + [TensorType(f.shape[1:], f.dtype) for f in fronts]
    b = translate_body_fixpoint(n.tr, body, specs, [(k, k) for k in range(n_state)], "scan_body")
    if any(_is_plumbing(v) for v in b.outputs):
        raise n.error("Scan's body returns a sequence or an optional")
    # cgvm's scan body takes the sequences first, then the carries
    order = b.inputs[n_state:] + b.inputs[:n_state]
    b.inputs = order
    stacked = _stackable(b.inputs[m:], states)
    res = C.scan(*fronts, *states, *b.outer, body=b.graph(), n_seqs=m, n_carry=n_state, stacked=stacked)
    res = list(res) if isinstance(res, tuple) else [res]
    finals, ys = res[:n_state], res[n_state + (n_state if stacked is None else 0):]
    outs = list(finals)
    for y, a, d in zip(ys, out_axes, out_dirs):
        if d:
            y = reverse(y)
        outs.append(_from_front(y, axis_of(a, y.ndim)))
    return outs


@rule("Scan")
def _scan(n):
    body = n.subgraph("body")
    m = int(n.attr("num_scan_inputs"))
    if n.opset < 9:
        return _scan8(n, body, m)
    ins = n.inputs
    n_state = len(ins) - m
    n_out = len(body.output) - n_state
    return _scan_over(n, body, list(ins[:n_state]), list(ins[n_state:]),
                      ints(n.attr("scan_input_axes", [0] * m)), ints(n.attr("scan_input_directions", [0] * m)),
                      ints(n.attr("scan_output_axes", [0] * n_out)),
                      ints(n.attr("scan_output_directions", [0] * n_out)))


def _scan8(n, body, m):
    """Scan-8: axis 0 of every state and sequence is a batch, each entry scanned on its own
    (over axis 1 of the sequences), ``sequence_lens`` giving each entry's length."""
    ins = n.inputs[1:]
    n_state = len(ins) - m
    states, seqs = list(ins[:n_state]), list(ins[n_state:])
    dirs = ints(n.attr("directions", [0] * m))
    batch = (states + seqs)[0].shape[0]
    if batch is None:
        raise n.error("Scan-8's batch size must be known when the model is translated")
    length = seqs[0].shape[1] if seqs else None
    lens = n.static(0) if n.has_input(0) else None
    if n.has_input(0) and lens is None:
        raise n.error("Scan-8's sequence_lens must be known when the model is translated")
    if lens is not None and (length is None or any(int(k) != length for k in np.asarray(lens).reshape(-1))):
        raise n.error("Scan-8 with sequence_lens shorter than the sequences is not supported (every entry must "
                      "run the full length)")
    n_out = len(body.output) - n_state
    per_batch = []
    for k in range(batch):
        pick = [shp.squeeze(I.slice(v, starts=(k,), stops=(k + 1,), steps=(1,), axes=(0,)), axis=(0,))
                for v in states + seqs]
        per_batch.append(_scan_over(n, body, pick[:n_state], pick[n_state:], [0] * m, dirs, [0] * n_out,
                                    [0] * n_out))
    return [J.stack(*[r[j] for r in per_batch], axis=0) for j in range(n_state + n_out)]
