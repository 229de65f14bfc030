"""Accumulating products: ``beta * c + alpha * (a @ b)`` as one ``gemm`` that adds into ``c``.

An SGD step ``w - lr * (x.T @ g)``, a momentum update ``mu * v + lr * (x.T @ g)`` or a residual
``c + a @ b`` reads a product once, to add it to a matrix of the product's shape. As one gemm,
the product is added while BLAS writes it (Theano's gemm rewrite): no temporary and no second
pass (see cgvm.ops.blas). Matched, for matrices of one float dtype and equal static shapes:

    add(C, P), add(P, C), sub(C, P), sub(P, C)
    P = matmul(a, b) | mul(matmul(a, b), s) | mul(s, matmul(a, b))      (alpha from s and the sign)
    C = c | mul(c, t) | mul(t, c)                                        (beta from t and the sign)

with ``s`` and ``t`` scalar constants, and every intermediate read by the pattern alone. The
gemm may overwrite ``c`` where ``c`` dies there (the memory planner decides).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..ir.builder import apply
from ..ir.graph import CONST, Graph, Node, Value
from ..ops import linalg as la
from ..ops.registry import SHAPE_ONLY_INPUTS
from .fuse import fused_source
from .rewrite import rewrite

_FLOATS = ("float32", "float64")


def _scalar_constant(v: Value) -> Optional[float]:
    return float(v.data.item()) if v.kind == CONST and v.data.size == 1 and v.ndim == 0 else None


class _Readers:
    """Who reads each value; a pattern may swallow a value only its own node reads."""

    def __init__(self, graph: Graph):
        self.outputs = {id(v) for v in graph.outputs}
        self.count: Dict[int, int] = {}
        for n in graph.nodes:
            for k, v in enumerate(n.inputs):
                if (n.op.name, k) not in SHAPE_ONLY_INPUTS:
                    self.count[id(v)] = self.count.get(id(v), 0) + 1

    def private(self, v: Value) -> bool:
        return v.node is not None and id(v) not in self.outputs and self.count.get(id(v), 0) == 1


def _scaled(v: Value, readers: _Readers) -> Tuple[Value, float, List[Node]]:
    """``v`` as ``scale * base`` (a mul by a scalar constant that only this pattern reads), or ``1 * v``."""
    node = v.node
    if node is not None and node.op.name == "mul" and readers.private(v):
        for k in (0, 1):
            s = _scalar_constant(node.inputs[k])
            if s is not None:
                return node.inputs[1 - k], s, [node]
    return v, 1.0, []


def _product(v: Value, readers: _Readers) -> Optional[Tuple[Node, float, List[Node]]]:
    """``v`` as ``alpha * (a @ b)`` with a, b matrices: the matmul node, alpha, the nodes swallowed."""
    base, alpha, swallowed = _scaled(v, readers)
    node = base.node
    if node is None or node.op.name != "matmul" or not readers.private(base):
        return None
    a, b = node.inputs
    if a.ndim != 2 or b.ndim != 2:
        return None
    return node, alpha, swallowed + [node]


def _accumulation(node: Node, readers: _Readers) -> Optional[Tuple[Node, Value, float, float, List[Node]]]:
    """``node`` as ``beta * c + alpha * (a @ b)``: (matmul, c, alpha, beta, swallowed nodes)."""
    if node.op.name not in ("add", "sub") or len(node.outputs) != 1:
        return None
    z = node.outputs[0]
    if z.ndim != 2 or None in z.shape or z.dtype.name not in _FLOATS:
        return None
    for k in (1, 0):   # the product is usually the second operand (w - lr * g)
        hit = _product(node.inputs[k], readers)
        if hit is None:
            continue
        matmul, alpha, swallowed = hit
        c, beta, c_nodes = _scaled(node.inputs[1 - k], readers)
        if matmul.outputs[0].shape != z.shape or c.shape != z.shape or c.dtype is not z.dtype \
                or matmul.outputs[0].dtype is not z.dtype:
            continue
        if node.op.name == "sub":
            if k == 1:
                alpha = -alpha
            else:
                beta = -beta
        return matmul, c, alpha, beta, swallowed + c_nodes
    return None


def fuse_accumulations(graph: Graph) -> Graph:
    """``beta * c + alpha * (a @ b)`` -> ``gemm(a, b, c, alpha=alpha, beta=beta)``."""
    if not any(n.op.name == "matmul" for n in graph.nodes):
        return graph
    readers = _Readers(graph)
    found = {id(n): hit for n in graph.nodes for hit in [_accumulation(n, readers)] if hit is not None}
    if not found:
        return graph

    rebuilt: Dict[int, Value] = {}   # old value -> its rebuilt version, for inputs of swallowed nodes

    def rule(node: Node, inputs: List[Value]) -> Optional[List[Value]]:
        for old, new in zip(node.inputs, inputs):
            if old is not new:
                rebuilt[id(old)] = new
        hit = found.get(id(node))
        if hit is None:
            return None
        matmul, c, alpha, beta, swallowed = hit
        a, b, c = (rebuilt.get(id(v), v) for v in (*matmul.inputs, c))
        return [apply(la.gemm, [a, b, c], {"alpha": alpha, "beta": beta},
                      name=node.name, source=fused_source(swallowed + [node]))]

    return rewrite(graph, rule)
