"""Reductions of a product: ``sum(square(x))`` and ``sum(x * x)`` over every axis as one ``sum_squares``.

An L2 penalty ``k * (w ** 2).sum()`` costs a squared temporary of w's size and a second pass
to sum it. ``sum_squares`` is one BLAS dot of w's elements with themselves (one pass, no
temporary; see cgvm.ops.reduce). Matched, for float32 and float64:

    sum(square(x)) | sum(x * x)        axis None or every axis, keepdims False, through transposes

The square may have other readers (they still compute it); the sum's gradient was taken before
the passes run, and sum_squares has its own (2 x g) for graphs differentiated after.
"""
from __future__ import annotations

from typing import List, Optional

from ..ir.builder import apply
from ..ir.graph import Graph, Node, Value
from ..ops import reduce as red
from ..ops.rules import normalize_axes
from .fuse import fused_source
from .rewrite import rewrite

_FLOATS = ("float32", "float64")


def _squared(v: Value, leaves: set) -> Optional[Value]:
    """x where ``v`` is square(x) or x * x, of x's float dtype (a graph input is a leaf, whatever made it)."""
    n = v.node
    if n is None or id(v) in leaves or v.dtype.name not in _FLOATS:
        return None
    if n.op.name == "square" and n.inputs[0].dtype is v.dtype:
        return n.inputs[0]
    if n.op.name == "mul" and n.inputs[0] is n.inputs[1] and n.inputs[0].dtype is v.dtype:
        return n.inputs[0]
    return None


def _rule(node: Node, inputs: List[Value], leaves: set) -> Optional[List[Value]]:
    if node.op.name != "sum" or node.attrs["keepdims"]:
        return None
    (v,) = inputs
    axes = node.attrs["axis"]
    if axes is not None and len(normalize_axes(axes, v.ndim)) != v.ndim:
        return None
    while v.node is not None and id(v) not in leaves and v.node.op.name == "transpose":
        v = v.node.inputs[0]   # every axis summed: the order is no matter (the layout pass sinks transposes here)
    x = _squared(v, leaves)
    if x is None or node.outputs[0].dtype is not x.dtype:
        return None
    out = apply(red.sum_squares, [x], {}, name=node.name, source=fused_source([inputs[0].node, node]))
    out.name = node.outputs[0].name   # the user's name for the sum (a Theano cost's scope on the board)
    return [out]


def fuse_square_sums(graph: Graph) -> Graph:
    """``sum(square(x))`` / ``sum(x * x)`` over every axis -> ``sum_squares(x)``."""
    if not any(n.op.name == "sum" for n in graph.nodes):
        return graph
    leaves = {id(v) for v in graph.inputs}
    return rewrite(graph, lambda node, inputs: _rule(node, inputs, leaves))
