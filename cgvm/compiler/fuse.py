"""Fusion: elementwise chains become one ``fused_elementwise`` node; GEMM/conv + bias + activation one op.

Elementwise chains (NNVM's kElemWise/kBroadcast grouping). Walking the graph from its end, each
fusible node not yet taken roots a chain; the chain grows upward through one producer at a time
(the "spine") while that producer is fusible, has the root's dtype and static shape, is read by
the chain alone and is not a graph output. A node read twice is materialized, as in NNVM, so no
work is ever duplicated. The chain's other operands become the fused node's inputs; 0-d
constants become literals in its program. Because each step reads the previous step's result
and at most leaf inputs, the chain runs in one buffer (see ``cgvm.ops.fused``). Runs of
multiplications and additions by literals are folded to one multiply and one add (fast-math
style reassociation, float only; see ``_fold_affine`` for when it is refused).

Epilogues (NNVM's kOutEWiseFusable master + elementwise): ``add(matmul(a, b), bias)`` and a
following relu/tanh/sigmoid become ``gemm_bias_act``; ``gemm(a, b, c)`` + activation too; and
``conv`` + activation becomes ``conv_bias_act`` (a bias add after a conv is folded into the
conv's own bias earlier, by ``simplify``). The master's output must have no other reader.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..ir.builder import apply
from ..ir.graph import CONST, Graph, Node, Value
from ..ir.types import DType
from ..ops import fused as F
from ..ops.rules import broadcast_shapes
from .rewrite import rewrite

Steps = List[Tuple[str, tuple]]   # operands: node input positions, F.ACC or literals


# --------------------------------------------------------------------------- lowering ops to ufunc steps

def lower(node: Node) -> Optional[Steps]:
    """The node as ufunc steps over its input positions (None: not fusible).

    Only a lowering's first step reads the node's inputs; later steps read ``acc``, so the
    lowering is correct when its input is the chain's accumulator.
    """
    if len(node.outputs) != 1 or node.outputs[0].dtype.name not in F.FUSIBLE_DTYPES:
        # storage formats (bfloat16, float8, int4 ... from ml_dtypes) run op by op, each result rounded
        # to the format as the IR interpreter does; fused programs have no literals of them either
        return None
    return node.op.elementwise_steps(node)   # its ufunc, or its own @op.lowering (relu, sigmoid, clip ...)


# --------------------------------------------------------------------------- chain discovery

def _find_chains(graph: Graph) -> List[Tuple[List[Node], Dict[int, Optional[Steps]]]]:
    """Maximal spines (first node ... root) with the nodes' lowerings, found from the graph's end;
    every node is in at most one."""
    consumers = graph.consumers()
    leaves = {id(v) for v in graph.outputs} | {id(v) for v in graph.inputs}   # values that must stay values
    lowered: Dict[int, Optional[Steps]] = {}

    def steps_of(n: Node) -> Optional[Steps]:
        key = id(n)
        if key not in lowered:
            lowered[key] = lower(n)
        return lowered[key]

    taken: set = set()
    chains = []
    for root in reversed(graph.nodes):
        if id(root) in taken or steps_of(root) is None:
            continue
        out = root.outputs[0]
        chain = [root]
        cur = root
        while True:
            nxt = None
            for v in cur.inputs:
                p = v.node
                if (p is None or id(p) in taken or id(v) in leaves or v.dtype is not out.dtype
                        or v.shape != out.shape or any(u is not cur for u in consumers.get(id(v), ()))
                        or steps_of(p) is None):
                    continue
                nxt = p
                break
            if nxt is None:
                break
            chain.append(nxt)
            taken.add(id(nxt))
            cur = nxt
        taken.add(id(root))
        if len(chain) > 1:
            chain.reverse()
            chains.append((chain, lowered))
    return chains


# --------------------------------------------------------------------------- programs

def _inlinable(v: Value, node: Node) -> bool:
    """A one-element constant that does not set the rank of ``node``'s result becomes a literal."""
    if v.kind != CONST or v.data.size != 1:
        return False
    return v.ndim == 0 or any(u.kind != CONST and u.ndim >= v.ndim for u in node.inputs)


def _build_program(chain: Sequence[Node], lowered: Dict[int, Optional[Steps]]) -> Tuple[list, List[Value]]:
    """(steps over value operands, leaf values): operands are Values, F.ACC or literals."""
    steps = []
    for i, node in enumerate(chain):
        spine = chain[i - 1].outputs[0] if i else None
        for name, operands in lowered[id(node)]:
            ops = []
            for r in operands:
                if r == F.ACC or F.is_literal(r):
                    ops.append(r)
                    continue
                v = node.inputs[r]
                if v is spine:
                    ops.append(F.ACC)
                elif _inlinable(v, node):
                    ops.append((F.LIT, v.data.item(), v.dtype.name))
                else:
                    ops.append(v)
            steps.append((name, ops))
    return steps


def _first_exclusive(steps: list) -> Optional[Value]:
    """A value the first step reads that no later step reads (it may share the output buffer)."""
    later = {id(r) for _, ops in steps[1:] for r in ops if isinstance(r, Value)}
    return next((r for r in steps[0][1] if isinstance(r, Value) and id(r) not in later), None)


def _provably_within(inner: Sequence, outer: Sequence) -> bool:
    """Whether a shape ``inner`` surely broadcasts into ``outer`` without growing it."""
    return len(inner) <= len(outer) and all(a == 1 or (a is not None and a == b)
                                            for a, b in zip(inner[::-1], outer[::-1]))


def _shape_from_first(steps: list, out_shape: Sequence) -> bool:
    """Whether the first step's result surely has the output's shape (then it allocates the output)."""
    if not out_shape:
        return False
    first = [r.shape for r in steps[0][1] if isinstance(r, Value)]
    if not first:
        return False
    shape = broadcast_shapes(*first)
    if len(shape) != len(out_shape):
        return False
    return all(_provably_within(r.shape, shape) for _, ops in steps[1:] for r in ops if isinstance(r, Value))


# --------------------------------------------------------------------------- folding multiply/add runs

_AFFINE = ("add", "subtract", "multiply", "divide")
_FLOATS = ("float16", "float32", "float64")


def _affine_of(name: str, ops: list) -> Optional[Tuple[float, float]]:
    """(m, c) if the step is acc -> m * acc + c with literal m, c; else None."""
    if len(ops) == 1:
        return (-1.0, 0.0) if name == "negative" and ops[0] == F.ACC else None
    if name not in _AFFINE or len(ops) != 2:
        return None
    acc_first = ops[0] == F.ACC
    k = ops[1] if acc_first else ops[0]
    if not (acc_first or ops[1] == F.ACC) or not isinstance(k, tuple) or k[2] not in _FLOATS:
        return None
    k = float(k[1])
    if name == "add":
        return (1.0, k)
    if name == "subtract":
        return (1.0, -k) if acc_first else (-1.0, k)
    if name == "multiply":
        return (k, 0.0)
    if name == "divide" and acc_first and k != 0.0:
        return (1.0 / k, 0.0)
    return None


def _fold_affine(steps: list, dtype: DType) -> list:
    """Runs of acc*m + c steps (literal m, c) become one multiply and one add.

    Reassociation changes rounding (a few ulps, as fused hardware kernels do). It is refused
    where it would change more than that: when summing the constants cancels (so
    ``(x + 2**23) - 2**23``, the round-to-integer trick, keeps its meaning), and for
    non-finite or zero multipliers.
    """
    if not dtype.is_float:
        return steps
    out: list = []
    i = 0
    while i < len(steps):
        run = []
        j = i
        while j < len(steps):
            affine = _affine_of(*steps[j])
            if affine is None:
                break
            run.append(affine)
            j += 1
        if not run:
            out.append(steps[i])
            i += 1
            continue
        folded = _compose(run)
        if folded is not None and (folded[0] != 1.0) + (folded[1] != 0.0) < len(run):
            m, c = folded
            if m != 1.0:
                out.append(("multiply", [F.ACC, F.lit(m, dtype)]))
            if c != 0.0:
                out.append(("add", [F.ACC, F.lit(c, dtype)]))
        else:
            out.extend(steps[i:j])
        i = j
    return out


def _compose(run: Sequence[Tuple[float, float]]) -> Optional[Tuple[float, float]]:
    m, c = 1.0, 0.0
    for mk, ck in run:
        if mk == 0.0 or not math.isfinite(mk) or not math.isfinite(ck):
            return None
        m, c = m * mk, c * mk
        total = c + ck
        if abs(total) < 0.5 * max(abs(c), abs(ck)):  # the constants cancel: keep the steps as written
            return None
        c = total
    return (m, c) if math.isfinite(m) and math.isfinite(c) else None


# --------------------------------------------------------------------------- the passes

def fused_source(nodes: Sequence[Node]) -> Optional[str]:
    """Where a fused node's ops were written: the one place, or each op with its place, so that an
    error inside the fused kernel still points at the user's lines."""
    places = [n.source for n in nodes if n.source]
    if len(set(places)) <= 1:
        return places[-1] if places else None
    return "a fused chain of " + ", ".join(f"{n.op.name} ({n.source})" if n.source else n.op.name for n in nodes)


def _fused_node(chain: Sequence[Node], lowered, rebuilt: Callable[[Value], Value]) -> Optional[Value]:
    """The fused node for ``chain`` over the rewritten graph's values, or None if it is not worth one."""
    while len(chain) > 1:
        steps = _build_program(chain, lowered)
        first = _first_exclusive(steps)
        if first is not None:
            break
        chain = chain[1:]  # no input of the first node may die in the output buffer: leave that node out
    else:
        return None
    root = chain[-1]
    out = root.outputs[0]
    steps = _fold_affine(steps, out.dtype)
    order: List[Value] = [first]
    index = {id(first): 0}
    for _, ops in steps:
        for r in ops:
            if isinstance(r, Value) and id(r) not in index:
                index[id(r)] = len(order)
                order.append(r)
    program = tuple((name, tuple(index[id(r)] if isinstance(r, Value) else r for r in ops)) for name, ops in steps)
    attrs = {"program": program, "dtype": out.dtype, "shape_from_first": _shape_from_first(steps, out.shape)}
    return apply(F.fused_elementwise, [rebuilt(v) for v in order], attrs, name=root.name,
                 source=fused_source(chain))


def fuse_elementwise(graph: Graph) -> Graph:
    """Replace each chain of two or more fusible elementwise nodes by one fused_elementwise node."""
    chains = _find_chains(graph)
    if not chains:
        return graph
    root_chain = {id(chain[-1]): (chain, lowered) for chain, lowered in chains}

    def rule(node, inputs, rebuilt):
        hit = root_chain.get(id(node))
        if hit is None:
            return None
        fused = _fused_node(hit[0], hit[1], rebuilt)
        return None if fused is None else [fused]

    return rewrite(graph, rule, lookup=True)


def _activation(node: Node) -> Optional[str]:
    """The activation an epilogue can apply for ``node`` (the op's ``activation=``), or None."""
    return node.op.activation_of(node) if len(node.inputs) == 1 else None


class _Epilogue(NamedTuple):
    master: Node            # an op with an epilogue (@op.epilogue_into: matmul, gemm, conv)
    bias: Optional[Value]   # the bias added after the master, where its epilogue takes one
    act: str                # "none" or the activation applied last
    last: Node              # the node whose output the fused op replaces
    inner: Tuple[Value, ...]  # values the fused op swallows (same shape and dtype as its result)


def _plan_epilogues(graph: Graph) -> List[_Epilogue]:
    """Master + bias + activation groups whose intermediates nobody else reads (shape-only readers
    that run after the group may read the fused result instead)."""
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    leaves = {id(v) for v in graph.inputs} | {id(v) for v in graph.outputs}
    readers: Dict[int, List[Tuple[Node, int]]] = {}
    for n in graph.nodes:
        for k, v in enumerate(n.inputs):
            readers.setdefault(id(v), []).append((n, k))

    def next_reader(v: Value) -> Optional[Node]:
        """The one reader of ``v`` that needs its values, if ``v`` is a swallowable intermediate."""
        if id(v) in leaves:
            return None
        real = [n for n, k in readers.get(id(v), ()) if not n.op.reads_only_shape(k)]
        return real[0] if len(real) == 1 and real[0].inputs.count(v) == 1 else None

    def shape_readers_after(values: Sequence[Value], last: Node) -> bool:
        return all(order[id(n)] > order[id(last)] for v in values for n, k in readers.get(id(v), ())
                   if n.op.reads_only_shape(k))

    groups = []
    for master in graph.nodes:
        epilogue = master.op.epilogue
        if epilogue is None or len(master.outputs) != 1:
            continue
        y = master.outputs[0]
        inner: List[Value] = []
        bias = None
        last = master
        reader = next_reader(y)
        if epilogue.bias_after is not None:
            if reader is None or reader.op is not epilogue.bias_after or y.ndim == 0:
                continue
            bias = reader.inputs[1] if reader.inputs[0] is y else reader.inputs[0]
            z = reader.outputs[0]
            if z.dtype is not y.dtype or z.shape != y.shape or not _provably_within(bias.shape, y.shape):
                continue
            inner.append(y)
            last, y = reader, z
            reader = next_reader(y)
        act = "none"
        if reader is not None and _activation(reader) is not None and reader.outputs[0].dtype is y.dtype:
            act = _activation(reader)
            inner.append(y)
            last = reader
        if last is master or not shape_readers_after(inner, last) or epilogue.attrs(master, act) is None:
            continue
        groups.append(_Epilogue(master, bias, act, last, tuple(inner)))
    return groups


def _fused_epilogue(group: _Epilogue, rebuilt: Callable[[Value], Value]) -> Value:
    master = group.master
    args = [rebuilt(v) for v in master.inputs]
    swallowed = [master] + [v.node for v in group.inner[1:]] + [group.last]
    epilogue = master.op.epilogue
    if group.bias is not None:
        args.append(rebuilt(group.bias))
    return apply(epilogue.fused, args, epilogue.attrs(master, group.act), name=group.last.name,
                 source=fused_source(swallowed))


def fuse_epilogues(graph: Graph) -> Graph:
    """matmul + bias (+ activation) -> gemm_bias_act; gemm + activation, conv + activation likewise."""
    if not any(n.op.epilogue is not None for n in graph.nodes):
        return graph
    groups = {id(g.last): g for g in _plan_epilogues(graph)}
    if not groups:
        return graph
    swallowed = {id(v): id(g.last) for g in groups.values() for v in g.inner}
    results: Dict[int, Value] = {}   # id(group's last node) -> the fused value

    def rule(node, inputs, rebuilt):
        for k, old in enumerate(node.inputs):
            if id(old) in swallowed and node.op.reads_only_shape(k):
                inputs[k] = results[swallowed[id(old)]]
        group = groups.get(id(node))
        if group is None:
            return None
        fused = results[id(node)] = _fused_epilogue(group, rebuilt)
        return [fused]

    return rewrite(graph, rule, lookup=True)
