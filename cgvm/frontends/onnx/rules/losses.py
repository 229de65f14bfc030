"""Loss ONNX ops: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (weights, ignore_index,
reductions), composed from take_along_axis, where and reductions."""
from __future__ import annotations

import numpy as np

from cgvm.ops import elementwise as E
from cgvm.ops import indexing as I
from cgvm.ops import nn as NN
from cgvm.ops import reduce as R
from cgvm.ops import shape as shp
from cgvm.ops import sorting as S

from ..translate import rule
from .common import const


def _nll(n, logp, target, weight):
    """-logp[n, target[n, ...], ...] with class weights and ignore_index, reduced as asked."""
    ignore = n.attr("ignore_index", None)
    reduction = n.attr("reduction", "mean")
    safe = target
    if ignore is not None:
        keep = E.ne(target, const(ignore, target))
        safe = E.where(keep, target, shp.zeros_like(target))
    picked = shp.squeeze(S.take_along_axis(logp, shp.expand_dims(safe, axis=(1,)), axis=1), axis=(1,))
    loss = E.neg(picked)
    w = I.take(weight, safe, axis=0) if weight is not None else None
    if ignore is not None:
        mask = E.cast(keep, dtype=logp.dtype)
        w = E.mul(w, mask) if w is not None else mask
    if w is not None:
        loss = E.mul(loss, w)
    if reduction == "none":
        return loss
    total = R.sum(loss, axis=tuple(range(loss.ndim)), keepdims=False)
    if reduction == "sum":
        return total
    if w is None:
        return E.div(total, const(float(np.prod(loss.shape)), total))
    return E.div(total, R.sum(w, axis=tuple(range(w.ndim)), keepdims=False))


@rule("NegativeLogLikelihoodLoss")
def _nll_loss(n):
    return _nll(n, n.input(0), n.input(1), n.input(2) if n.has_input(2) else None)


@rule("SoftmaxCrossEntropyLoss")
def _sce(n):
    x = n.input(0)
    logp = NN.log_softmax(x, axis=1)
    loss = _nll(n, logp, n.input(1), n.input(2) if n.has_input(2) else None)
    return [loss, logp] if n.num_outputs > 1 else loss
