"""Loss layers (a 0-axis top; loss weight 1 by default) and Accuracy.

Normalization (LossParameter): FULL = outer*inner positions, VALID = non-ignored positions
(FULL without ignore_label), BATCH_SIZE = outer, NONE = 1; then at least 1. The legacy `normalize`
field is read only when `normalization` is unset (true: VALID, false: BATCH_SIZE).
"""
from __future__ import annotations

from typing import Optional, Tuple, Union

import numpy as np

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.layers.base import (LayerContext, as_index, canonical_axis, count, need_bottoms, register,
                                              scalar)
from cgvm.ir import Value
from cgvm.ir.builder import as_value
from cgvm.ops import elementwise as ew
from cgvm.ops import elementwise_math as em
from cgvm.ops import indexing as ix
from cgvm.ops import nn
from cgvm.ops import reduce as red
from cgvm.ops import shape as shp
from cgvm.ops import sorting

_N = caffe_pb2.LossParameter


def _mode(layer, default: int) -> int:
    param = layer.loss_param
    if param.HasField("normalization"):
        return param.normalization
    if param.HasField("normalize"):
        return _N.VALID if param.normalize else _N.BATCH_SIZE
    return default


def normalizer(layer, default: int, outer: int, inner: int, valid: Optional[Value], like: Value) -> Union[float, Value]:
    """Caffe's LossLayer::GetNormalizer: a number, or a value when it counts non-ignored positions."""
    mode = _mode(layer, default)
    if mode == _N.FULL:
        return float(max(1, outer * inner))
    if mode == _N.VALID:
        if valid is None:
            return float(max(1, outer * inner))
        return ew.maximum(red.sum(ew.cast(valid, dtype=like.dtype)), scalar(1.0, like))
    if mode == _N.BATCH_SIZE:
        return float(max(1, outer))
    return 1.0


def _divide(total: Value, by: Union[float, Value]) -> Value:
    if isinstance(by, float):
        return total if by == 1.0 else ew.mul(total, scalar(1.0 / by, total))
    return ew.div(total, by)


def _labels(label: Value, outer: int, inner: int, ctx: LayerContext) -> Value:
    if count(label.shape) != outer * inner:
        raise ctx.error(f"the label blob has {count(label.shape)} values; expected {outer * inner} "
                        f"(one per position: outer {outer} x inner {inner})")
    return shp.reshape(as_index(label), shape=(outer, inner))


def _ignore(layer, labels: Value) -> Tuple[Optional[Value], Value]:
    """(mask of counted positions or None, labels with ignored ones replaced by 0 so they index safely)."""
    if not layer.loss_param.HasField("ignore_label"):
        return None, labels
    valid = ew.ne(labels, layer.loss_param.ignore_label)
    return valid, ew.where(valid, labels, 0)


def _class_major(x: Value, axis: int) -> Tuple[Value, int, int, int]:
    """x reshaped to (outer, classes, inner) around ``axis``."""
    outer, classes, inner = count(x.shape, 0, axis), int(x.shape[axis]), count(x.shape, axis + 1)
    return shp.reshape(x, shape=(outer, classes, inner)), outer, classes, inner


def _pick(values: Value, labels: Value) -> Value:
    """values (outer, C, inner) read at the label of each (outer, inner) position -> (outer, inner)."""
    picked = sorting.take_along_axis(values, shp.expand_dims(labels, axis=1), axis=1)
    return shp.reshape(picked, shape=(int(labels.shape[0]), int(labels.shape[1])))


def _masked_sum(values: Value, valid: Optional[Value]) -> Value:
    if valid is not None:
        values = ew.where(valid, values, scalar(0.0, values))
    return red.sum(values)


@register("SoftmaxWithLoss")
def softmax_with_loss(layer, bottoms, ctx):
    """-sum of log softmax at the labels over counted positions / normalizer; top 1 = the probabilities."""
    need_bottoms(bottoms, (2,), ctx)
    x, label = bottoms
    axis = canonical_axis(layer.softmax_param.axis, x.ndim, ctx)
    x3, outer, _, inner = _class_major(x, axis)
    valid, labels = _ignore(layer, _labels(label, outer, inner, ctx))
    log_p = nn.log_softmax(x3, axis=1)
    loss = ew.neg(_divide(_masked_sum(_pick(log_p, labels), valid),
                          normalizer(layer, _N.VALID, outer, inner, valid, x)))
    tops = [loss]
    if len(layer.top) > 1:
        tops.append(nn.softmax(x, axis=axis))
    return tops


@register("SigmoidCrossEntropyLoss")
def sigmoid_cross_entropy_loss(layer, bottoms, ctx):
    """sum of softplus(x) - x t (the stable form of -[t log p + (1-t) log(1-p)]) / normalizer (BATCH_SIZE)."""
    need_bottoms(bottoms, (2,), ctx)
    x, target = bottoms
    if count(x.shape) != count(target.shape):
        raise ctx.error(f"the bottoms must have the same count, got {tuple(x.shape)} and {tuple(target.shape)}")
    t = shp.reshape(target if target.dtype is x.dtype else ew.cast(target, dtype=x.dtype), shape=tuple(x.shape))
    per_element = ew.sub(em.softplus(x), ew.mul(x, t))
    valid = None
    if layer.loss_param.HasField("ignore_label"):
        valid = ew.ne(t, scalar(float(layer.loss_param.ignore_label), x))
    outer = int(x.shape[0]) if x.ndim else 1
    norm = normalizer(layer, _N.BATCH_SIZE, outer, count(x.shape) // max(outer, 1), valid, x)
    return [_divide(_masked_sum(per_element, valid), norm)]


@register("EuclideanLoss")
def euclidean_loss(layer, bottoms, ctx):
    """sum((a - b)^2) / (2 N), N = the first dimension; both bottoms get gradients."""
    need_bottoms(bottoms, (2,), ctx)
    a, b = bottoms
    if count(a.shape) != count(b.shape):
        raise ctx.error(f"the bottoms must have the same count, got {tuple(a.shape)} and {tuple(b.shape)}")
    if tuple(b.shape) != tuple(a.shape):
        b = shp.reshape(b, shape=tuple(a.shape))
    num = int(a.shape[0]) if a.ndim else 1
    return [ew.mul(red.sum(ew.square(ew.sub(a, b))), scalar(1.0 / (2 * num), a))]


@register("HingeLoss")
def hinge_loss(layer, bottoms, ctx):
    """t = x with the true class negated; sum(max(0, 1 + t)) / N (L1) or sum(max(0, 1 + t)^2) / N (L2)."""
    need_bottoms(bottoms, (2,), ctx)
    x, label = bottoms
    num = int(x.shape[0])
    dim = count(x.shape) // num
    scores = shp.reshape(x, shape=(num, dim))
    labels = shp.reshape(as_index(label), shape=(num,))
    sign = ew.sub(scalar(1.0, x), ew.mul(ix.one_hot(labels, depth=dim, dtype=x.dtype), scalar(2.0, x)))
    margins = em.relu(ew.add(ew.mul(scores, sign), scalar(1.0, x)))
    if layer.hinge_loss_param.norm == caffe_pb2.HingeLossParameter.L2:
        margins = ew.square(margins)
    return [ew.mul(red.sum(margins), scalar(1.0 / num, x))]


@register("ContrastiveLoss")
def contrastive_loss(layer, bottoms, ctx):
    """Similar pairs: d^2; dissimilar: max(margin - d, 0)^2 (legacy: max(margin - d^2, 0)); sum / (2 N)."""
    need_bottoms(bottoms, (3,), ctx)
    a, b, similar = bottoms
    num = int(a.shape[0])
    if tuple(a.shape) != tuple(b.shape):
        raise ctx.error(f"the two feature bottoms differ in shape: {tuple(a.shape)} and {tuple(b.shape)}")
    diff = shp.reshape(ew.sub(a, b), shape=(num, count(a.shape) // num))
    dist_sq = red.sum(ew.square(diff), axis=(1,))
    param = layer.contrastive_loss_param
    margin = scalar(param.margin, a)
    if param.legacy_version:
        apart = em.relu(ew.sub(margin, dist_sq))
    else:
        apart = ew.square(em.relu(ew.sub(margin, em.sqrt(dist_sq))))
    same = ew.ne(shp.reshape(similar, shape=(num,)), scalar(0.0, similar))
    return [ew.mul(red.sum(ew.where(same, dist_sq, apart)), scalar(1.0 / (2 * num), a))]


def _infogain_matrix(layer, bottoms, classes: int, ctx: LayerContext) -> Value:
    if len(bottoms) == 3:
        h = bottoms[2]
    else:
        source = layer.infogain_loss_param.source
        if not source:
            raise ctx.error("InfogainLoss needs a third bottom or infogain_loss_param.source (a .binaryproto)")
        from cgvm.frontends.caffe.prototxt import blobproto_shape, read_blobproto

        blob = read_blobproto(source)
        values = np.asarray(blob.double_data if len(blob.double_data) else blob.data, dtype=np.float32)
        h = as_value(values.reshape(blobproto_shape(blob)).astype(bottoms[0].dtype.np))
    if count(h.shape) != classes * classes:
        raise ctx.error(f"the infogain matrix has shape {tuple(h.shape)}; expected {classes} x {classes}")
    return shp.reshape(h, shape=(classes, classes))


@register("InfogainLoss")
def infogain_loss(layer, bottoms, ctx):
    """softmax over `axis`, then -sum_l H[label, l] log(max(p_l, 1e-20)) / normalizer; top 1 = probabilities."""
    need_bottoms(bottoms, (2, 3), ctx)
    x, label = bottoms[:2]
    axis = canonical_axis(layer.infogain_loss_param.axis, x.ndim, ctx)
    x3, outer, classes, inner = _class_major(x, axis)
    h = _infogain_matrix(layer, bottoms, classes, ctx)
    valid, labels = _ignore(layer, _labels(label, outer, inner, ctx))
    p = nn.softmax(x3, axis=1)
    log_p = em.log(ew.maximum(p, scalar(1e-20, x)))                       # (outer, C, inner)
    weights = shp.transpose(ix.take(h, labels, axis=0), perm=(0, 2, 1))   # (outer, C, inner)
    per_position = red.sum(ew.mul(weights, log_p), axis=(1,))
    loss = ew.neg(_divide(_masked_sum(per_position, valid), normalizer(layer, _N.VALID, outer, inner, valid, x)))
    tops = [loss]
    if len(layer.top) > 1:
        tops.append(nn.softmax(x, axis=axis))
    return tops


@register("MultinomialLogisticLoss")
def multinomial_logistic_loss(layer, bottoms, ctx):
    """The bottom holds probabilities: -sum log(max(p[label], 1e-20)) / N."""
    need_bottoms(bottoms, (2,), ctx)
    p, label = bottoms
    num = int(p.shape[0])
    p3 = shp.reshape(p, shape=(num, count(p.shape) // num, 1))
    labels = _labels(label, num, 1, ctx)
    picked = em.log(ew.maximum(_pick(p3, labels), scalar(1e-20, p)))
    return [ew.mul(red.sum(picked), scalar(-1.0 / num, p))]


@register("Accuracy")
def accuracy(layer, bottoms, ctx):
    """Correct when fewer than top_k other classes score >= the true class; top 1 = per-class accuracy."""
    need_bottoms(bottoms, (2,), ctx)
    x, label = bottoms
    param = layer.accuracy_param
    axis = canonical_axis(param.axis, x.ndim, ctx)
    x3, outer, classes, inner = _class_major(x, axis)
    labels = _labels(label, outer, inner, ctx)
    valid = ew.ne(labels, param.ignore_label) if param.HasField("ignore_label") else None
    safe = labels if valid is None else ew.where(valid, labels, 0)
    true_score = shp.expand_dims(_pick(x3, safe), axis=1)
    better = ew.sub(red.sum(ew.cast(ew.ge(x3, true_score), dtype="int64"), axis=(1,)), 1)
    correct = ew.lt(better, int(param.top_k))
    if valid is not None:
        correct = ew.logical_and(correct, valid)
    counted = float(outer * inner) if valid is None else red.sum(ew.cast(valid, dtype=x.dtype))
    hits = red.sum(ew.cast(correct, dtype=x.dtype))
    if isinstance(counted, float):
        tops = [ew.mul(hits, scalar(1.0 / counted if counted else 0.0, x))]
    else:
        empty = ew.eq(counted, 0.0)
        tops = [ew.where(empty, scalar(0.0, x), ew.div(hits, ew.where(empty, scalar(1.0, x), counted)))]
    if len(layer.top) > 1:
        per_class = ix.one_hot(safe, depth=classes, dtype=x.dtype)            # (outer, inner, C)
        if valid is not None:
            per_class = ew.mul(per_class, shp.expand_dims(ew.cast(valid, dtype=x.dtype), axis=2))
        totals = red.sum(per_class, axis=(0, 1))
        right = red.sum(ew.mul(per_class, shp.expand_dims(ew.cast(correct, dtype=x.dtype), axis=2)), axis=(0, 1))
        none = ew.eq(totals, 0.0)
        tops.append(ew.where(none, scalar(0.0, x), ew.div(right, ew.where(none, scalar(1.0, x), totals))))
    return tops
