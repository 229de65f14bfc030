"""Normalization ONNX ops: BatchNormalization (inference and training mode), Instance/Layer/Group/
MeanVariance/Lp normalization, composed from cgvm's batch_norm and reductions."""
from __future__ import annotations

import numpy as np

from cgvm.ops import elementwise as E
from cgvm.ops import nn as NN
from cgvm.ops import reduce as R
from cgvm.ops import shape as shp

from ..translate import rule
from .common import axes_of, axis_of, const, ints


def _channel(v, ndim):
    """A per-channel (C,) vector shaped to broadcast against (N, C, ...)."""
    return shp.reshape(v, shape=(1, -1) + (1,) * (ndim - 2))


@rule("BatchNormalization")
def _batch_norm(n):
    x, scale, bias, mean, var = (n.input(i) for i in range(5))
    eps = float(n.attr("epsilon", 1e-5))
    training = bool(n.attr("training_mode", 0)) or (n.opset < 7 and not n.attr("is_test", 0) and n.num_outputs > 1)
    if not training:
        return NN.batch_norm(x, mean, var, scale, bias, eps=eps, training=False, axis=1)
    momentum = float(n.attr("momentum", 0.9))
    axes = (0,) + tuple(range(2, x.ndim))
    bmean = R.mean(x, axis=axes, keepdims=False)
    bvar = R.var(x, axis=axes, keepdims=False)
    y = NN.batch_norm(x, bmean, bvar, scale, bias, eps=eps, training=False, axis=1)
    run_mean = E.add(E.mul(mean, const(momentum, mean)), E.mul(bmean, const(1 - momentum, mean)))
    run_var = E.add(E.mul(var, const(momentum, var)), E.mul(bvar, const(1 - momentum, var)))
    return [y, run_mean, run_var]


def _normalize(x, axes, eps):
    mean = R.mean(x, axis=axes, keepdims=True)
    centered = E.sub(x, mean)
    var = R.mean(E.square(centered), axis=axes, keepdims=True)
    return centered, E.rsqrt(E.add(var, const(eps, var))), mean


@rule("InstanceNormalization")
def _instance_norm(n):
    x, scale, bias = n.input(0), n.input(1), n.input(2)
    c, inv, _ = _normalize(x, tuple(range(2, x.ndim)), float(n.attr("epsilon", 1e-5)))
    return E.add(E.mul(E.mul(c, inv), _channel(scale, x.ndim)), _channel(bias, x.ndim))


@rule("LayerNormalization")
def _layer_norm(n):
    x = n.input(0)
    axis = axis_of(n.attr("axis", -1), x.ndim)
    axes = tuple(range(axis, x.ndim))
    stash = n.attr("stash_type", 1)
    work = E.cast(x, dtype="float32") if stash == 1 and x.dtype.np != np.float32 else x
    c, inv, mean = _normalize(work, axes, float(n.attr("epsilon", 1e-5)))
    y = E.mul(c, inv)
    if work is not x:
        y = E.cast(y, dtype=x.dtype)
    y = E.mul(y, n.input(1))
    if n.has_input(2):
        y = E.add(y, n.input(2))
    outs = [y]
    if n.num_outputs > 1:
        outs.append(mean)
    if n.num_outputs > 2:
        outs.append(inv)
    return outs


@rule("GroupNormalization")
def _group_norm(n):
    x, scale, bias = n.input(0), n.input(1), n.input(2)
    g = int(n.attr("num_groups"))
    shape = n.shape(0)
    b, c = shape[0], shape[1]
    grouped = shp.reshape(x, shape=(b, g, -1))
    cen, inv, _ = _normalize(grouped, (2,), float(n.attr("epsilon", 1e-5)))
    y = shp.reshape(E.mul(cen, inv), shape=shape)
    if n.opset < 21:    # scale and bias per group before opset 21, per channel after
        scale = shp.reshape(shp.broadcast_to(shp.reshape(scale, shape=(g, 1)), shape=(g, c // g)), shape=(c,))
        bias = shp.reshape(shp.broadcast_to(shp.reshape(bias, shape=(g, 1)), shape=(g, c // g)), shape=(c,))
    return E.add(E.mul(y, _channel(scale, x.ndim)), _channel(bias, x.ndim))


@rule("MeanVarianceNormalization")
def _mvn(n):
    x = n.input(0)
    axes = axes_of(ints(n.attr("axes", [0, 2, 3])), x.ndim)
    mean = R.mean(x, axis=axes, keepdims=True)
    c = E.sub(x, mean)
    std = E.sqrt(R.mean(E.square(c), axis=axes, keepdims=True))
    return E.div(c, E.add(std, const(1e-9, std)))


@rule("LpNormalization")
def _lp_norm(n):
    x = n.input(0)
    axis = axis_of(n.attr("axis", -1), x.ndim)
    p = n.attr("p", 2)
    norm = R.sum(E.abs(x), axis=(axis,), keepdims=True) if p == 1 else \
        E.sqrt(R.sum(E.square(x), axis=(axis,), keepdims=True))
    zero = E.eq(norm, const(0, norm))
    return E.where(zero, shp.zeros_like(x), E.div(x, E.where(zero, shp.ones_like(norm), norm)))
