"""Accumulating products: ``beta * c + alpha * (a @ b)`` as one ``gemm_accumulate`` adding into ``c``.

An SGD step ``w - lr * (x.T @ g)``, a momentum update ``mu * v - lr * (x.T @ g)`` or a residual
``c + a @ b`` reads a product once, to add it to a matrix of the product's shape. As one op,
the product is added while BLAS writes it (Theano's gemm rewrite): no temporary and no second
pass (see cgvm.backend.blas). Matched, for 2-D float operands of one dtype:

    add(C, P), add(P, C), sub(C, P), sub(P, C)
    P = matmul(a, b) | mul(matmul(a, b), s) | mul(s, matmul(a, b))      (alpha from s and the sign)
    C = c | mul(c, t) | mul(t, c)                                        (beta from t and the sign)

with ``t`` a scalar constant, ``s`` a scalar constant or a scalar value (a learning rate that
is an input or a parameter), ``c`` of the product's static shape, and every intermediate read
by the pattern alone. A plain ``c + a @ b`` is left to the epilogue fusion: ``gemm_bias_act``
costs the same there and also takes the activation that often follows (an RNN step's tanh). Unknown dimensions may still differ at run time; ``gemm_accumulate``
broadcasts c and the product against each other as the add did, and adds through BLAS when the
shapes agree. It may overwrite ``c`` where ``c`` dies there (the memory planner decides), and a
parameter's own array on an update (the VM decides: see Executable._updates_in_place).
"""
from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional

from ..ir.builder import apply
from ..ir.graph import CONST, Graph, Node, Value
from ..ops import fused as F
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
                if not n.op.reads_only_shape(k):
                    self.count[id(v)] = self.count.get(id(v), 0) + 1

    def private(self, v: Value) -> bool:
        return v.node is not None and id(v) not in self.outputs and self.count.get(id(v), 0) == 1


class _Term(NamedTuple):
    base: Value                 # the value scaled
    factor: float               # a constant factor
    scale: Optional[Value]      # a scalar value the term is also multiplied by (a learning rate input)
    swallowed: List[Node]


def _term(v: Value, readers: _Readers, symbolic: bool) -> _Term:
    """``v`` as ``factor [* scale] * base``, through a mul by a scalar that only this pattern reads."""
    node = v.node
    if node is not None and node.op.name == "mul" and readers.private(v):   # the pattern: a scaled term
        for k in (0, 1):
            s, other = node.inputs[k], node.inputs[1 - k]
            factor = _scalar_constant(s)
            if factor is not None:
                return _Term(other, factor, None, [node])
            if symbolic and s.ndim == 0 and s.dtype is v.dtype and other.ndim == 2:
                return _Term(other, 1.0, s, [node])
    return _Term(v, 1.0, None, [])


class _Accumulation(NamedTuple):
    matmul: Node
    c: Value
    alpha: float
    beta: float
    scale: Optional[Value]
    swallowed: List[Node]


def _accumulation(node: Node, readers: _Readers) -> Optional[_Accumulation]:
    """``node`` as ``beta * c + alpha [* scale] * (a @ b)``."""
    if node.op.name not in ("add", "sub") or len(node.outputs) != 1:   # the pattern's root
        return None
    z = node.outputs[0]
    if z.ndim != 2 or z.dtype.name not in _FLOATS:
        return None
    for k in (1, 0):   # the product is usually the second operand (w - lr * g)
        p = _term(node.inputs[k], readers, symbolic=True)
        mm = p.base.node
        if mm is None or mm.op.name != "matmul" or not readers.private(p.base):   # the pattern's product
            continue
        c = _term(node.inputs[1 - k], readers, symbolic=False)
        product = mm.outputs[0]
        if not (mm.inputs[0].ndim == mm.inputs[1].ndim == 2 and c.base.shape == product.shape
                and c.base.dtype is product.dtype is z.dtype):
            continue
        alpha, beta = p.factor, c.factor
        if node.op.name == "sub":   # the pattern's root is add or sub: sub negates one term
            if k == 1:
                alpha = -alpha
            else:
                beta = -beta
        if alpha == beta == 1.0 and p.scale is None:
            return None   # a plain sum: gemm_bias_act does as well, and takes an activation after it
        return _Accumulation(mm, c.base, alpha, beta, p.scale, p.swallowed + [mm] + c.swallowed)
    return None


def fuse_accumulations(graph: Graph) -> Graph:
    """``beta * c + alpha [* scale] * (a @ b)`` -> ``gemm_accumulate(a, b, c[, scale], alpha, beta)``."""
    if not any(n.op.name == "matmul" for n in graph.nodes):   # the pattern's product: nothing to match
        return graph
    readers = _Readers(graph)
    found = {id(n): hit for n in graph.nodes for hit in [_accumulation(n, readers)] if hit is not None}
    if not found:
        return graph

    def rule(node: Node, inputs: List[Value], rebuilt: Callable[[Value], Value]) -> Optional[List[Value]]:
        hit = found.get(id(node))
        if hit is None:
            return None
        args = [rebuilt(v) for v in (*hit.matmul.inputs, hit.c)] + ([] if hit.scale is None else [rebuilt(hit.scale)])
        return [apply(F.gemm_accumulate, args, {"alpha": hit.alpha, "beta": hit.beta},
                      name=node.name, source=fused_source(hit.swallowed + [node]))]

    return rewrite(graph, rule, lookup=True)
