"""Control flow as nodes with sub-graphs: ``scan`` (loops, with BPTT gradients) and ``cond`` (lazy if-else).

scan(*sequences, *initial_carries, *non_sequences[, n_steps]) with a ``body`` graph

    body(x_t..., h_prev..., p...) -> (h_t..., y_t... [, stop])

iterates over axis 0 of the sequences. Outputs, in order: the final carries, the carries
stacked over steps ``(T, ...)``, and the per-step outputs stacked ``(T, ...)``. With
``has_until`` the body's last output is a boolean scalar; the loop stops after the first step
where it is true. Sub-graphs are closed: everything they read is an input.

``truncate_gradient=k`` limits backpropagation through time to the last k steps (the forward
loop always runs fully); ``truncate=k`` makes the loop itself run only its first k iterations,
leaving the rest of the stacked outputs zero (how truncated backward loops are built).

Stacks are in iteration order: row t holds step t, which read row ``steps - 1 - t`` of the
sequences when ``go_backwards``. With ``seq_order`` they are in sequence order instead, row i
beside the sequence rows step i read (how backward loops are built: their stacks then line up
with the forward loop's without a reversing copy).

Frontends lower richer forms (sequence taps, multi-tap outputs) onto this one.
The ops scan's gradient uses to move per-step stacks (shift_in, reverse, ...) are in
cgvm.ops.scan_plumbing.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from ..errors import GradientError, ShapeError
from ..ir.attrs import Bool, GraphAttr, Int, Ints
from ..ir.builder import rebuild
from ..ir.graph import Graph, Value, input_value, toposort
from ..ir.types import TensorType
from . import elementwise as ew
from . import shape as shp
from .registry import OPAQUE, defop, subgraph_gradients
from .scan_plumbing import pad_steps_like, reverse, shift_in
from ..pycode import define
from .kernels import scan_jit
from .kernels.scratch import aligned, aligned_empty, sole_reference


def split_sizes(seq: Sequence[Any], *sizes: int) -> List[Sequence[Any]]:
    """``seq`` cut into runs of ``sizes`` and the rest (a scan's sequences, carries, the others)."""
    parts, i = [], 0
    for n in sizes:
        parts.append(seq[i:i + n])
        i += n
    parts.append(seq[i:])
    return parts


# --------------------------------------------------------------------------- scan

def _dims_agree(a, b) -> bool:
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _stacked(stacked, n_carry) -> tuple:
    """Indices of the carries whose per-step values are stacked (None: all of them)."""
    return tuple(range(n_carry)) if stacked is None else stacked


def _scan_outputs(attrs, n_inputs):
    body = attrs["body"]
    n_ys = len(body.outputs) - attrs["n_carry"] - (1 if attrs["has_until"] else 0)
    return attrs["n_carry"] + len(_stacked(attrs["stacked"], attrs["n_carry"])) + n_ys


def _scan_infer(types, body, n_seqs, n_carry, go_backwards, has_until, n_steps, dyn_steps, truncate,
                reset_carries, truncate_gradient, stacked, seq_order):
    seqs, inits, rest = split_sizes(types, n_seqs, n_carry)
    nonseqs = rest[:-1] if dyn_steps else rest
    expected = len(body.inputs)
    if n_seqs + n_carry + len(nonseqs) != expected:
        raise ShapeError(f"scan body takes {expected} inputs, the node gives {n_seqs + n_carry + len(nonseqs)}")
    for k, (t, v) in enumerate(zip(list(seqs) + list(inits) + list(nonseqs), body.inputs)):
        want = v.type
        have = TensorType(t.shape[1:], t.dtype) if k < n_seqs else t
        if have.dtype is not want.dtype or not _dims_agree(have.shape, want.shape):
            raise ShapeError(f"scan input {k} is {have!r} per step; the body expects {want!r}")
    for k, (t, out) in enumerate(zip(inits, body.outputs[:n_carry])):
        if out.dtype is not t.dtype or out.ndim != t.ndim:
            raise ShapeError(f"scan carry {k}: initial value is {t!r} but the body returns {out.type!r}")
    steps: Optional[int] = n_steps
    lengths = [t.shape[0] for t in seqs]
    if steps is None and lengths and None not in lengths:
        steps = min(lengths)
    if dyn_steps or has_until:
        steps = None
    n_ys = len(body.outputs) - n_carry - (1 if has_until else 0)
    outs = []
    for t, out in zip(inits, body.outputs[:n_carry]):
        outs.append(TensorType([a if a == b else None for a, b in zip(t.shape, out.shape)], t.dtype))
    stacks = [TensorType((steps,) + tuple(outs[k].shape), outs[k].dtype) for k in _stacked(stacked, n_carry)]
    ys = [TensorType((steps,) + tuple(o.shape), o.dtype) for o in body.outputs[n_carry:n_carry + n_ys]]
    return outs + stacks + ys


scan = defop("scan", num_inputs=(0, None), num_outputs=_scan_outputs, pattern=OPAQUE, needs_runtime=True,
             writes_out=False, infer=_scan_infer,
             attrs={"body": GraphAttr(), "n_seqs": Int(0), "n_carry": Int(0), "go_backwards": Bool(False),
                    "has_until": Bool(False), "n_steps": Int(None), "dyn_steps": Bool(False),
                    "truncate": Int(-1), "reset_carries": Int(0), "truncate_gradient": Int(-1),
                    "stacked": Ints(None), "seq_order": Bool(False)})


@scan.may_alias
def _(node):
    # a final carry may be any input (no step ran: the initial carry; a body returning a non-sequence
    # or a sequence's row); the stacks are the loop's own arrays, which the loop fills with copies
    every = tuple(range(len(node.inputs)))
    return [every] * node.attrs["n_carry"] + [()] * (len(node.outputs) - node.attrs["n_carry"])


#: a loop of at least this many steps reads its GEMM operands from cache-line aligned copies: the
#: copy of a weight matrix costs about what a few steps' products gain (a sentence of an rnnslu
#: tutorial, 6-17 steps, paid more for copying its 350x200 weights than its products won)
REALIGN_MIN_STEPS = 32


def _steady_loop(n_seqs: int, n_carry: int, n_nonseq: int, kept: Sequence[int], go_backwards: bool,
                 has_until: bool, unread_seqs: Sequence[int] = (), seq_order: bool = False):
    """The loop over steps t0..active-1 once the step's shapes are fixed, generated as straight-line
    Python for this scan's arity (no per-step lists, zips or slicing comprehensions):
    ``loop(step, seqs, carries, nonseqs, stacks, t0, active, steps) -> (carries, stopped_after, last_t)``.
    Sequences the body never reads (they still count the steps) are passed as None, not indexed."""
    seq, car, par, stk = ([f"{p}{k}" for k in range(n)] for p, n in
                          (("s", n_seqs), ("c", n_carry), ("p", n_nonseq), ("st", len(kept))))
    lines = ["def loop(step, seqs, carries, nonseqs, stacks, t0, active, steps):"]
    for names, src in ((seq, "seqs"), (car, "carries"), (par, "nonseqs"), (stk, "stacks")):
        if names:
            lines.append(f"    {', '.join(names)}, = {src}")
    step_seqs = ["None" if k in unread_seqs else f"{s}[i]" for k, s in enumerate(seq)]
    lines += ["    t = t0 - 1", "    for t in range(t0, active):",
              f"        i = {'steps - 1 - t' if go_backwards else 't'}",
              f"        r = step({', '.join(step_seqs + car + par)})"]
    lines += [f"        {st}[{'i' if seq_order else 't'}] = r[{k}]" for st, k in zip(stk, kept)]
    if car:
        lines.append(f"        {', '.join(car)}, = r[:{n_carry}]")
    if has_until:
        lines += ["        if r[-1]:", f"            return [{', '.join(car)}], t + 1, t"]
    lines.append(f"    return [{', '.join(car)}], None, t")
    return define("loop", lines, {}, f"scan loop {n_seqs}/{n_carry}/{n_nonseq}")


@scan.kernel_factory
def _(xp, runtime, body, n_seqs, n_carry, go_backwards, has_until, n_steps, dyn_steps, truncate,
      reset_carries, truncate_gradient, stacked, seq_order):
    n_ys = len(body.outputs) - n_carry - (1 if has_until else 0)
    # per-step outputs are copied into their stacks at once: the step may return one array for several
    run = runtime.compile(body, copied_outputs=range(n_carry, n_carry + n_ys))
    kept = list(_stacked(stacked, n_carry)) + list(range(n_carry, n_carry + n_ys))  # body outputs to stack
    spare: List[Any] = [None] * len(kept)  # last call's stacks, reused when nobody else holds them

    def new_stack(j: int, shape: tuple, dtype: Any) -> Any:
        # a fresh multi-MiB array costs a page fault per 4 KiB on every call; the previous call's
        # stack is reused when only this list refers to it and only it refers to its memory (no
        # output, view or user holds either: NumPy points a view of a view at the memory's owner)
        old = spare[j]
        if old is not None and old.shape == shape and old.dtype == dtype and sole_reference(old):
            owner = old.base
            if owner is None or sole_reference(owner):
                return old
        spare[j] = aligned_empty(xp, shape, dtype)
        return spare[j]

    def grow(j: int, old: Any, rows: int) -> Any:
        spare[j] = aligned_empty(xp, (rows,) + old.shape[1:], old.dtype)
        spare[j][:old.shape[0]] = old
        return spare[j]

    read = {id(v) for n in body.nodes for v in n.inputs} | {id(v) for v in body.outputs}
    unread_seqs = [k for k, v in enumerate(body.inputs[:n_seqs]) if id(v) not in read]
    flipped = seq_order and go_backwards   # stacks filled from the last row down
    steady = _steady_loop(n_seqs, n_carry, len(body.inputs) - n_seqs - n_carry, kept, go_backwards, has_until,
                          unread_seqs, seq_order)
    # non-sequences a GEMM reads on every step: made cache-line aligned once per call
    gemm_read = {id(v) for n in body.nodes if n.op.runs_gemm for v in n.inputs}
    realign = [k for k, v in enumerate(body.inputs[n_seqs + n_carry:]) if id(v) in gemm_read]

    # the compiled loop tier: only where the runtime hands out the optimized body (the VM's; the
    # reference interpreter runs every node itself) and arrays are NumPy's
    hot = scan_jit.hot_threshold() if xp is np else None
    optimized = getattr(runtime, "optimized", None)
    jit = None if hot is None or optimized is None else scan_jit.ScanJit(
        optimized(body), n_seqs=n_seqs, n_carry=n_carry, kept=kept, go_backwards=go_backwards,
        has_until=has_until, seq_order=seq_order, hot=hot)

    n_sc = n_seqs + n_carry

    def scan_kernel(*inputs):
        seqs, inits = inputs[:n_seqs], inputs[n_seqs:n_sc]
        nonseqs = list(inputs[n_sc:-1] if dyn_steps else inputs[n_sc:])
        steps = int(inputs[-1]) if dyn_steps else n_steps
        if steps is None:
            if not seqs:
                raise ValueError("scan without sequences needs n_steps")
            steps = min(s.shape[0] for s in seqs)
        elif seqs and min(s.shape[0] for s in seqs) < steps:
            raise ValueError(f"scan: n_steps={steps} but a sequence has only "
                             f"{min(s.shape[0] for s in seqs)} entries")
        active = steps if truncate < 0 else min(steps, truncate)
        # a loop that may stop early (a while loop: until, no sequences) stacks into rows that grow
        # as it runs, so a bound far above the steps taken (or none: the largest int64) costs nothing
        growing = has_until and not seqs and not go_backwards and not seq_order
        rows = min(active, 16) if growing else steps
        carries = list(inits)
        stacks: List[Any] = []
        done = steps
        t = -1
        # the compiled tier (cgvm.ops.kernels.scan_jit): every step in one Numba call, once hot
        ran = jit.run(seqs, inits, nonseqs, active, steps, new_stack) if jit is not None and active and not growing \
            else None
        if ran is not None:
            carries, stacks, stopped = ran
            t = active - 1 if stopped < 0 else stopped - 1
            if stopped >= 0:
                done = stopped
        else:
            if active >= REALIGN_MIN_STEPS:
                for k in realign:
                    nonseqs[k] = aligned(xp, nonseqs[k])
            step = None
            for t in range(active):
                i = steps - 1 - t if go_backwards else t
                args = [s[i] for s in seqs] + carries + nonseqs
                if step is None:
                    res = run(args)
                    if all(r.shape == c.shape for r, c in zip(res, carries)):
                        step = run.prepare(args)  # the step's shapes are fixed from now on: skip the look-up
                    if not stacks:
                        stacks = [new_stack(j, (rows,) + res[k].shape, res[k].dtype) for j, k in enumerate(kept)]
                else:
                    res = step(*args)
                if growing and t >= rows:
                    rows = min(2 * rows, active)
                    stacks = [grow(j, st, rows) for j, st in enumerate(stacks)]
                for st, k in zip(stacks, kept):
                    st[i if seq_order else t] = res[k]
                carries = list(res[:n_carry])
                if has_until and bool(res[-1]):
                    done = t + 1
                    break
                if step is not None and t + 1 < active:   # fixed shapes: the rest runs in straight-line code
                    while True:
                        carries, stopped, t = steady(step, seqs, carries, nonseqs, stacks, t + 1, min(active, rows),
                                                     steps)
                        if stopped is not None:
                            done = stopped
                            break
                        if t + 1 >= active:
                            break
                        rows = min(2 * rows, active)
                        stacks = [grow(j, st, rows) for j, st in enumerate(stacks)]
                    break
        if not stacks and kept:  # zero steps: empty stacks shaped after the initial carries
            stacks = [xp.zeros((0,) + inits[k].shape, inits[k].dtype) for k in _stacked(stacked, n_carry)]
            stacks += [xp.zeros((0,) + tuple(d or 0 for d in o.shape), o.dtype.np)
                       for o in body.outputs[n_carry:n_carry + n_ys]]
        written = t + 1
        if growing and done == steps:   # ran every step: the rows are exactly the steps
            done = written
        if written < (stacks[0].shape[0] if stacks else 0):
            for st in stacks:   # steps not run (truncate) read as zeros
                if flipped:
                    st[:steps - written] = 0
                else:
                    st[written:] = 0
        if active < steps:
            for k in range(min(reset_carries, n_carry)):
                carries[k] = xp.zeros_like(carries[k])
        if done < steps or (growing and stacks and stacks[0].shape[0] != done):
            stacks = [st[steps - done:] if flipped else st[:done] for st in stacks]
        finals = carries if ran is not None else [c if isinstance(c, xp.ndarray) else xp.asarray(c) for c in carries]
        results = (*finals, *stacks)
        return results[0] if len(results) == 1 else results  # one output: the VM stores it as is
    scan_kernel.jit = jit   # the tier's state, for tests and inspection (None: off)
    return scan_kernel


def _fresh_inputs(values: Sequence[Value], prefix: str) -> List[Value]:
    return [input_value(v.type, f"{prefix}{i}") for i, v in enumerate(values)]


@scan.grad
def _(node, *gouts):
    a = node.attrs
    body: Graph = a["body"]
    S, C = a["n_seqs"], a["n_carry"]
    seqs, inits, rest = split_sizes(node.inputs, S, C)
    nonseqs = list(rest[:-1] if a["dyn_steps"] else rest)
    K = len(nonseqs)
    n_ys = len(body.outputs) - C - (1 if a["has_until"] else 0)
    if a["stacked"] is not None and tuple(a["stacked"]) != tuple(range(C)):
        raise GradientError(f"{node.where()}: the gradient of a scan needs every carry stacked")
    g_final, g_stack, g_ys = split_sizes(gouts, C, C)
    stacked = node.outputs[C:2 * C]
    fwd_ys = node.outputs[2 * C:2 * C + n_ys]
    if a["seq_order"] and a["go_backwards"]:   # the rule below reads stacks in iteration order
        stacked, fwd_ys = [reverse(s) for s in stacked], [reverse(y) for y in fwd_ys]
        g_stack, g_ys = ([None if g is None else reverse(g) for g in gs] for gs in (g_stack, g_ys))

    # the step's gradient graph: G(x_t, h_prev, p, gh_t, gy_t) -> (gh_prev, gx_t, gp_t)
    x_in, h_in, p_in = _fresh_inputs(body.inputs[:S], "x"), \
        _fresh_inputs(body.inputs[S:S + C], "h"), _fresh_inputs(body.inputs[S + C:], "p")
    step_outs = rebuild(list(body.outputs[:C + n_ys]),
                        {id(o): n for o, n in zip(body.inputs, x_in + h_in + p_in)})
    gh_seq_in = [input_value(TensorType(s.type.shape[1:], s.dtype), f"gH{i}")
                 for i, s in enumerate(stacked) if g_stack[i] is not None]
    gy_in = [input_value(TensorType(o.shape, o.dtype), f"gy{j}")
             for j, o in enumerate(body.outputs[C:C + n_ys]) if g_ys[j] is not None]
    gh_carry = _fresh_inputs(body.inputs[S:S + C], "gh")
    diff_p = [k for k, p in enumerate(nonseqs) if p.dtype.is_float]
    gp_carry = [input_value(p_in[k].type, f"gp{k}") for k in diff_p]

    seeds = {}
    it_gh = iter(gh_seq_in)
    for i, h_t in enumerate(step_outs[:C]):
        total = gh_carry[i]
        if g_stack[i] is not None:
            total = ew.add(total, next(it_gh))
        seeds[h_t] = ew.add(seeds[h_t], total) if h_t in seeds else total
    it_gy = iter(gy_in)
    for j, y_t in enumerate(step_outs[C:C + n_ys]):
        if g_ys[j] is not None:
            g = next(it_gy)     # one value may be both a carry and a per-step output: the seeds add up
            seeds[y_t] = ew.add(seeds[y_t], g) if y_t in seeds else g
    wrt = x_in + h_in + p_in
    gmap = subgraph_gradients(seeds, wrt)

    def g_of(v: Value) -> Value:
        g = gmap.get(id(v))
        return shp.zeros_like(v) if g is None else g

    new_gh = [g_of(h) for h in h_in]
    new_gp = [ew.add(gp_carry[n], g_of(p_in[k])) for n, k in enumerate(diff_p)]
    gx = [g_of(x) for x in x_in]
    # the step's outputs were stacked by the forward loop: read them instead of recomputing the step
    # (tanh' from its output, say); values the gradient needs that were not outputs are still recomputed
    fwd_stacks = list(stacked) + list(fwd_ys)
    saved = [(v, st) for v, st in zip(step_outs, fwd_stacks) if v.node is not None]
    saved_in = [input_value(v.type, f"saved{i}") for i, (v, _) in enumerate(saved)]
    grads_out = rebuild(new_gh + new_gp + gx, {id(v): n for (v, _), n in zip(saved, saved_in)})
    reads = {id(v) for n in toposort(grads_out) for v in n.inputs} | {id(v) for v in grads_out}
    used = [(n, st) for n, (_, st) in zip(saved_in, saved) if id(n) in reads]
    bwd_inputs = x_in + h_in + [n for n, _ in used] + gh_seq_in + gy_in + gh_carry + gp_carry + p_in
    bwd_body = Graph(bwd_inputs, grads_out, name=f"{body.name}_grad")

    # the backward loop walks the forward iterations in reverse; every sequence is in iteration order
    backwards = a["go_backwards"]
    x_iter = [reverse(x) for x in seqs] if backwards else list(seqs)
    h_prev = [shift_in(init, st) for init, st in zip(inits, stacked)]
    gh_seqs = [g for g in g_stack if g is not None]
    gy_seqs = [g for g in g_ys if g is not None]
    gh0 = [shp.zeros_like(i) if g is None else g for i, g in zip(inits, g_final)]
    gp0 = [shp.zeros_like(nonseqs[k]) for k in diff_p]
    saved_seqs = [st for _, st in used]
    n_bwd_seqs = len(seqs) + len(h_prev) + len(saved_seqs) + len(gh_seqs) + len(gy_seqs)
    # a loop that stopped early stacked only the steps it ran: the backward loop runs as many
    # steps as those stacks hold, not the forward bound
    by_length = a["has_until"] and n_bwd_seqs > 0
    dyn = a["dyn_steps"] and not by_length
    extra = [node.inputs[-1]] if dyn else []
    outs = scan(*x_iter, *h_prev, *saved_seqs, *gh_seqs, *gy_seqs, *gh0, *gp0, *nonseqs, *extra, body=bwd_body,
                n_seqs=n_bwd_seqs,
                n_carry=C + len(diff_p),
                go_backwards=True, n_steps=None if by_length else a["n_steps"], dyn_steps=dyn,
                truncate=a["truncate_gradient"], reset_carries=C, seq_order=True)
    outs = outs if isinstance(outs, tuple) else (outs,)
    nc = C + len(diff_p)
    finals, ys = outs[:nc], outs[2 * nc:]
    g_inits = list(finals[:C])
    g_nonseq: List[Optional[Value]] = [None] * K
    for n, k in enumerate(diff_p):
        g_nonseq[k] = finals[C + n]
    g_seqs = []
    for y, x in zip(ys[:S], seqs):
        g_iter = y   # row i: the gradient of forward step i (the backward loop stacks in sequence order)
        if a["has_until"]:  # a loop that stopped early ran fewer steps: pad back to the sequence length
            g_iter = pad_steps_like(g_iter, x)
        g_seqs.append(reverse(g_iter) if backwards else g_iter)
    return g_seqs + g_inits + g_nonseq + ([None] if a["dyn_steps"] else [])


# --------------------------------------------------------------------------- cond

def _cond_infer(types, then_graph, else_graph):
    pred = types[0]
    if pred.ndim != 0 and pred.shape != (1,):
        raise ShapeError(f"cond needs a scalar condition, got {pred!r}")
    n_ops = len(types) - 1
    for g, which in ((then_graph, "then"), (else_graph, "else")):
        if len(g.inputs) != n_ops:
            raise ShapeError(f"cond {which}-branch takes {len(g.inputs)} inputs, given {n_ops}")
    if len(then_graph.outputs) != len(else_graph.outputs):
        raise ShapeError(f"cond branches return {len(then_graph.outputs)} and {len(else_graph.outputs)} values")
    outs = []
    for a, b in zip(then_graph.outputs, else_graph.outputs):
        if a.dtype is not b.dtype or a.ndim != b.ndim:
            raise ShapeError(f"cond branches disagree: {a.type!r} vs {b.type!r}")
        outs.append(TensorType([x if x == y else None for x, y in zip(a.shape, b.shape)], a.dtype))
    return outs


cond = defop("cond", num_inputs=(1, None), num_outputs=lambda attrs, n: len(attrs["then_graph"].outputs),
             pattern=OPAQUE, needs_runtime=True, writes_out=False, infer=_cond_infer,
             attrs={"then_graph": GraphAttr(), "else_graph": GraphAttr()})


@cond.kernel_factory
def _(xp, runtime, then_graph, else_graph):
    run_then = runtime.compile(then_graph)
    run_else = runtime.compile(else_graph)
    single = len(then_graph.outputs) == 1

    def cond_kernel(pred, *operands):
        res = (run_then if bool(pred) else run_else)(list(operands))
        return res[0] if single else tuple(res)
    return cond_kernel


def branch_grad(graph: Graph, gouts: Sequence[Optional[Value]]) -> Graph:
    """A graph (operands..., output grads...) -> operand grads, for one branch."""
    ins = _fresh_inputs(graph.inputs, "x")
    outs = rebuild(list(graph.outputs), {id(o): n for o, n in zip(graph.inputs, ins)})
    g_in = [input_value(o.type, f"g{i}") for i, (o, g) in enumerate(zip(outs, gouts)) if g is not None]
    it = iter(g_in)
    seeds = {o: next(it) for o, g in zip(outs, gouts) if g is not None}
    gmap = subgraph_gradients(seeds, ins)
    results = [gmap.get(id(x)) or shp.zeros_like(x) for x in ins]
    return Graph(ins + g_in, results, name=f"{graph.name}_grad")


@cond.grad
def _(node, *gouts):
    pred, operands = node.inputs[0], node.inputs[1:]
    float_ops = [k for k, v in enumerate(operands) if v.dtype.is_float]
    if not float_ops:
        return [None] * len(node.inputs)
    then_g = branch_grad(node.attrs["then_graph"], gouts)
    else_g = branch_grad(node.attrs["else_graph"], gouts)
    given = [g for g in gouts if g is not None]
    res = cond(pred, *operands, *given, then_graph=then_g, else_graph=else_g)
    res = res if isinstance(res, tuple) else (res,)
    return [None] + [res[k] if operands[k].dtype.is_float else None for k in range(len(operands))]
