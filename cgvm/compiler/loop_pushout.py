"""Push per-step work out of scan loops, where one operation over all steps does the same job.

Four rewrites, all exact up to float summation order:

- Sequence work. Work that reads no carry -- sequence slices, loop-invariant values and what is
  computed from them alone -- does not need the loop: ``matmul(x_t, p)`` becomes one
  ``matmul(X, p)`` over the stacked sequence before it (one large GEMM instead of T small ones),
  and the body reads the product as a new sequence. Elementwise work goes out with it (BPTT's
  ``1 - tanh²`` of the stacked forward outputs), and so does every op that says how it runs
  over a leading axis of steps (``@op.over_steps``: matmul, expand_dims, squeeze, softmax and
  its gradient, sum_to_like, ...): BPTT's ``softmax_grad(gy_t, y_t) @ Wᵀ`` of an Elman RNN.
- Accumulators. A carry that only sums a per-step term, ``c_t = c_{t-1} + term_t``, with
  ``term_t = matmul(transpose(a_t), b_t)`` (the weight gradients of backpropagation through
  time, also when autodiff wrapped them in ``sum_to_like(·, p)``) or ``sum_to_like(v_t, p)``
  (bias gradients), stops being a carry: the loop stacks ``a_t, b_t`` (``v_t``) as per-step
  outputs (a factor that is a sequence slice is read from the sequence), and after it
  ``c_T = c_0 + Aᵀ B`` with A, B flattened to (T·N, ·): one GEMM instead of T GEMMs and T
  additions. Steps a loop does not run (``truncate``, ``until``) leave zero rows in the stacks,
  which add nothing. A sum started from zeros (a gradient's) is the product itself, broadcast
  to the zeros' shape: no zeros made and added (and the SGD step on it becomes one GEMM adding
  into the weight: cgvm.compiler.simplify, cgvm.compiler.accumulate).
- Per-step outputs. A per-step output computed from stacked values alone -- stacked carries,
  other per-step outputs, sequences -- and loop invariants is computed after the loop over the
  stacks (an Elman RNN's ``softmax(h_t W + b)`` over all the stacked h_t; BPTT's ``dz_t Wᵀ``
  of the stacked dz_t), and a per-step output that is a sequence slice is that sequence; not
  where steps may not run (``truncate``, ``until``: their zero rows would not read as zero outputs).
- Unread inputs. Non-sequences (and, where the step count is given, sequences) the body no
  longer reads leave the loop, and what computed them need not run (a transposed copy made for
  a GEMM that went out). Work moved out reads a transposed operand as the view it is: one
  product over all steps runs as fast on it as on a copy.

Each rewrite keeps the scan's outputs in place, so the rest of the graph is untouched. Work
that only gives another node its shape stays in the body, where per-signature specialization
removes it.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple

from ..ir.builder import clone_node, rebuild
from ..ir.graph import CONST, Graph, Node, Value, input_value
from ..ops import linalg, reduce, scan_plumbing
from ..ops import elementwise as ew
from ..ops import shape as shp
from ..ops.registry import BROADCAST, ELEMWISE
from ..ops.rules import axes_over_steps
from .rewrite import rewrite


# --------------------------------------------------------------------------- sequence work

def _attrs_over_steps(n: Node, stepped_ids: Dict[int, Value], invariant: Dict[int, Value]) -> Optional[dict]:
    """The attributes with which ``n`` computes every step at once, its per-step operands (ids in
    ``stepped_ids``) stacked along a new leading axis and the others loop-invariant; None if it cannot.
    Elementwise ops broadcast invariant operands of no higher rank; other ops say (``@op.over_steps``)."""
    if n.op.stateful or len(n.outputs) != 1:
        return None
    stepped = [id(v) in stepped_ids for v in n.inputs]
    if not any(stepped) or not all(s or v.kind == CONST or id(v) in invariant for v, s in zip(n.inputs, stepped)):
        return None
    if n.op.pattern in (ELEMWISE, BROADCAST):
        out = n.outputs[0]
        ok = all(tuple(v.shape) == tuple(out.shape) if s else v.ndim <= out.ndim for v, s in zip(n.inputs, stepped))
        return dict(n.attrs) if ok else None
    return n.op.attrs_over_steps(n, stepped)


def _outside(v: Value) -> Value:
    """A loop-invariant operand as work moved out of the loop reads it: one product over all steps
    reads a transposed view as fast as the contiguous copy hoisting made for the body's GEMMs."""
    return v.node.inputs[0] if v.node is not None and v.node.op is shp.contiguous else v


def _push_sequence_work(node: Node, inputs: List[Value]) -> Optional[List[Value]]:
    """Rebuild ``node`` with the body's per-step work that reads no carry done over all steps first:
    matmul(sequence slice, non-sequence), elementwise nodes and every op that says how it runs over
    steps (``@op.over_steps``), over such values."""
    a = node.attrs
    body: Graph = a["body"]
    S, C = a["n_seqs"], a["n_carry"]
    seqlike = {id(v): o for v, o in zip(body.inputs[:S], inputs[:S])}      # body value -> (T, ...) value
    invariant = {id(v): o for v, o in zip(body.inputs[S + C:], inputs[S + C:])}

    def outer(v: Value) -> Value:
        return v if v.kind == CONST else seqlike.get(id(v)) or _outside(invariant[id(v)])

    pushed: List[Node] = []
    over: Dict[int, dict] = {}
    for n in body.nodes:
        attrs = _attrs_over_steps(n, seqlike, invariant)
        if attrs is None:
            continue
        seqlike[id(n.outputs[0])] = n.outputs[0]   # a candidate; built below if its value is needed
        over[id(n)] = attrs
        pushed.append(n)
    # only work whose value is read goes out: a product that only gives a gradient its shape (the
    # "like" operand of sum_to_like) stays in the body, where specialization removes it -- unless the
    # reader goes out too (outside, a "like" operand must exist; specialization drops it there alike)
    candidate = {id(n) for n in pushed}
    wanted = {id(v) for v in body.outputs}
    for n in reversed(body.nodes):
        if any(id(o) in wanted for o in n.outputs):
            wanted.update(id(v) for k, v in enumerate(n.inputs) if id(n) in candidate or not n.op.reads_only_shape(k))
    pushed = [n for n in pushed if id(n.outputs[0]) in wanted]
    if not pushed:
        return None
    for n in pushed:
        seqlike[id(n.outputs[0])] = clone_node(n, [outer(v) for v in n.inputs], over[id(n)])[0]
    # the pushed values that the rest of the body (or its outputs) still reads become new sequences
    done = {id(n) for n in pushed}
    read = {id(v) for n in body.nodes if id(n) not in done for v in n.inputs} | {id(v) for v in body.outputs}
    entering = [n.outputs[0] for n in pushed if id(n.outputs[0]) in read]
    new_in = [input_value(v.type, f"pushed{i}") for i, v in enumerate(entering)]
    body_outs = rebuild(list(body.outputs), {id(v): n for v, n in zip(entering, new_in)})
    new_body = Graph(list(body.inputs[:S]) + new_in + list(body.inputs[S:]), body_outs, name=body.name)
    attrs = dict(a, body=new_body, n_seqs=S + len(new_in))
    return list(clone_node(node, list(inputs[:S]) + [seqlike[id(v)] for v in entering] + list(inputs[S:]), attrs))


# --------------------------------------------------------------------------- accumulators

def _accumulated_term(body: Graph, k: int, S: int, uses: Dict[int, List[Node]]) -> Optional[Value]:
    """The per-step term of carry k when the carry is only ``c + term``, else None."""
    c_in, c_out = body.inputs[S + k], body.outputs[k]
    add = c_out.node
    if add is None or add.op.name != "add" or len(uses.get(id(c_in), ())) != 1:   # the pattern: c + term
        return None
    if any(o is c_in for o in body.outputs) or uses.get(id(c_out)) or \
            sum(1 for o in body.outputs if o is c_out) != 1:
        return None
    lhs, rhs = add.inputs
    term = rhs if lhs is c_in else lhs if rhs is c_in else None
    if term is None or term is c_in or tuple(term.shape) != tuple(c_in.shape) or term.dtype is not c_in.dtype:
        return None
    return term


class _Term(NamedTuple):
    """How a carry's per-step term is summed outside: a gram product Aᵀ B of the stacked factors
    (a, b), or the sum over steps of stacked v; then, with ``like``, reduced by sum_to_like."""
    kind: str                       # "gram" or "sum"
    factors: Tuple[Value, ...]      # (a, b) or (v,)
    like: Optional[Value]           # the sum_to_like target (invariant), or None


def _term_factors(term: Value, invariant: Dict[int, Value]) -> Optional[_Term]:
    """The summable form of a per-step term: matmul(transpose(a), b), optionally inside
    sum_to_like(·, p) with p loop-invariant (how autodiff reduces to a broadcast operand's shape),
    sum_to_like(v, p) (bias gradients), or a plain vector v."""
    like = None
    n = term.node
    # the patterns, as autodiff writes a loop body's weight gradients (see the docstring)
    if n is not None and n.op.name == "sum_to_like":
        v, p = n.inputs
        if not (p.kind == CONST or id(p) in invariant):
            return None
        term, like, n = v, p, v.node
    if n is not None and n.op.name == "matmul":
        at, b = n.inputs
        t = at.node
        if t is not None and t.op.name == "transpose" and tuple(t.attrs["perm"] or (1, 0)) == (1, 0):
            a = t.inputs[0]
            if a.ndim == 2 and b.ndim == 2:
                return _Term("gram", (a, b), like)
    # a plain per-step vector (a bias gradient whose shapes autodiff knew agree) sums after the loop
    # too; a matrix term is left a carry, whose stack of T matrices could be large
    if (like is None and term.ndim <= 1) or (like is not None and like.ndim <= term.ndim):
        return _Term("sum", (term,), like)
    return None


def _started_from(init: Value, total: Value) -> Value:
    """``init + total``; a sum started from zeros (a gradient's) is the total itself, broadcast to the
    zeros' shape (per-signature specialization finds that an identity): no zeros made and added."""
    n = init.node
    if n is None or n.op.fill != 0.0 or init.dtype is not total.dtype or init.ndim < total.ndim:
        return ew.add(init, total)
    if tuple(init.shape) == tuple(total.shape) and None not in init.shape:
        return total
    if len(n.inputs) == 1 and n.op.reads_only_shape(0) and tuple(n.inputs[0].shape) == tuple(init.shape):
        return shp.broadcast_like(total, n.inputs[0])
    return ew.add(init, total)


def _push_accumulators(node: Node, inputs: List[Value]) -> Optional[Tuple[List[Value], Node]]:
    """Rebuild ``node`` with summing carries turned into stacked factors and one product after the loop:
    the values for its outputs, and the new scan node."""
    a = node.attrs
    body: Graph = a["body"]
    S, C = a["n_seqs"], a["n_carry"]
    if a["stacked"] is None:
        return None
    stacked = list(a["stacked"])
    invariant = {id(v): o for v, o in zip(body.inputs[S + C:], inputs[S + C:])}
    uses = body.consumers()
    pushed: Dict[int, _Term] = {}
    for k in range(a["reset_carries"], C):   # carries reset after a truncated loop are not plain sums
        if k in stacked:
            continue
        term = _accumulated_term(body, k, S, uses)
        factors = _term_factors(term, invariant) if term is not None else None
        if factors is not None:
            pushed[k] = factors
    if not pushed:
        return None
    keep = [k for k in range(C) if k not in pushed]
    has_until = a["has_until"]
    n_ys = len(body.outputs) - C - (1 if has_until else 0)
    # A gram factor that is a sequence slice is read from the sequence itself, paired with its
    # partner's stack (zero where a step did not run; reversed first if the loop walks backwards
    # and stacks in iteration order); its partner must be stacked, and nothing is read from
    # sequences after an early stop (rows would not align).
    seq_inputs = {id(v): o for v, o in zip(body.inputs[:S], inputs[:S])}
    seq_outer: Dict[int, Value] = {}
    new_ys: List[Value] = []   # each factor stacked once, however many terms share it (BPTT's dz_t)

    def stack(f: Value) -> None:
        if all(f is not y for y in new_ys):
            new_ys.append(f)
    # a summed term that is a sequence slice is summed over the sequence's rows of the steps run
    # (its first rows: no truncate, no early stop), counted along another stack of the loop
    others = bool(stacked) or n_ys > 0 or any(
        kind != "sum" or id(factors[0]) not in seq_inputs for kind, factors, _ in pushed.values())
    summed_seqs = others and not has_until and a["truncate"] < 0
    for k in sorted(pushed):
        kind, factors, _ = pushed[k]
        if kind == "sum" and summed_seqs and id(factors[0]) in seq_inputs:
            seq_outer[id(factors[0])] = seq_inputs[id(factors[0])]
        elif kind == "gram" and not has_until and id(factors[0]) in seq_inputs and id(factors[1]) not in seq_inputs:
            seq_outer[id(factors[0])] = seq_inputs[id(factors[0])]
            stack(factors[1])
        elif kind == "gram" and not has_until and id(factors[1]) in seq_inputs:
            seq_outer[id(factors[1])] = seq_inputs[id(factors[1])]
            stack(factors[0])
        else:
            for f in factors:
                stack(f)
    body_outs = [body.outputs[k] for k in keep] + list(body.outputs[C:C + n_ys]) + new_ys
    if has_until:
        body_outs.append(body.outputs[-1])
    body_ins = list(body.inputs[:S]) + [body.inputs[S + k] for k in keep] + list(body.inputs[S + C:])
    new_body = Graph(body_ins, body_outs, name=body.name)
    renumber = {k: i for i, k in enumerate(keep)}
    attrs = dict(a, body=new_body, n_carry=len(keep), stacked=tuple(renumber[k] for k in stacked))
    inits = inputs[S:S + C]
    new_inputs = list(inputs[:S]) + [inits[k] for k in keep] + list(inputs[S + C:])
    outs = clone_node(node, new_inputs, attrs)
    finals = outs[:len(keep)]
    rest = outs[len(keep):]
    old_ys_end = len(stacked) + n_ys
    stack_of = {id(f): st for f, st in zip(new_ys, rest[old_ys_end:])}
    reversed_stacks: Dict[int, Value] = {}

    def aligned(f: Value, partner: Value) -> Tuple[Value, Value]:
        """(factor over all steps, partner stack) with rows of the same step together."""
        if id(f) not in seq_outer or id(f) in stack_of:
            return stack_of[id(f)], stack_of[id(partner)]
        st = stack_of[id(partner)]
        if a["go_backwards"] and not a["seq_order"]:   # row t is the step that read sequence row steps - 1 - t
            st = reversed_stacks.setdefault(id(st), scan_plumbing.reverse(st))
        return scan_plumbing.steps_like(seq_outer[id(f)], st), st
    mapping: List[Value] = []
    it_final = iter(finals)
    for k in range(C):
        if k not in pushed:
            mapping.append(next(it_final))
            continue
        kind, factors, like = pushed[k]
        if kind == "gram":
            if id(factors[1]) in seq_outer and id(factors[1]) not in stack_of:
                B, A = aligned(factors[1], factors[0])
            else:
                A, B = aligned(factors[0], factors[1])
            # (T, N, m) -> (T·N, m): steps and rows together, whatever is known statically
            flat_a = shp.flatten(A, axis=0, end_axis=1)
            flat_b = shp.flatten(B, axis=0, end_axis=1)
            total = linalg.matmul(shp.transpose(flat_a, perm=(1, 0)), flat_b)
        elif id(factors[0]) in stack_of:
            total = reduce.sum(stack_of[id(factors[0])], axis=(0,))
        else:   # a sequence, over the steps some stack of this loop counts
            total = reduce.sum(scan_plumbing.steps_like(seq_outer[id(factors[0])], rest[0]), axis=(0,))
        if like is not None:
            total = reduce.sum_to_like(total, like if like.kind == CONST else invariant[id(like)])
        mapping.append(_started_from(inits[k], total))
    return mapping + list(rest[:old_ys_end]), outs[0].node


# --------------------------------------------------------------------------- per-step outputs

def _push_step_outputs(node: Node, inputs: List[Value]) -> Optional[List[Value]]:
    """Rebuild ``node`` with per-step outputs that need no carry but the stacked ones computed after
    the loop, over the stacks: ``softmax(h_t W + b)`` of an Elman RNN's stacked hidden state, BPTT's
    ``dz_t Wᵀ`` of a stacked ``dz_t``."""
    a = node.attrs
    if a["has_until"] or a["truncate"] >= 0:
        return None   # unrun steps leave zero rows in the stacks, which would not read as zero outputs
    body: Graph = a["body"]
    S, C = a["n_seqs"], a["n_carry"]
    stacked = list(range(C)) if a["stacked"] is None else list(a["stacked"])
    n_ys = len(body.outputs) - C
    invariant = {id(v): o for v, o in zip(body.inputs[S + C:], inputs[S + C:])}
    # body values whose every step is at hand after the loop: stacked carries, per-step outputs and
    # sequences, unless a backwards loop stacks in iteration order (row t read sequence row T - 1 - t)
    seqs = [] if a["go_backwards"] and not a["seq_order"] else list(body.inputs[:S])
    after: Dict[int, Value] = {id(v): v for v in seqs}
    after.update((id(body.outputs[k]), body.outputs[k]) for k in stacked)
    after.update((id(v), v) for v in body.outputs[C:])
    # a value whose expand_dims is stacked is at hand too, squeezed back out of the stack (BPTT
    # stacks dz_t as a row for a gram product; dz_t Wxᵀ then reads it)
    unstacked: Dict[int, Tuple[Value, tuple]] = {}
    for v in body.outputs[C:]:
        n = v.node
        if n is not None and n.op is shp.expand_dims and n.inputs[0].node is not None and id(n.inputs[0]) not in after:
            unstacked[id(n.inputs[0])] = (v, tuple(n.attrs["axis"]))
            after[id(n.inputs[0])] = n.inputs[0]
    over: Dict[int, dict] = {}
    providers = {id(y.node) for y, _ in unstacked.values()}   # those stay: their stacks are read
    for n in body.nodes:
        attrs = _attrs_over_steps(n, after, invariant) if id(n) not in providers else None
        if attrs is not None:
            over[id(n)] = attrs
            after[id(n.outputs[0])] = n.outputs[0]
    # a node goes out only if nothing left in the body reads it (not a staying node, not a carry),
    # and what it reads is at hand after the loop (no value of a staying node but a stacked one)
    carries = {id(v) for v in body.outputs[:C]}
    given = {id(v) for v in seqs} | {id(body.outputs[k]) for k in stacked} | \
        {id(v) for v in body.outputs[C:]} | set(unstacked)
    uses = body.consumers()
    changed = True
    while changed:
        changed = False
        for n in reversed(body.nodes):
            if id(n) in over and (id(n.outputs[0]) in carries or
                                  any(id(u) not in over for u in uses.get(id(n.outputs[0]), ()))):
                del over[id(n)]
                changed = True
        for n in body.nodes:
            if id(n) in over and any(v.node is not None and id(v) not in given and id(v.node) not in over
                                     for v in n.inputs):
                del over[id(n)]
                changed = True
    # a per-step output that is a sequence slice is that sequence (a copy per step saved)
    seq_ids = {id(v) for v in seqs}
    moved_ys = [j for j, v in enumerate(body.outputs[C:])
                if (v.node is not None and id(v.node) in over) or id(v) in seq_ids]
    if not moved_ys:
        return None
    keep_ys = [j for j in range(n_ys) if j not in moved_ys]
    new_body = Graph(list(body.inputs), list(body.outputs[:C]) + [body.outputs[C + j] for j in keep_ys],
                     name=body.name)
    outs = clone_node(node, inputs, dict(a, body=new_body))
    n_st = len(stacked)
    finals, stacks, ys = outs[:C], outs[C:C + n_st], outs[C + n_st:]
    outer: Dict[int, Value] = {id(body.outputs[k]): st for k, st in zip(stacked, stacks)}
    outer.update((id(body.outputs[C + j]), y) for j, y in zip(keep_ys, ys))
    ref = (list(stacks) + list(ys) + [None])[0]   # a stack with a row per step run
    if ref is None and any(id(v) in seq_ids for v in body.outputs[C:]):
        return None
    if ref is not None:
        for k, v in enumerate(seqs):   # a sequence may be longer than the steps run
            outer[id(v)] = scan_plumbing.steps_like(inputs[k], ref)

    def value(v: Value) -> Optional[Value]:
        if v.kind == CONST or id(v) in outer:
            return outer.get(id(v), v)
        if id(v) in unstacked:
            y, axis = unstacked[id(v)]
            if id(y) not in outer:   # that stack itself moved out
                return None
            outer[id(v)] = shp.squeeze(outer[id(y)], axis=axes_over_steps(axis))
            return outer[id(v)]
        got = invariant.get(id(v))
        return None if got is None else _outside(got)
    for n in body.nodes:
        if id(n) in over:
            ins = [value(v) for v in n.inputs]
            if any(v is None for v in ins):
                return None
            outer[id(n.outputs[0])] = clone_node(n, ins, over[id(n)])[0]
    it = iter(ys)
    new_ys = [outer[id(body.outputs[C + j])] if j in moved_ys else next(it) for j in range(n_ys)]
    return list(finals) + list(stacks) + new_ys


# --------------------------------------------------------------------------- unread inputs

def _drop_unread_inputs(node: Node, inputs: List[Value]) -> Optional[List[Value]]:
    """Rebuild ``node`` without the non-sequences (and, where the step count is given, sequences)
    its body no longer reads once work went out: what computed them (a transposed copy made for
    the body's GEMM) need not run."""
    a = node.attrs
    body: Graph = a["body"]
    S, C = a["n_seqs"], a["n_carry"]
    read = {id(v) for n in body.nodes for k, v in enumerate(n.inputs)} | {id(v) for v in body.outputs}
    steps_given = a["dyn_steps"] or a["n_steps"] is not None
    drop = [k for k, v in enumerate(body.inputs)
            if id(v) not in read and (k >= S + C or (k < S and steps_given))]
    if not drop:
        return None
    keep = [k for k in range(len(body.inputs)) if k not in drop]
    new_body = Graph([body.inputs[k] for k in keep], list(body.outputs), name=body.name)
    tail = list(inputs[len(body.inputs):])   # the step count, when dynamic
    attrs = dict(a, body=new_body, n_seqs=S - sum(1 for k in drop if k < S))
    return list(clone_node(node, [inputs[k] for k in keep] + tail, attrs))


def push_out_loop_work(graph: Graph) -> Graph:
    """Sequence products before each scan, summing carries as one product after it (see module doc)."""
    def rule(node: Node, inputs: List[Value]):
        if node.op.name != "scan":   # the loop this pass is about
            return None
        repl = _push_sequence_work(node, inputs)
        if repl is not None:
            node, inputs = repl[0].node, list(repl[0].node.inputs)
        again = _push_accumulators(node, inputs)
        if again is not None:
            repl, node = again
            inputs = list(node.inputs)
        for step in (_push_step_outputs, _drop_unread_inputs):
            after = step(node, inputs)
            if after is not None:
                # what was built on the scan's outputs (the accumulators' products) reads the new scan's
                repl = after if repl is None else rebuild(repl, {id(o): v for o, v in zip(node.outputs, after)})
                scans = [v.node for v in after if v.node is not None and v.node.op is node.op]
                if not scans:
                    break
                node, inputs = scans[0], list(scans[0].inputs)
        return repl

    return rewrite(graph, rule)
