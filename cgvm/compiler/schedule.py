"""Scheduling for memory: the order of a training graph's backward pass decides how long values live.

The IR keeps nodes in the depth-first order of a walk from the outputs. For a forward pass that
order is good (each value is consumed right after it is made), but for a training step it is
not: with outputs ``[loss, W0 - lr*dW0, W1 - lr*dW1, ...]`` the walk first runs the whole
chain of activation gradients down to layer 0 (to reach dW0), and only then the other weight
gradients, so every activation gradient (and every activation) stays alive to the end.

This pass reorders the backward part (the nodes that depend on a gradient seed, ``ones_like``
of a scalar cost) by list scheduling: a node becomes ready when its backward inputs are done,
and the ready node that has waited longest runs first, so all readers of a gradient finish
(dW, db, dx of one layer, then the weight update) before the next layer's gradients pile up.
Forward-only helpers of the backward (``1 - y*y`` for tanh, transposes of activations) are
computed as late as possible, right before their first reader, instead of during the forward
pass. Graphs without a gradient seed (inference) keep their order.

Last, chains of nodes that only feed graph outputs (a weight gradient and its SGD update) move
to the end when they make a value larger than the inputs they read: AlexNet's 144 MiB fc6
weight gradient then exists after the convolutions' backward pass has freed their activations,
not on top of them. This needs concrete shapes; with unknown dimensions chains stay in place.

Run it last: passes that rebuild the graph from its outputs restore the depth-first order.
"""
from __future__ import annotations

import heapq
from typing import Dict, List, Optional, Sequence, Set

from ..ir.graph import CONST, INPUT, PARAM, Graph, Node, Value


def is_gradient_seed(node: Node) -> bool:
    """``ones_like(cost)`` with a scalar float cost: the seed ``cgvm.grad`` starts the backward pass from."""
    if node.op.name != "ones_like" or len(node.inputs) != 1:   # cgvm.grad's convention, not a fact of the op
        return False
    cost = node.inputs[0]
    return cost.dtype.is_float and all(d == 1 for d in cost.shape)


def schedule_for_memory(graph: Graph) -> Graph:
    """``graph`` with its backward nodes reordered so that values die early (see the module docstring)."""
    nodes = list(graph.nodes)
    seeds = [n for n in nodes if is_gradient_seed(n)]
    if not seeds:
        return graph
    position = {id(n): i for i, n in enumerate(nodes)}
    producer = {id(o): n for n in nodes for o in n.outputs}

    # backward: the seeds and everything downstream of them
    backward: Set[int] = {id(n) for n in seeds}
    for n in nodes:
        if id(n) not in backward and any(id(producer.get(id(v))) in backward for v in n.inputs
                                         if id(v) in producer):
            backward.add(id(n))

    # forward proper: what the costs and the forward outputs need; the rest of the forward are helpers
    needed: Set[int] = set()
    stack = [producer[id(s.inputs[0])] for s in seeds if id(s.inputs[0]) in producer]
    stack += [producer[id(v)] for v in graph.outputs if id(v) in producer and id(producer[id(v)]) not in backward]
    while stack:
        n = stack.pop()
        if id(n) in needed or id(n) in backward:
            continue
        needed.add(id(n))
        stack.extend(producer[id(v)] for v in n.inputs if id(v) in producer)

    order: List[Node] = [n for n in nodes if id(n) in needed]
    done: Set[int] = set(needed)

    def producers(node: Node) -> List[Node]:
        """Forward helpers ``node`` reads that are not computed yet, in original order."""
        found = {id(producer[id(v)]): producer[id(v)] for v in node.inputs if id(v) in producer}
        return sorted((p for k, p in found.items() if k not in done and k not in backward),
                      key=lambda p: position[id(p)])

    def emit_helpers(node: Node) -> None:
        """Emit the forward helpers ``node`` needs, depth first (each right before its first reader)."""
        stack = [(node, iter(producers(node)))]
        while stack:
            top, pending = stack[-1]
            nxt = next((p for p in pending if id(p) not in done), None)
            if nxt is not None:
                stack.append((nxt, iter(producers(nxt))))
                continue
            stack.pop()
            if top is not node:
                done.add(id(top))
                order.append(top)

    # list scheduling of the backward: FIFO by the time a node became ready, ties in the original order
    waiting: Dict[int, int] = {}
    readers: Dict[int, List[Node]] = {}
    ready: list = []
    for n in nodes:
        if id(n) not in backward:
            continue
        deps = {id(producer[id(v)]) for v in n.inputs if id(v) in producer and id(producer[id(v)]) in backward}
        waiting[id(n)] = len(deps)
        for d in deps:
            readers.setdefault(d, []).append(n)
        if not deps:
            heapq.heappush(ready, (-1, position[id(n)], n))
    while ready:
        _, _, n = heapq.heappop(ready)
        emit_helpers(n)
        done.add(id(n))
        order.append(n)
        now = len(order)
        for r in readers.get(id(n), ()):
            waiting[id(r)] -= 1
            if waiting[id(r)] == 0:
                heapq.heappush(ready, (now, position[id(r)], r))
    # forward nodes nobody in the backward reads and no output needs (none after prune) keep their place
    order += [n for n in nodes if id(n) not in done]
    order = defer_output_chains(order, graph.outputs)
    if len(order) != len(nodes) or all(a is b for a, b in zip(order, nodes)):
        return graph
    return graph.replace(order)


def _known_bytes(v: Value) -> Optional[int]:
    return v.type.nbytes if v.type.is_concrete else None


def defer_output_chains(order: Sequence[Node], outputs: Sequence[Value]) -> List[Node]:
    """``order`` with output-only chains that build a large value from small inputs moved to the end.

    A chain grows from a node making graph outputs nobody else reads, upward through producers
    whose every result is read inside the chain only: what exists solely to compute that output.
    """
    out_ids = {id(v) for v in outputs}
    readers: Dict[int, List[Node]] = {}
    for n in order:
        for v in n.inputs:
            readers.setdefault(id(v), []).append(n)
    taken: Set[int] = set()
    deferred: Set[int] = set()
    for root in reversed(order):
        if id(root) in taken or not all(id(o) in out_ids and id(o) not in readers for o in root.outputs):
            continue
        chain = {id(root): root}
        todo = [root]
        while todo:
            n = todo.pop()
            for v in n.inputs:
                p = v.node
                if (p is None or id(p) in chain or id(p) in taken or any(id(o) in out_ids for o in p.outputs)
                        or not all(id(r) in chain for o in p.outputs for r in readers.get(id(o), ()))):
                    continue
                chain[id(p)] = p
                todo.append(p)
        taken.update(chain)
        made = [_known_bytes(o) for n in chain.values() for o in n.outputs if id(o) not in out_ids]
        held = [_known_bytes(v) for v in {id(v): v for n in chain.values() for v in n.inputs
                                          if v.node is not None and id(v.node) not in chain
                                          and v.kind not in (INPUT, PARAM, CONST)}.values()]
        if made and None not in made and None not in held and max(made) > sum(held):
            deferred.update(chain)
    if not deferred:
        return list(order)
    return [n for n in order if id(n) not in deferred] + [n for n in order if id(n) in deferred]
