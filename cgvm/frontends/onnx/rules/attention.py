"""FlexAttention (ai.onnx.preview): softmax(Q K^T * scale) V with the user's score and probability
modifiers, graphs translated inline over the scores; grouped key/value heads repeated to the query
heads; scores, softmax and the product with V in the softmax precision (float32 for 16-bit inputs)."""
from __future__ import annotations

import numpy as np

from cgvm.ir.graph import const_value
from cgvm.ops import elementwise as E
from cgvm.ops import elementwise_math as EM
from cgvm.ops import indexing as I
from cgvm.ops import linalg as L
from cgvm.ops import reduce as R
from cgvm.ops import shape as shp

from ..translate import np_dtype, rule
from .common import cast_to

_DOMAIN = "ai.onnx.preview"


def _modified(n, name, scores, dtype):
    graph = n.attr(name)
    if graph is None:
        return scores
    if len(graph.input) != 1 or len(graph.output) != 1:
        raise n.error(f"attribute {name!r} must be a graph of one input and one output")
    (out,) = n.run_subgraph(graph, {graph.input[0].name: scores})
    return cast_to(out, dtype)


@rule("FlexAttention", domain=_DOMAIN)
def _flex_attention(n):
    q, k, v = n.input(0), n.input(1), n.input(2)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise n.error(f"Q, K and V must have rank 4, got {q.shape}, {k.shape} and {v.shape}")
    heads_q, heads_kv, e = n.shape(0)[1], n.shape(1)[1], n.shape(0)[3]
    if heads_q != heads_kv:
        if heads_q % heads_kv:
            raise n.error(f"{heads_q} query heads are not a multiple of {heads_kv} key/value heads")
        groups = const_value(np.repeat(np.arange(heads_kv, dtype=np.int64), heads_q // heads_kv))
        k, v = I.take(k, groups, axis=1), I.take(v, groups, axis=1)
    scale = n.attr("scale", None)
    scale = 1.0 / np.sqrt(e) if scale is None else scale
    # Q and K each scaled by sqrt(scale) (computed in float32, stored in the inputs' dtype), as ONNX does
    root = const_value(np.asarray(np.sqrt(np.float32(scale)), dtype=q.dtype.np))
    scores = L.matmul(E.mul(q, root), shp.swap_last_axes(E.mul(k, root)))
    precision = n.attr("softmax_precision", None)
    if precision is not None:
        work = np_dtype(precision)
    else:
        work = np.dtype(np.float32) if q.dtype.np.itemsize < 4 else q.dtype.np
    scores = _modified(n, "score_mod", cast_to(scores, work), work)
    shifted = E.sub(scores, R.max(scores, axis=(-1,), keepdims=True))
    weights = EM.exp(shifted)
    probs = E.div(weights, R.sum(weights, axis=(-1,), keepdims=True))
    probs = _modified(n, "prob_mod", probs, work)
    return cast_to(L.matmul(probs, cast_to(v, work)), v.dtype.np)
