"""Neuron layers (one bottom, one top of the same shape; all may run in place in Caffe).

ReLU, PReLU, ELU, Sigmoid, TanH, AbsVal, Power, Exp, Log, BNLL, Threshold, Clip, Swish, Dropout.
"""
from __future__ import annotations

import math

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.fillers import constant_filler
from cgvm.frontends.caffe.layers.base import need_bottoms, register, scalar
from cgvm.ir import Value
from cgvm.ops import elementwise as ew
from cgvm.ops import elementwise_math as em
from cgvm.ops import nn
from cgvm.ops import shape as shp


def identity(x: Value) -> Value:
    """A new value equal to ``x`` (a view): each Caffe top gets a value of its own."""
    return shp.reshape(x, shape=tuple(x.shape))


def _one(bottoms, ctx) -> Value:
    need_bottoms(bottoms, (1,), ctx)
    return bottoms[0]


@register("ReLU")
def relu(layer, bottoms, ctx):
    return [em.relu(_one(bottoms, ctx), negative_slope=layer.relu_param.negative_slope)]


@register("PReLU")
def prelu(layer, bottoms, ctx):
    x = _one(bottoms, ctx)
    if x.ndim < 2:
        raise ctx.error(f"PReLU needs a bottom with at least 2 axes, got shape {tuple(x.shape)}")
    param = layer.prelu_param
    filler = param.filler if param.HasField("filler") else constant_filler(0.25)
    shape = () if param.channel_shared else (int(x.shape[1]),)
    slope = ctx.param(0, shape, filler)
    return [nn.prelu(x, slope, axis=1)]


@register("ELU")
def elu(layer, bottoms, ctx):
    return [em.elu(_one(bottoms, ctx), alpha=layer.elu_param.alpha)]


@register("Sigmoid")
def sigmoid(layer, bottoms, ctx):
    return [em.sigmoid(_one(bottoms, ctx))]


@register("TanH")
def tanh(layer, bottoms, ctx):
    return [em.tanh(_one(bottoms, ctx))]


@register("AbsVal")
def absval(layer, bottoms, ctx):
    return [ew.abs(_one(bottoms, ctx))]


@register("BNLL")
def bnll(layer, bottoms, ctx):
    """log(1 + e^x), computed without overflow."""
    return [em.softplus(_one(bottoms, ctx))]


@register("Swish")
def swish(layer, bottoms, ctx):
    x = _one(bottoms, ctx)
    beta = layer.swish_param.beta
    return [ew.mul(x, em.sigmoid(x if beta == 1.0 else ew.mul(x, scalar(beta, x))))]


def affine(x: Value, scale: float, shift: float) -> Value:
    """shift + scale * x, without nodes for the trivial parts."""
    y = x if scale == 1.0 else ew.mul(x, scalar(scale, x))
    return y if shift == 0.0 else ew.add(y, scalar(shift, x))


@register("Power")
def power(layer, bottoms, ctx):
    """(shift + scale x)^power; constant (1 if power is 0, else shift^power) when power * scale is 0."""
    x = _one(bottoms, ctx)
    p = layer.power_param
    if p.power * p.scale == 0.0:
        value = 1.0 if p.power == 0.0 else math.pow(p.shift, p.power)
        return [ew.add(ew.mul(x, scalar(0.0, x)), scalar(value, x))]
    base = affine(x, p.scale, p.shift)
    if p.power == 1.0:
        return [identity(base) if base is x else base]
    if p.power == 2.0:
        return [ew.square(base)]
    return [ew.pow(base, scalar(p.power, x))]


def _log_base(base: float, ctx) -> float:
    """ln(base), with Caffe's -1 standing for e."""
    if base == -1.0:
        return 1.0
    if base <= 0.0:
        raise ctx.error(f"base must be positive (or -1 for e), got {base}")
    return math.log(base)


@register("Exp")
def exp(layer, bottoms, ctx):
    """base^(shift + scale x) = e^(ln(base) (shift + scale x)); base -1 means e."""
    x = _one(bottoms, ctx)
    p = layer.exp_param
    ln_base = _log_base(p.base, ctx)
    return [em.exp(affine(x, ln_base * p.scale, ln_base * p.shift))]


@register("Log")
def log(layer, bottoms, ctx):
    """log_base(shift + scale x); base -1 means e."""
    x = _one(bottoms, ctx)
    p = layer.log_param
    ln_base = _log_base(p.base, ctx)
    y = em.log(affine(x, p.scale, p.shift))
    return [y if ln_base == 1.0 else ew.mul(y, scalar(1.0 / ln_base, x))]


@register("Threshold")
def threshold(layer, bottoms, ctx):
    """1 where x > threshold (strictly), else 0; no gradient (Caffe has no backward for it)."""
    x = _one(bottoms, ctx)
    return [ew.cast(ew.gt(x, scalar(layer.threshold_param.threshold, x)), dtype=x.dtype)]


@register("Clip")
def clip(layer, bottoms, ctx):
    """min(max(x, min), max); the gradient passes where min <= x <= max."""
    x = _one(bottoms, ctx)
    p = layer.clip_param
    if not (p.HasField("min") and p.HasField("max")):
        raise ctx.error("clip_param needs both min and max")
    low, high = scalar(p.min, x), scalar(p.max, x)
    return [ew.where(ew.gt(x, high), high, ew.where(ew.lt(x, low), low, x))]


@register("Dropout")
def dropout(layer, bottoms, ctx):
    """TRAIN: x * mask / (1 - ratio) (inverted dropout, mask redrawn every forward); TEST: identity."""
    x = _one(bottoms, ctx)
    ratio = layer.dropout_param.dropout_ratio
    if not 0.0 <= ratio < 1.0:
        raise ctx.error(f"dropout_ratio must be in [0, 1), got {ratio}")
    if ctx.phase != caffe_pb2.TRAIN:
        return [identity(x)]
    return [nn.dropout(x, ctx.dropout_seed(), ratio=ratio)]
