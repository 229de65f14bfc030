"""Accumulating products: ``beta * c + alpha * (a @ b)`` as one ``gemm_accumulate`` adding into ``c``.

An SGD step ``w - lr * (x.T @ g)``, a momentum update ``mu * v - lr * (x.T @ g)``, a weight-decayed
step ``w - lr * (x.T @ g + k * w)`` or a residual ``c + a @ b`` reads a product once, to add it to
a matrix of the product's shape. As one op, the product is added while BLAS writes it (Theano's
gemm rewrite): no temporary and no second pass (see cgvm.backend.blas). The pattern, from a root
add or sub of 2-D floats:

    root = sum_i k_i * t_i      a linear combination, read through add, sub, neg, mul and div by a
                                scalar, and sum_to_like of a value that has the target's shape
    k_i                         a sum of products of scalar constants and scalar values (a learning
                                rate input, the seed of a weighted penalty's gradient), the terms
                                with one base t merged (w in ``w - lr * (g + 2 * w * s)``)
    accepted: exactly two bases, a matmul(a, b) of 2-D operands (alpha = its k) and c (beta = its k)

A scalar is a value of size 1 (a constant, or a 0-d value expanded or broadcast_like'd to the
shape of the other operand, as autodiff makes the gradient of ``k * sum(w ** 2)``). Every value
the walk goes through is 2-D of the root's dtype and read by the pattern alone, and so is the
product; c has the product's static shape. alpha and beta are attributes when constant, else
scalar values computed beside the op (``1 - lr * 2 * s``). A plain ``c + a @ b`` is left to the
epilogue fusion: ``gemm_bias_act`` costs the same there and also takes the activation that often
follows (an RNN step's tanh). Unknown dimensions may still differ at run time;
``gemm_accumulate`` broadcasts c and the product against each other as the adds did (a broadcast
scalar is only accepted beside a value of the same shape, so it widens nothing), and adds
through BLAS when the shapes agree. It may overwrite ``c`` where ``c`` dies there (the memory
planner decides), and a parameter's own array on an update (the update plan decides: see
liveness.update_plan), so ``w`` is written once, by the gemm.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from ..ir.builder import apply
from ..ir.graph import CONST, Graph, Node, Value, const_value
from ..ops import elementwise as E
from ..ops import fused as F
from ..ops.registry import BROADCAST, ELEMWISE
from .fuse import fused_source
from .rewrite import rewrite

_FLOATS = ("float32", "float64")

#: a coefficient: {monomial: factor}, a monomial the ids of the scalar values it multiplies (sorted)
Poly = Dict[Tuple[int, ...], float]


def _unit(v: Value, ndim: int) -> bool:
    """``v`` surely holds one element and broadcasts into ``ndim`` dimensions without widening."""
    return v.ndim <= ndim and all(d == 1 for d in v.shape)


def _made(v: Value, leaves: set) -> Optional[Node]:
    """The node computing ``v`` in this graph: None for its inputs, whatever made them before a cut."""
    return None if id(v) in leaves else v.node


class _Shapes:
    """Which values surely have one shape, unknown dimensions included: a value's key is the value
    whose shape it provably has (elementwise ops over one shape and unit values, broadcast_like of
    a unit value, sum_to_like), found in one pass over the graph in order."""

    def __init__(self, graph: Graph):
        self._keys: Dict[int, Value] = {}
        for n in graph.nodes:
            if len(n.outputs) == 1:
                self._keys[id(n.outputs[0])] = self._key(n, n.outputs[0])

    def key(self, v: Value) -> Value:
        return self._keys.get(id(v), v)

    def _key(self, n: Node, v: Value) -> Value:
        name = n.op.name
        if name == "sum_to_like":                       # the shape of its second input, always
            return self.key(n.inputs[1])
        if name == "broadcast_like":
            return self.key(n.inputs[1]) if _unit(n.inputs[0], n.inputs[1].ndim) else v
        if n.op.pattern in (ELEMWISE, BROADCAST):   # the broadcast of what is not a unit value
            shaped = [x for x in n.inputs if not _unit(x, v.ndim)]
            keys = {id(self.key(x)) for x in shaped}
            if len(keys) == 1 and all(x.ndim == v.ndim for x in shaped):
                return self.key(shaped[0])
        return v

    def same(self, a: Value, b: Value) -> bool:
        if a.ndim != b.ndim:
            return False
        if a.shape == b.shape and all(d is not None for d in a.shape):
            return True
        return self.key(a) is self.key(b)


class _Readers:
    """Who reads each value; a pattern may swallow a value only its own node reads."""

    def __init__(self, graph: Graph, leaves: set):
        self.leaves = leaves
        self.outputs = {id(v) for v in graph.outputs}
        self.count: Dict[int, int] = {}
        for n in graph.nodes:
            for k, v in enumerate(n.inputs):
                if not n.op.reads_only_shape(k):
                    self.count[id(v)] = self.count.get(id(v), 0) + 1

    def private(self, v: Value) -> bool:
        return _made(v, self.leaves) is not None and id(v) not in self.outputs and self.count.get(id(v), 0) == 1


def _scaled(p: Poly, factor: float, scalar: Optional[Value] = None) -> Poly:
    if scalar is None:
        return {m: f * factor for m, f in p.items()}
    return {tuple(sorted(m + (id(scalar),))): f * factor for m, f in p.items()}


class _Combination:
    """A root's linear combination: the bases, each with its coefficient, and the nodes read through."""

    def __init__(self, root: Node, readers: _Readers, shapes: _Shapes):
        self.z = root.outputs[0]
        self.readers, self.shapes = readers, shapes
        self.terms: Dict[int, Tuple[Value, Poly]] = {}
        self.scalars: Dict[int, Value] = {}
        self.swallowed: List[Node] = []
        self.ok = True
        self._walk()

    def _conforms(self, v: Value) -> bool:
        return v.ndim == 2 and v.dtype is self.z.dtype

    def _scalar(self, s: Value, other: Value) -> Optional[Tuple[float, Optional[Value]]]:
        """``s`` as a factor beside ``other``: (constant, None) or (1, a 0-d float value); None if neither."""
        leaves = self.readers.leaves
        n = _made(s, leaves)
        if n is not None and n.op.name == "broadcast_like":
            if not self.shapes.same(n.inputs[1], other):
                return None   # it would widen other
            s = n.inputs[0]
        if not _unit(s, 2):
            return None
        while _made(s, leaves) is not None and s.node.op.name == "expand_dims":
            s = s.node.inputs[0]
        if s.kind == CONST:
            return float(s.data.item()), None
        return (1.0, s) if s.ndim == 0 and s.dtype.is_float else None

    def _walk(self) -> None:
        """Breadth first, so a chain of many terms is given up on after its first three bases."""
        queue = deque([(self.z, {(): 1.0})])
        while queue and self.ok:
            v, coef = queue.popleft()
            step = self._step(v, coef, root=v is self.z)
            if step is None:
                if v is self.z:
                    self.ok = False
                    return
                self._add_term(v, coef)
            else:
                queue.extend(step)

    def _step(self, v: Value, coef: Poly, root: bool) -> Optional[List[Tuple[Value, Poly]]]:
        """What ``v`` is a combination of, if the pattern reads through its node; None for a base."""
        n = _made(v, self.readers.leaves)
        if n is None or not (root or self.readers.private(v)) or not self._conforms(v) or len(n.outputs) != 1:
            return None
        name = n.op.name
        if name in ("add", "sub") and all(self._conforms(x) for x in n.inputs):
            self.swallowed.append(n)
            return [(n.inputs[0], coef), (n.inputs[1], coef if name == "add" else _scaled(coef, -1.0))]
        if name == "neg":
            self.swallowed.append(n)
            return [(n.inputs[0], _scaled(coef, -1.0))]
        if name in ("mul", "div"):
            for k in ((0, 1) if name == "mul" else (1,)):
                other = n.inputs[1 - k]
                factor = self._scalar(n.inputs[k], other) if self._conforms(other) else None
                if factor is None or (name == "div" and (factor[1] is not None or factor[0] == 0.0)):
                    continue
                value, scalar = factor
                if scalar is not None:
                    self.scalars[id(scalar)] = scalar
                self.swallowed.append(n)
                return [(other, _scaled(coef, value if name == "mul" else 1.0 / value, scalar))]
        if name == "sum_to_like" and self._conforms(n.inputs[0]) and self.shapes.same(n.inputs[0], n.inputs[1]):
            self.swallowed.append(n)   # the identity here: its input has its target's shape
            return [(n.inputs[0], coef)]
        return None

    def _add_term(self, v: Value, coef: Poly) -> None:
        base, before = self.terms.get(id(v), (v, {}))
        merged = dict(before)
        for m, f in coef.items():
            merged[m] = merged.get(m, 0.0) + f
        self.terms[id(v)] = (base, merged)
        if len(self.terms) > 2:
            self.ok = False   # a third base: not this pattern


class _Accumulation(NamedTuple):
    matmul: Node
    c: Value
    alpha: Poly
    beta: Poly
    scalars: Dict[int, Value]
    swallowed: List[Node]


def _constant(p: Poly) -> Optional[float]:
    live = {m: f for m, f in p.items() if f != 0.0}
    if not live:
        return 0.0
    return live[()] if set(live) == {()} else None


def _accumulation(node: Node, readers: _Readers, shapes: _Shapes) -> Optional[_Accumulation]:
    """``node`` as ``beta * c + alpha * (a @ b)``, alpha and beta polynomials in scalar values."""
    if node.op.name not in ("add", "sub") or len(node.outputs) != 1:   # the pattern's root
        return None
    z = node.outputs[0]
    if z.ndim != 2 or z.dtype.name not in _FLOATS:
        return None
    comb = _Combination(node, readers, shapes)
    if not comb.ok or len(comb.terms) != 2:
        return None
    products = [(v, p) for v, p in comb.terms.values()
                if v.node is not None and v.node.op.name == "matmul" and readers.private(v)
                and v.node.inputs[0].ndim == v.node.inputs[1].ndim == 2]
    if len(products) != 1:
        return None
    product, alpha = products[0]
    ((c, beta),) = [(v, p) for v, p in comb.terms.values() if v is not product]
    if not (c.ndim == 2 and c.shape == product.shape and c.dtype is product.dtype is z.dtype):
        return None
    a, b = _constant(alpha), _constant(beta)
    if a == 0.0 or b == 0.0:
        return None   # a term that cancels: BLAS would skip c (or the product) where the adds would not
    if a == b == 1.0:
        return None   # a plain sum: gemm_bias_act does as well, and takes an activation after it
    return _Accumulation(product.node, c, alpha, beta, comb.scalars, comb.swallowed + [product.node])


def _coefficient(p: Poly, scalars: Dict[int, Value], rebuilt: Callable[[Value], Value],
                 dtype) -> Tuple[float, Optional[Value]]:
    """``p`` as ``factor [* value]``: the value a scalar expression built from the rebuilt scalars."""
    live = [(m, f) for m, f in sorted(p.items()) if f != 0.0]
    if len(live) == 1:
        (m, f), = live
        if not m:
            return f, None
        if len(m) == 1:
            return f, rebuilt(scalars[m[0]])     # the common case, a learning rate: no op built
    total: Optional[Value] = None
    for m, f in live:
        term: Value = const_value(f, dtype)
        for k in m:
            term = E.mul(term, rebuilt(scalars[k]))
        total = term if total is None else E.add(total, term)
    return 1.0, total


def fuse_accumulations(graph: Graph) -> Graph:
    """``beta * c + alpha * (a @ b)`` -> ``gemm_accumulate(a, b, c[, alpha value[, beta value]], alpha, beta)``."""
    if not any(n.op.name == "matmul" for n in graph.nodes):   # the pattern's product: nothing to match
        return graph
    leaves = {id(v) for v in graph.inputs}
    readers, shapes = _Readers(graph, leaves), _Shapes(graph)
    found: Dict[int, _Accumulation] = {}
    claimed: set = set()
    for n in reversed(graph.nodes):   # the outermost root first: an add inside its combination is no root
        if id(n) in claimed:
            continue
        hit = _accumulation(n, readers, shapes)
        if hit is not None:
            found[id(n)] = hit
            claimed.update(id(m) for m in hit.swallowed)
    if not found:
        return graph

    def rule(node: Node, inputs: List[Value], rebuilt: Callable[[Value], Value]) -> Optional[List[Value]]:
        hit = found.get(id(node))
        if hit is None:
            return None
        dtype = node.outputs[0].dtype
        alpha, alpha_value = _coefficient(hit.alpha, hit.scalars, rebuilt, dtype)
        beta, beta_value = _coefficient(hit.beta, hit.scalars, rebuilt, dtype)
        args = [rebuilt(v) for v in (*hit.matmul.inputs, hit.c)]
        if alpha_value is not None or beta_value is not None:
            args.append(alpha_value if alpha_value is not None else const_value(1.0, dtype))
        if beta_value is not None:
            args.append(beta_value)
        out = apply(F.gemm_accumulate, args, {"alpha": alpha, "beta": beta},
                    name=node.name, source=fused_source([m for m in hit.swallowed if m is not node] + [node]))
        out.name = node.outputs[0].name   # the user's name for the update, if it had one
        return [out]

    return rewrite(graph, rule, lookup=True)
