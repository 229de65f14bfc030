"""Activation ONNX ops, each as cgvm's own op where it has one, else composed from elementwise ops."""
from __future__ import annotations

import math

from cgvm.ops import elementwise as E
from cgvm.ops import nn as NN
from cgvm.ops import reduce as R
from cgvm.ops import shape as shp

from ..translate import rule
from .common import axis_of, const


@rule("Relu")
def _relu(n):
    return E.relu(n.input(0))


@rule("LeakyRelu")
def _leaky(n):
    return E.relu(n.input(0), negative_slope=float(n.attr("alpha", 0.01)))


@rule("Elu")
def _elu(n):
    return E.elu(n.input(0), alpha=float(n.attr("alpha", 1.0)))


@rule("Selu")
def _selu(n):
    x = n.input(0)
    alpha, gamma = n.attr("alpha", 1.67326319217681884765625), n.attr("gamma", 1.05070102214813232421875)
    neg = E.mul(const(alpha, x), E.sub(E.exp(x), const(1, x)))
    return E.mul(const(gamma, x), E.where(E.gt(x, const(0, x)), x, neg))


@rule("Celu")
def _celu(n):
    x = n.input(0)
    alpha = const(n.attr("alpha", 1.0), x)
    # expm1, as ONNX defines Celu (exp - 1 loses the small negatives' digits, in bfloat16 visibly)
    neg = E.mul(alpha, E.expm1(E.div(x, alpha)))
    return E.add(E.maximum(x, const(0, x)), E.minimum(const(0, x), neg))


@rule("ThresholdedRelu")
def _trelu(n):
    x = n.input(0)
    return E.where(E.gt(x, const(n.attr("alpha", 1.0), x)), x, shp.zeros_like(x))


@rule("Softplus")
def _softplus(n):
    return E.softplus(n.input(0))


@rule("Softsign")
def _softsign(n):
    x = n.input(0)
    return E.div(x, E.add(E.abs(x), const(1, x)))


@rule("HardSigmoid")
def _hardsigmoid(n):
    x = n.input(0)
    lin = E.add(E.mul(x, const(n.attr("alpha", 0.2), x)), const(n.attr("beta", 0.5), x))
    return E.minimum(E.maximum(lin, const(0, x)), const(1, x))


@rule("HardSwish")
def _hardswish(n):
    x = n.input(0)
    lin = E.add(E.mul(x, const(1 / 6, x)), const(0.5, x))
    return E.mul(x, E.minimum(E.maximum(lin, const(0, x)), const(1, x)))


@rule("Mish")
def _mish(n):
    x = n.input(0)
    return E.mul(x, E.tanh(E.softplus(x)))


@rule("Swish")
def _swish(n):
    x = n.input(0)
    return E.mul(x, E.sigmoid(E.mul(x, const(n.attr("alpha", 1.0), x))))


@rule("Gelu")
def _gelu(n):
    x = n.input(0)
    if n.attr("approximate", "none") == "tanh":
        inner = E.mul(const(math.sqrt(2 / math.pi), x), E.add(x, E.mul(const(0.044715, x), E.pow(x, const(3, x)))))
        return E.mul(E.mul(const(0.5, x), x), E.add(const(1, x), E.tanh(inner)))
    return E.mul(E.mul(const(0.5, x), x), E.add(const(1, x), E.erf(E.mul(x, const(1 / math.sqrt(2), x)))))


@rule("Shrink")
def _shrink(n):
    x = n.input(0)
    lambd, bias = n.attr("lambd", 0.5), n.attr("bias", 0.0)
    return E.where(E.lt(x, const(-lambd, x)), E.add(x, const(bias, x)),
                   E.where(E.gt(x, const(lambd, x)), E.sub(x, const(bias, x)), shp.zeros_like(x)))


@rule("PRelu")
def _prelu(n):
    x, slope = n.input(0), n.input(1)
    if slope.ndim == 1 and x.ndim >= 2 and slope.shape[0] == x.shape[1] != x.shape[-1]:
        # PRelu before opset 7 broadcast a (C,) slope along the channel axis
        slope = shp.reshape(slope, shape=(-1,) + (1,) * (x.ndim - 2))
    return E.where(E.lt(x, const(0, x)), E.mul(x, slope), x)


def _softmax_family(fn):
    def apply(n):
        x = n.input(0)
        if n.opset >= 13:
            return fn(x, axis=axis_of(n.attr("axis", -1), x.ndim))
        # before opset 13 the input is taken as 2-D: (prod(d[:axis]), prod(d[axis:]))
        axis = axis_of(n.attr("axis", 1), x.ndim)
        if axis == x.ndim - 1:
            return fn(x, axis=axis)
        shape = n.shape(0)
        flat = shp.reshape(x, shape=(int(_prod(shape[:axis])), -1))
        return shp.reshape(fn(flat, axis=1), shape=shape)
    return apply


def _prod(dims):
    p = 1
    for d in dims:
        p *= d
    return p


rule("Softmax")(_softmax_family(NN.softmax))
rule("LogSoftmax")(_softmax_family(NN.log_softmax))


def _hardmax(x, axis):
    from cgvm.ops import indexing as I

    idx = R.argmax(x, axis=axis, keepdims=False)
    hot = I.one_hot(idx, depth=int(x.shape[axis]), dtype=x.dtype)
    if axis != x.ndim - 1:
        perm = list(range(x.ndim - 1))
        perm.insert(axis, x.ndim - 1)
        hot = shp.transpose(hot, perm=tuple(perm))
    return hot


rule("Hardmax")(_softmax_family(_hardmax))


@rule("SwiGLU")
def _swiglu(n):
    """a * sigmoid(alpha * a) * b; 16-bit inputs computed in float32 and rounded once, as ONNX's reference
    does (its function body, op by op in float16, can be an ulp away)."""
    import numpy as np

    from .common import cast_to

    a, b = n.input(0), n.input(1)
    work = np.float32 if a.dtype.np.itemsize < 4 else a.dtype.np
    a_w, b_w = cast_to(a, work), cast_to(b, work)
    y = E.mul(E.mul(a_w, E.sigmoid(E.mul(a_w, const(n.attr("alpha", 1.0), a_w)))), b_w)
    return cast_to(y, a.dtype.np)
