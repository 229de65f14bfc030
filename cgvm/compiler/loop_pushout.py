"""Push per-step work out of scan loops, where one operation over all steps does the same job.

Two rewrites, both exact up to float summation order:

- Sequence work. ``matmul(x_t, p)`` of a sequence slice and a non-sequence does not need the
  loop: one ``matmul(X, p)`` over the stacked sequence runs before it (one large GEMM instead of
  T small ones) and the body reads the product as a new sequence. Elementwise work on such
  values goes out with it (BPTT's ``1 - tanh²`` of the stacked forward outputs, say).
- Accumulators. A carry that only sums a per-step term, ``c_t = c_{t-1} + term_t``, with
  ``term_t = matmul(transpose(a_t), b_t)`` (the weight gradients of backpropagation through
  time, also when autodiff wrapped them in ``sum_to_like(·, p)``) or a reducing
  ``sum_to_like(v_t, p)`` (bias gradients), stops being a carry: the loop stacks ``a_t, b_t``
  (``v_t``) as per-step outputs (a factor that is a sequence slice is read from the sequence),
  and after it ``c_T = c_0 + Aᵀ B`` with A, B flattened to (T·N, ·): one GEMM instead of T
  GEMMs and T additions. Steps a loop does not run (``truncate``, ``until``) leave zero rows in
  the stacks, which add nothing.

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
from .rewrite import rewrite


# --------------------------------------------------------------------------- sequence work

def _per_step_elementwise(n: Node, seqlike: Dict[int, Value], invariant: Dict[int, Value]) -> bool:
    """An elementwise node over per-step values of one shape and loop-invariant operands that broadcast."""
    if n.op.pattern not in (ELEMWISE, BROADCAST) or n.op.stateful or len(n.outputs) != 1:
        return False
    out = n.outputs[0]
    steps = [v for v in n.inputs if id(v) in seqlike]
    return bool(steps) and all(tuple(v.shape) == tuple(out.shape) for v in steps) and all(
        id(v) in seqlike or ((v.kind == CONST or id(v) in invariant) and v.ndim <= out.ndim) for v in n.inputs)


def _push_sequence_work(node: Node, inputs: List[Value]) -> Optional[List[Value]]:
    """Rebuild ``node`` with the body's per-step work that reads no carry done over all steps first:
    matmul(sequence slice, non-sequence) and elementwise nodes over such values."""
    a = node.attrs
    body: Graph = a["body"]
    S, C = a["n_seqs"], a["n_carry"]
    seqlike = {id(v): o for v, o in zip(body.inputs[:S], inputs[:S])}      # body value -> (T, ...) value
    invariant = {id(v): o for v, o in zip(body.inputs[S + C:], inputs[S + C:])}

    def outer(v: Value) -> Value:
        return v if v.kind == CONST else seqlike.get(id(v)) or invariant[id(v)]

    pushed: List[Node] = []
    for n in body.nodes:
        if n.op.name == "matmul":   # the pattern: a per-step product with a loop-invariant matrix
            x, p = n.inputs
            if not (id(x) in seqlike and x.ndim == 2 and p.ndim == 2 and (p.kind == CONST or id(p) in invariant)):
                continue
        elif not _per_step_elementwise(n, seqlike, invariant):
            continue
        seqlike[id(n.outputs[0])] = n.outputs[0]   # a candidate; built below if its value is needed
        pushed.append(n)
    # only work whose value is read goes out: a product that only gives a gradient its shape (the
    # "like" operand of sum_to_like) stays in the body, where specialization removes it
    wanted = {id(v) for v in body.outputs}
    for n in reversed(body.nodes):
        if any(id(o) in wanted for o in n.outputs):
            wanted.update(id(v) for k, v in enumerate(n.inputs) if not n.op.reads_only_shape(k))
    pushed = [n for n in pushed if id(n.outputs[0]) in wanted]
    if not pushed:
        return None
    for n in pushed:
        seqlike[id(n.outputs[0])] = clone_node(n, [outer(v) for v in n.inputs])[0]
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
    or sum_to_like(v, p) that really reduces (p has fewer axes than v: bias gradients)."""
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
    if like is not None and like.ndim < term.ndim:
        return _Term("sum", (term,), like)
    return None


def _push_accumulators(node: Node, inputs: List[Value]) -> Optional[List[Value]]:
    """Rebuild ``node`` with summing carries turned into stacked factors and one product after the loop."""
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
    for k in sorted(pushed):
        kind, factors, _ = pushed[k]
        if kind == "gram" and not has_until and id(factors[0]) in seq_inputs and id(factors[1]) not in seq_inputs:
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
        else:
            total = reduce.sum(stack_of[id(factors[0])], axis=(0,))
        if like is not None:
            total = reduce.sum_to_like(total, like if like.kind == CONST else invariant[id(like)])
        mapping.append(ew.add(inits[k], total))
    return mapping + list(rest[:old_ys_end])


def push_out_loop_work(graph: Graph) -> Graph:
    """Sequence products before each scan, summing carries as one product after it (see module doc)."""
    def rule(node: Node, inputs: List[Value]):
        if node.op.name != "scan":   # the loop this pass is about
            return None
        repl = _push_sequence_work(node, inputs)
        if repl is not None:
            node, inputs = repl[0].node, list(repl[0].node.inputs)
        again = _push_accumulators(node, inputs)
        return again if again is not None else repl

    return rewrite(graph, rule)
