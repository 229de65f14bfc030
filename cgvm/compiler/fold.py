"""Constant folding: a node whose inputs are all constants is evaluated once, at compile time."""
from __future__ import annotations

import numpy as np

from ..ir.graph import CONST, Graph, const_value

#: folded results larger than this stay as nodes (folding would only move the allocation)
MAX_FOLD_ELEMENTS = 1 << 20


def fold_constants(graph: Graph) -> Graph:
    def rule(node, inputs):
        op = node.op
        if op.stateful or op.needs_runtime or not all(v.kind == CONST for v in inputs):
            return None
        if any(t.size is None or t.size > MAX_FOLD_ELEMENTS for t in (o.type for o in node.outputs)):
            return None
        try:
            result = op.bind(np, node.attrs)(*[v.data for v in inputs])
        except Exception:  # leave it to run time, where the error gets the node's source
            return None
        results = result if isinstance(result, tuple) else (result,)
        outs = []
        for old, r in zip(node.outputs, results):
            arr = np.asarray(r, dtype=old.dtype.np)
            if arr.shape != tuple(old.shape):
                return None
            outs.append(const_value(arr, old.dtype))
        return outs

    from .rewrite import rewrite

    return rewrite(graph, rule)
