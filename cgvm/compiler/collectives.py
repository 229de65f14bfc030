"""Scheduling collectives: start each gradient reduction early, wait for it late.

Ops declare ``collective = "start"`` (cgvm.distributed's ``allreduce_start``: packs a bucket of
gradients and starts a non-blocking allreduce) or ``collective = "wait"`` (waits and unpacks).
After the memory scheduler has ordered the backward pass, this pass moves every start to just
after the last producer of its inputs, and every wait to just before its first reader, so the
backward computation between them runs while the bucket is on the wire (Caffe's
``layer_wise_reduce``, Horovod's overlap). Only these two kinds of node move, and only within
their data dependences, so the program computes the same values. Starts keep their relative
order (every rank must issue its non-blocking collectives in the same order).
"""
from __future__ import annotations

from typing import Dict, List

from ..ir.graph import Graph, Node


def _kind(node: Node) -> str:
    return getattr(node.op, "collective", "") or ""


def schedule_collectives(graph: Graph) -> Graph:
    """``graph`` with collective starts as early and waits as late as their data allow."""
    nodes = list(graph.nodes)
    if not any(_kind(n) for n in nodes):
        return graph
    starts = [n for n in nodes if _kind(n) == "start"]
    waits = [n for n in nodes if _kind(n) == "wait"]
    moving = {id(n) for n in starts + waits}
    order: List[Node] = [n for n in nodes if id(n) not in moving]
    # waits first: each right before its first reader (or at the end when only outputs read it)
    for w in waits:
        outs = {id(o) for o in w.outputs}
        at = next((i for i, n in enumerate(order) if any(id(v) in outs for v in n.inputs)), len(order))
        order.insert(at, w)
    # starts: each right after the last producer of its inputs, after the previous start
    floor = 0
    for s in starts:
        made: Dict[int, int] = {id(o): i for i, n in enumerate(order) for o in n.outputs}
        at = max([made[id(v)] + 1 for v in s.inputs if id(v) in made] + [floor])
        order.insert(at, s)
        floor = at + 1
    # a wait must follow its start: move any wait that now precedes its start to right after it
    position = {id(n): i for i, n in enumerate(order)}
    for w in waits:
        start = w.inputs[0].node
        if start is not None and position.get(id(start), -1) > position[id(w)]:
            order.remove(w)
            order.insert(order.index(start) + 1, w)
            position = {id(n): i for i, n in enumerate(order)}
    if all(a is b for a, b in zip(order, nodes)):
        return graph
    return graph.replace(order)
