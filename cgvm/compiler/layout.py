"""Layout: sink transposes through elementwise ops so that inverse pairs meet and cancel.

Frontends with another layout (Keras is channels-last) wrap each NCHW op in transposes; between
two such ops sit elementwise ops (activations, their gradients) working on strided views,
which NumPy runs several times slower than on contiguous data. Moving the transpose after the
elementwise op (a transpose is a free view) lets ``transpose(transpose(x, p), p^-1)`` collapse
to ``x``, so the whole stretch runs in the ops' native layout.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ..ir.builder import apply
from ..ir.graph import Graph, Value
from ..ops import shape as shp
from ..ops.registry import BROADCAST, ELEMWISE
from .rewrite import rewrite


def _perm_of(v: Value) -> Optional[Tuple[int, ...]]:
    node = v.node
    if node is None or node.op.name != "transpose":   # the op this pass moves
        return None
    perm = node.attrs["perm"]
    return tuple(reversed(range(v.ndim))) if perm is None else tuple(perm)


def _is_scalar(v: Value) -> bool:
    return all(d == 1 for d in v.shape)


def sink_transposes(graph: Graph) -> Graph:
    def rule(node, inputs: List[Value]) -> Optional[Sequence[Value]]:
        op = node.op
        if op.name == "transpose":   # this pass moves transposes: the op it is about
            inner = _perm_of(inputs[0])
            if inner is None:
                return None
            outer = _perm_of(node.outputs[0]) if node.attrs["perm"] is not None else \
                tuple(reversed(range(node.outputs[0].ndim)))
            composed = tuple(inner[i] for i in outer)
            source = inputs[0].node.inputs[0]
            if composed == tuple(range(len(composed))):
                return [source]
            return [apply(shp.transpose, [source], {"perm": composed}, source=node.source)]
        if op.pattern not in (ELEMWISE, BROADCAST) or len(node.outputs) != 1:
            return None
        perm = None
        for v in inputs:
            p = _perm_of(v)
            if p is None:
                if _is_scalar(v):
                    continue
                return None
            if v.ndim != node.outputs[0].ndim or (perm is not None and p != perm):
                return None
            perm = p
        if perm is None:
            return None
        untransposed = [v.node.inputs[0] if _perm_of(v) is not None else v for v in inputs]
        inner = apply(op, untransposed, dict(node.attrs), name=node.name, source=node.source)
        return [apply(shp.transpose, [inner], {"perm": perm}, source=node.source)]

    return rewrite(graph, rule)
