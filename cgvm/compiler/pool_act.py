"""Pool before the activation: ``max_pool(relu(z))`` -> ``relu(max_pool(z))``, with its gradient.

A monotone activation commutes with a window maximum, so the activation (and in training its
gradient) runs on the pooled map, a quarter of the elements for 2x2 windows, instead of the
conv's full output. In a training graph the pattern is

    a = relu(z);  p = max_pool(a);  d = max_pool_grad(a, g, p);  dz = relu_grad(d, a)

and becomes

    p0 = max_pool(z);  p = relu(p0);  dz = max_pool_grad(z, relu_grad(g, p), p0)

Both are exactly equal, ties included, for relu and leaky relu (slope >= 0): where the window's
maximum of z is positive, z and relu(z) have the same first argmax and relu' = 1 there; where it
is not, relu' of the maximum is what the old graph multiplied the routed gradient by (relu'(0) =
0, or the leaky slope, which depends only on the sign, and the signs of z and relu(z) agree).
With overlapping windows an element receives the sum over the windows whose argmax it is, each
term scaled by relu' of that window's maximum, in both forms.

Max pooling routes each window's gradient to one element of the window's own (n, c) plane, so a
sum of ``max_pool_grad(x, g, p)`` over every spatial axis (a conv's bias gradient) is the same
sum of ``g``, over a map a quarter the size for 2x2 windows; that rewrite is made too (except for
rounding: the terms are added in another order; a window whose maximum is NaN may route its
gradient nowhere in one kernel and somewhere in another, and such a loss is NaN anyway).

The rewrite needs every reader of ``a`` to be that max_pool, max_pool_grad nodes over it and p,
and relu_grad nodes of those gradients (each the gradient's only reader); ``a`` and the
gradients must not be graph outputs. The conv's own relu epilogue (fuse) is then not made: the
activation is on the pooled map.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

from ..ir.graph import Graph, Node, Value
from ..ops import elementwise_math as em
from ..ops import pool as pl
from ..ops import reduce as red
from ..ops.rules import normalize_axes
from .patterns import build
from .rewrite import rewrite

_POOL_KEYS = ("kernel", "stride", "pad", "ceil_mode", "dilation")


def _pool_attrs(node: Node) -> tuple:
    return tuple(node.attrs[k] for k in _POOL_KEYS)


def _match(relu: Node, users: Dict[int, List[Node]], outputs: set) -> Optional[Node]:
    """The max_pool node reading ``relu``'s output when every reader fits the pattern (module doc)."""
    a = relu.outputs[0]
    if relu.attrs["negative_slope"] < 0 or id(a) in outputs:
        return None
    readers = users.get(id(a), [])
    pools = [n for n in readers if n.op.name == "max_pool"]
    if len(pools) != 1 or pools[0].inputs[0] is not a or pools[0].attrs["return_mask"]:
        return None
    pool = pools[0]
    p = pool.outputs[0]
    for n in readers:
        if n is pool:
            continue
        if n.op.name == "max_pool_grad":
            d = n.outputs[0]
            ok = (len(n.inputs) == 3 and n.inputs[0] is a and n.inputs[2] is p and n.inputs[1] is not a
                  and _pool_attrs(n) == _pool_attrs(pool) and id(d) not in outputs)
            after = users.get(id(d), [])
            if not ok or len(after) != 1 or not _is_relu_grad_of(after[0], d, a, relu):
                return None
        elif not (n.op.name == "relu_grad" and n.inputs[0] is not a and n.inputs[1] is a
                  and any(m is n.inputs[0].node and m.op.name == "max_pool_grad" for m in readers)):
            return None
    return pool


def _is_relu_grad_of(node: Node, d: Value, a: Value, relu: Node) -> bool:
    return (node.op.name == "relu_grad" and node.inputs[0] is d and node.inputs[1] is a
            and node.attrs["negative_slope"] == relu.attrs["negative_slope"])


def _routed_sum(node: Node, inputs: Sequence[Value]) -> Optional[Value]:
    """sum(max_pool_grad(x, g, ...)) over every spatial axis -> the same sum of g (module doc)."""
    made = inputs[0].node
    if made is None or made.op.name != "max_pool_grad":
        return None
    g = made.inputs[1]
    axes = tuple(range(g.ndim)) if node.attrs["axis"] is None else normalize_axes(node.attrs["axis"], g.ndim)
    if not set(range(2, g.ndim)) <= set(axes) or g.dtype is not inputs[0].dtype:
        return None
    return build(red.sum, [g], {"axis": axes, "keepdims": node.attrs["keepdims"]}, node)


def pool_before_activation(graph: Graph) -> Graph:
    """The rewrites of the module doc: relu after max_pool where every reader fits, and sums of
    routed gradients over the spatial axes."""
    graph = _pool_first(graph)
    if not any(n.op.name == "max_pool_grad" for n in graph.nodes):
        return graph

    def rule(node: Node, inputs: Sequence[Value]) -> Optional[Sequence[Value]]:
        repl = _routed_sum(node, inputs) if node.op.name == "sum" else None
        return None if repl is None else [repl]
    return rewrite(graph, rule)


def _pool_first(graph: Graph) -> Graph:
    if not any(n.op.name == "max_pool" for n in graph.nodes):
        return graph
    users = graph.consumers()
    outputs = {id(v) for v in graph.outputs}
    relus: Dict[int, Node] = {}    # id(max_pool node) -> the relu it moves past
    for node in graph.nodes:
        if node.op.name == "relu":
            pool = _match(node, users, outputs)
            if pool is not None:
                relus[id(pool)] = node
    if not relus:
        return graph
    moved = {id(r) for r in relus.values()}
    pooled: Dict[int, Value] = {}      # id(old pooled output) -> max_pool(z), before the activation
    activated: Dict[int, Value] = {}   # id(old pooled output) -> relu(max_pool(z))

    def rule(node: Node, inputs: Sequence[Value]) -> Optional[Sequence[Value]]:
        if id(node) in moved:      # every reader of relu(z) is rewritten below to read z
            return [inputs[0]]
        relu = relus.get(id(node))
        if relu is not None:
            p0 = build(pl.max_pool, inputs, dict(node.attrs), node)
            p = build(em.relu, [p0], dict(relu.attrs), relu)
            pooled[id(node.outputs[0])], activated[id(node.outputs[0])] = p0, p
            return [p]
        if node.op.name == "max_pool_grad" and len(node.inputs) == 3 and id(node.inputs[2]) in pooled:
            old_p = node.inputs[2]
            z, g = inputs[0], inputs[1]
            slope = node.inputs[0].node.attrs["negative_slope"]
            g_act = build(em.relu_grad, [g, activated[id(old_p)]], {"negative_slope": slope}, node)
            return [build(pl.max_pool_grad, [z, g_act, pooled[id(old_p)]], dict(node.attrs), node)]
        if node.op.name == "relu_grad" and id(node.inputs[1].node) in moved:
            return [inputs[0]]     # the rewritten max_pool_grad already holds relu'
        return None

    return rewrite(graph, rule)
