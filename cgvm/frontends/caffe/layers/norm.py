"""Normalization layers: BatchNorm (Caffe's three blobs and moving averages) and MVN."""
from __future__ import annotations

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.layers.base import count, need_bottoms, register, scalar
from cgvm.ops import elementwise as ew
from cgvm.ops import elementwise_math as em
from cgvm.ops import nn
from cgvm.ops import reduce as red
from cgvm.ops import shape as shp


@register("BatchNorm")
def batch_norm(layer, bottoms, ctx):
    """(x - mean) / sqrt(var + eps) per channel, no affine part (Caffe pairs it with Scale).

    Blobs: [0] running mean sum, [1] running variance sum, [2] the scale factor s (shape (1,)),
    all learning-rate 0. With global stats mean = blob0 / s and var = blob1 / s (0 when s is 0).
    In training the batch statistics normalize, and after the forward s <- lambda s + 1,
    blob0 <- lambda blob0 + mean, blob1 <- lambda blob1 + m/(m-1) var (m values per channel).
    """
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    param = layer.batch_norm_param
    use_global = param.use_global_stats if param.HasField("use_global_stats") else ctx.phase == caffe_pb2.TEST
    channels = int(x.shape[1]) if x.ndim > 1 else 1
    mean_sum = ctx.param(0, (channels,), None, lr_mult=0.0, decay_mult=0.0)
    var_sum = ctx.param(1, (channels,), None, lr_mult=0.0, decay_mult=0.0)
    factor = ctx.param(2, (1,), None, lr_mult=0.0, decay_mult=0.0)
    x4 = x if x.ndim > 1 else shp.reshape(x, shape=(int(x.shape[0]), 1))
    eps = param.eps
    if use_global:
        empty = ew.eq(factor, 0.0)
        inverse = ew.where(empty, 0.0, ew.reciprocal(ew.where(empty, 1.0, factor)))
        y = nn.batch_norm(x4, ew.mul(mean_sum, inverse), ew.mul(var_sum, inverse), eps=eps)
    else:
        y, batch_mean, batch_var = nn.batch_norm(x4, mean_sum, var_sum, eps=eps, training=True)
        per_channel = count(x4.shape) // channels
        correction = per_channel / (per_channel - 1) if per_channel > 1 else 1.0
        keep = param.moving_average_fraction
        ctx.update_state(factor, ew.add(ew.mul(factor, scalar(keep, x)), scalar(1.0, x)))
        ctx.update_state(mean_sum, ew.add(ew.mul(mean_sum, scalar(keep, x)), batch_mean))
        ctx.update_state(var_sum, ew.add(ew.mul(var_sum, scalar(keep, x)),
                                         ew.mul(batch_var, scalar(correction, x))))
    return [y if x4 is x else shp.reshape(y, shape=tuple(x.shape))]


@register("MVN")
def mean_variance_normalization(layer, bottoms, ctx):
    """Subtract the mean per (n, c) (per n with across_channels); optionally divide by std + eps."""
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    param = layer.mvn_param
    first = 1 if param.across_channels else 2
    if x.ndim < first:
        raise ctx.error(f"MVN needs at least {first} axes, got shape {tuple(x.shape)}")
    axes = tuple(range(first, x.ndim))
    if not axes:
        centred = ew.sub(x, x)
        return [centred]
    centred = ew.sub(x, red.mean(x, axis=axes, keepdims=True))
    if not param.normalize_variance:
        return [centred]
    std = em.sqrt(red.mean(ew.square(centred), axis=axes, keepdims=True))
    return [ew.div(centred, ew.add(std, scalar(param.eps, x)))]
