"""Recomputation for sublinear training memory (Chen et al. 2016, "Training Deep Nets with Sublinear
Memory Cost"), as a graph transformation after the pass pipeline.

A training graph computes the forward pass, then the backward pass, which reads forward
activations again. Planned as it is, every activation the backward reads lives from its forward
computation to its last backward use: memory linear in depth. Here the forward activations the
backward reads are split into segments at cut points; only the segment boundaries (checkpoints)
stay alive, and the other activations are *dropped*: each backward reader gets a duplicate of the
forward nodes that made the value, rebuilt from the nearest kept values and placed right before
the first backward use (NNVM's "mirror" nodes). The originals then die at the end of their forward
use and the planner reuses their buffers; one segment's duplicates are alive at a time.

``strategy="sqrt"`` chooses the checkpoints greedily under a byte budget (Chen et al.'s Alg. 3)
and searches the budget for the smallest estimated peak: while the backward pass works through
segment j, the checkpoints of segments 1..j and segment j's recomputed activations are alive, so
later segments get shorter. The last segment is kept as it is (it is still alive when the
backward pass starts). A list of values drops exactly those values instead.

The forward/backward split is found from the gradient seed that ``cgvm.grad`` plants
(``ones_like`` of the scalar cost): nodes scheduled before the first seed are forward. Pass
``seeds`` to name the seed values when a graph was built another way.

It is the last graph pass of the pipeline, ``recompute`` (cgvm.compiler.passes), run when a
compilation asks for it (``run_passes(graph, recompute=...)``, ``cgvm.compile(..., recompute=...)``,
``cgvm compile --recompute sqrt``): the duplicates have the same op, inputs and attributes as the
originals, so CSE would merge them back, and fusion would hide the values a list names. Stateful
nodes (random draws, dropout masks) are never duplicated: their outputs stay alive instead.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

from ..errors import InputError
from ..ir.builder import apply
from ..ir.graph import CONST, INPUT, PARAM, Graph, Node, Value, toposort
from .schedule import is_gradient_seed

#: ``strategy`` values accepted besides an explicit list of values to drop
STRATEGIES = ("sqrt",)

#: activations smaller than this fraction of the median candidate are kept (recomputing them saves nothing)
SMALL_FRACTION = 1 / 32

#: budgets tried by the sqrt search (geometric grid between the largest activation and the total)
BUDGET_STEPS = 64

Strategy = Union[str, Sequence[Value]]


@dataclass
class RecomputePlan:
    """What the pass decided, for reports: checkpoints kept, values dropped, nodes duplicated."""

    strategy: str
    original: Graph                                   # the graph before the transformation
    graph: Graph                                      # the graph after it
    checkpoints: List[Value] = field(default_factory=list)
    dropped: List[Value] = field(default_factory=list)
    duplicated_nodes: int = 0
    estimated_peak_bytes: int = 0                     # sqrt: the budget search's estimate of kept activations
    estimated_kept_bytes: int = 0                     # the same without recomputation

    def summary(self) -> str:
        return (f"recompute ({self.strategy}): {len(self.checkpoints)} checkpoints, {len(self.dropped)} "
                f"activations dropped, {self.duplicated_nodes} nodes duplicated in backward")


def recompute(graph: Graph, strategy: Strategy = "sqrt", *, seeds: Optional[Iterable[Value]] = None) -> Graph:
    """``graph`` with dropped forward activations recomputed in backward (see the module docstring)."""
    return plan_recompute(graph, strategy, seeds=seeds).graph


class Recomputation:
    """The ``recompute`` pass of one compilation: what to drop and, once the pass has run, what it
    decided (``plan``, a RecomputePlan).

    ``run_passes(graph, recompute=strategy)`` makes one; pass your own to read its plan. Values
    to drop, named in the source graph, ride through the earlier passes as extra outputs
    (``anchor``, before the pipeline): passes that merge, fuse or rebuild nodes then say which
    value of the optimized graph each became, and none of them is fused away. The pass removes
    the extra outputs again before it drops anything.
    """

    def __init__(self, strategy: Strategy):
        self.strategy = strategy
        self.plan: Optional[RecomputePlan] = None
        self._n_outputs: Optional[int] = None   # the graph's own outputs, when values to drop were anchored

    def anchor(self, graph: Graph) -> Graph:
        """``graph`` with the values to drop as extra outputs (unchanged for a strategy name)."""
        if isinstance(self.strategy, str):
            return graph
        self._n_outputs = len(graph.outputs)
        return Graph(graph.inputs, list(graph.outputs) + list(self.strategy), name=graph.name)

    def __call__(self, graph: Graph) -> Graph:
        """The pass: the optimized ``graph``, anchors removed, with its dropped activations recomputed."""
        n = self._n_outputs
        if n is None:
            self.plan = plan_recompute(graph, self.strategy)
            return self.plan.graph
        found = list(graph.outputs[n:])
        needed = {id(node) for node in toposort(graph.outputs[:n])}   # kept in the passes' order
        trimmed = Graph(graph.inputs, graph.outputs[:n], nodes=[m for m in graph.nodes if id(m) in needed],
                        name=graph.name)
        self.plan = plan_recompute(trimmed, found)
        return self.plan.graph


def plan_recompute(graph: Graph, strategy: Strategy = "sqrt", *,
                   seeds: Optional[Iterable[Value]] = None) -> RecomputePlan:
    """Choose the values to drop and rebuild the graph; the plan records both graphs."""
    name = strategy if isinstance(strategy, str) else "explicit"
    if isinstance(strategy, str) and strategy not in STRATEGIES:
        raise ValueError(f"recompute strategy must be one of {STRATEGIES} or a list of values, got {strategy!r}")
    split = _Split(graph, seeds)
    plan = RecomputePlan(name, graph, graph)
    if split.turn is None:   # no backward pass: nothing is read twice
        if not isinstance(strategy, str) and list(strategy):
            raise InputError("recompute: the graph has no gradient seed (ones_like of a scalar cost); pass seeds= "
                             "to say where the backward pass starts")
        return plan
    if isinstance(strategy, str):
        dropped, checkpoints, est, kept = _choose_sqrt(split)
        plan.estimated_peak_bytes, plan.estimated_kept_bytes = est, kept
    else:
        dropped, checkpoints = _resolve_explicit(split, strategy), []
    if not dropped:
        return plan
    plan.graph, plan.duplicated_nodes = _rebuild(split, {id(v) for v in dropped})
    plan.checkpoints, plan.dropped = checkpoints, dropped
    return plan


# ----------------------------------------------------------------------------- analysis


def estimated_bytes(v: Value) -> int:
    """Bytes of ``v`` with unknown dimensions counted as 1 (the batch axis is common to all activations)."""
    n = 1
    for d in v.shape:
        n *= 1 if d is None else d
    return n * v.dtype.itemsize


class _Split:
    """The schedule cut into forward (before the first gradient seed) and backward, with liveness facts."""

    def __init__(self, graph: Graph, seeds: Optional[Iterable[Value]]):
        self.graph = graph
        self.nodes: List[Node] = list(graph.nodes)
        self.pos: Dict[int, int] = {id(n): i for i, n in enumerate(self.nodes)}
        self.outputs: Set[int] = {id(v) for v in graph.outputs}
        self.turn = self._find_turn(seeds)
        if self.turn is None:
            return
        forward = self.nodes[:self.turn]
        self.forward_ids = {id(n) for n in forward}
        # values produced by forward nodes and read by a backward node: alive across the turn
        backward_reads: Set[int] = set()
        for node in self.nodes[self.turn:]:
            backward_reads.update(id(v) for v in node.inputs)
        self.crossing: List[Value] = [o for n in forward for o in n.outputs
                                      if id(o) in backward_reads and id(o) not in self.outputs]

    def _find_turn(self, seeds: Optional[Iterable[Value]]) -> Optional[int]:
        if seeds is not None:
            marks = [self.pos[id(v.node)] for v in seeds if v.node is not None and id(v.node) in self.pos]
        else:
            marks = [i for i, n in enumerate(self.nodes) if is_gradient_seed(n)]
        return min(marks) if marks else None

    def is_leaf(self, v: Value) -> bool:
        return v.node is None or v.kind in (INPUT, PARAM, CONST)

    def is_forward(self, v: Value) -> bool:
        return v.node is not None and id(v.node) in self.forward_ids

    def cut_positions(self) -> Set[int]:
        """Forward positions p such that no value made before p is read by a forward node after p."""
        last_read: Dict[int, int] = {}
        for i, node in enumerate(self.nodes[:self.turn]):
            for v in node.inputs:
                if self.is_forward(v):
                    p = self.pos[id(v.node)]
                    last_read[p] = max(last_read.get(p, p), i)
        cuts, reach = set(), -1
        for p in range(self.turn):
            if reach <= p:
                cuts.add(p)
            reach = max(reach, last_read.get(p, p))
        return cuts


def _view_root(split: _Split, v: Value) -> Value:
    """The forward value whose storage ``v`` aliases (``v`` itself unless made by view ops)."""
    while v.node is not None and v.node.op.view and split.is_forward(v) and v.node.inputs:
        v = v.node.inputs[0]
    return v


def _choose_sqrt(split: _Split) -> Tuple[List[Value], List[Value], int, int]:
    """Checkpoints at cut points under the byte budget with the smallest estimated peak."""
    cuts = split.cut_positions()
    cands: List[Tuple[Value, int, bool]] = []
    for v in split.crossing:
        node = v.node
        if node.op.stateful or node.op.view:
            continue
        cands.append((v, estimated_bytes(v), split.pos[id(node)] in cuts))
    if not cands:
        return [], [], 0, 0
    sizes = sorted(s for _, s, _ in cands)
    small = sizes[len(sizes) // 2] * SMALL_FRACTION
    cands = [c for c in cands if c[1] >= small]
    total = sum(s for _, s, _ in cands)
    best = None
    lo, hi = max(1, max(s for _, s, _ in cands)), max(1, total)
    for k in range(BUDGET_STEPS + 1):
        budget = lo * (hi / lo) ** (k / BUDGET_STEPS)
        peak, checkpoints, last_start = _greedy(cands, budget)
        dropped = last_start - max(0, len(checkpoints) - 1)
        key = (peak, dropped)
        if best is None or key < best[0]:
            best = (key, checkpoints, last_start)
    (peak, _), checkpoints, last_start = best
    ck = {id(v) for v in checkpoints}
    dropped_roots = {id(v) for v, _, _ in cands[:last_start] if id(v) not in ck}
    # views read by the backward follow their storage: dropping one without the other saves nothing
    dropped = [v for v in split.crossing
               if id(v) in dropped_roots or (v.node.op.view and id(_view_root(split, v)) in dropped_roots)]
    return dropped, checkpoints, peak, total


def _greedy(cands: Sequence[Tuple[Value, int, bool]], budget: float) -> Tuple[int, List[Value], int]:
    """One pass of the budgeted split: (estimated peak, checkpoints, index where the last segment starts)."""
    kept = seg = peak = 0
    checkpoints: List[Value] = []
    last_start = 0
    for i, (v, size, cut) in enumerate(cands):
        if cut and seg > 0 and kept + seg + size > budget:
            checkpoints.append(v)
            kept += size
            seg = 0
            last_start = i
        else:
            seg += size
        peak = max(peak, kept + seg)
    return peak, checkpoints, last_start


def _resolve_explicit(split: _Split, values: Sequence[Value]) -> List[Value]:
    """The given values as found in the (optimized) graph; passes may have rebuilt them under the same name."""
    by_id = {id(o): o for n in split.nodes for o in n.outputs}
    named: Dict[Tuple[str, str, int], List[Value]] = {}
    for n in split.nodes:
        if n.name:
            for o in n.outputs:
                named.setdefault((n.name, n.op.name, o.index), []).append(o)
    crossing = {id(v) for v in split.crossing}
    out: List[Value] = []
    for v in values:
        if not isinstance(v, Value):
            raise InputError(f"recompute: expected graph values to drop, got {type(v).__name__}")
        hit = by_id.get(id(v))
        if hit is None and v.node is not None and v.node.name:
            same = named.get((v.node.name, v.node.op.name, v.index), [])
            hit = same[0] if len(same) == 1 else None
        if hit is None:
            raise InputError(f"recompute: {v.label()} ({v.type!r}) is not computed by the compiled graph "
                             "(a pass removed or merged it); name its node to keep track of it")
        if hit.node.op.stateful:
            raise InputError(f"recompute: {v.label()} comes from {hit.node.where()}, which is stateful (random): "
                             "a recomputed copy would differ")
        if id(hit) in split.outputs:
            raise InputError(f"recompute: {v.label()} is an output of the function; it stays alive anyway")
        if id(hit) in crossing and split.is_forward(hit):
            out.append(hit)
    return out


# ----------------------------------------------------------------------------- rebuilding


def _rebuild(split: _Split, dropped: Set[int]) -> Tuple[Graph, int]:
    """Forward nodes unchanged; before each backward node, duplicates of the dropped values it reads."""
    crossing_kept = {id(v) for v in split.crossing if id(v) not in dropped}
    new_nodes: List[Node] = list(split.nodes[:split.turn])
    copies: Dict[int, Value] = {}    # forward value -> its duplicate
    memo: Dict[int, Value] = {}      # backward value -> its rebuilt version
    duplicated = 0

    def alive(v: Value) -> bool:
        """Whether the original ``v`` is still alive in the backward pass (so duplicates read it)."""
        if split.is_leaf(v) or not split.is_forward(v):
            return True
        node = v.node
        return id(v) in split.outputs or id(v) in crossing_kept or node.op.stateful

    def duplicate(v: Value) -> Value:
        nonlocal duplicated
        stack = [v]
        while stack:
            top = stack[-1]
            if id(top) in copies:
                stack.pop()
                continue
            missing = [u for u in top.node.inputs if not alive(u) and id(u) not in copies]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            node = top.node
            inputs = [u if alive(u) else copies[id(u)] for u in node.inputs]
            outs = apply(node.op, inputs, dict(node.attrs), name=f"{node.name or node.op.name}/recompute",
                         source=node.source)
            outs = outs if isinstance(outs, tuple) else (outs,)
            for old, new in zip(node.outputs, outs):
                copies[id(old)] = new
            new_nodes.append(outs[0].node)
            duplicated += 1
        return copies[id(v)]

    for node in split.nodes[split.turn:]:
        inputs = []
        for v in node.inputs:
            if id(v) in memo:
                inputs.append(memo[id(v)])
            elif split.is_forward(v) and not alive(v):
                inputs.append(duplicate(v))
            else:
                inputs.append(v)
        if all(a is b for a, b in zip(inputs, node.inputs)):
            new_nodes.append(node)
            continue
        outs = apply(node.op, inputs, dict(node.attrs), name=node.name, source=node.source)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for old, new in zip(node.outputs, outs):
            memo[id(old)] = new
        new_nodes.append(outs[0].node)
    outputs = [memo.get(id(v), v) for v in split.graph.outputs]
    graph = split.graph
    return Graph(graph.inputs, outputs, nodes=new_nodes, name=graph.name), duplicated

