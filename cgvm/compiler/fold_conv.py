"""Batch norm, a per-channel scale (Caffe's Scale) and a per-channel shift (Bias, or a bias add)
folded into the convolution before them, at inference: one conv with a new weight and bias.

When the weight, bias and statistics are all constants the folded arrays are computed here,
once. When any is a parameter (or computed), the folding is emitted as small graph nodes
(``w * gain`` per output channel), evaluated on every call because a workspace tensor may
change between calls; that costs one pass over the weight instead of two over the activation,
so it is done only when the weight has no more elements than one sample's activation.

The rules take over the conv's only reader; ``sole(v)`` (from simplify's counted walk) says
whether the rule's node is the only one reading ``v``.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..ir.graph import CONST, Node, Value, const_value
from ..ops import conv as cv
from ..ops import elementwise as ew
from ..ops import shape as shp
from ..ops.rules import normalize_axis, prod_dims
from .patterns import build, producer


def _per_channel(v: Value, out: Value) -> Optional[int]:
    """The channel count when ``v`` broadcasts against the NCHW ``out`` as one value per channel."""
    c = out.shape[1]
    k = v.ndim - (out.ndim - 1)   # v's dimension that lines up with the channel axis
    if c is None or k < 0 or v.shape[k] != c or v.dtype is not out.dtype:
        return None
    if any(d != 1 for i, d in enumerate(v.shape) if i != k):
        return None
    return c


def _channel_vector(v: Value, c: int) -> Value:
    """``v`` (one value per channel) as a (c,) vector, looking through reshapes that made it."""
    while v.shape != (c,):
        inner = producer(v, "reshape")
        if inner is None or inner.inputs[0].type.size != c:
            return shp.reshape(v, shape=(c,))
        v = inner.inputs[0]
    return v


def _cheap_to_scale(w: Value, out: Value) -> bool:
    """Scaling the weight every call costs less than one pass over a sample's activation."""
    per_sample = prod_dims(out.shape[1:])
    return w.type.size is not None and per_sample is not None and w.type.size <= per_sample


def _rebuilt_conv(conv: Node, node: Node, w: Value, b: Optional[Value]) -> Value:
    x = conv.inputs[0]
    return build(cv.conv, [x, w] + ([b] if b is not None else []), dict(conv.attrs), node)


def _fold_scale_shift(conv: Node, node: Node, scale: Optional[Value], shift: Optional[Value]) -> Optional[Value]:
    """conv(x, w, b) * scale + shift (per output channel, (C,) values) as one conv."""
    w = conv.inputs[1]
    b = conv.inputs[2] if len(conv.inputs) > 2 else None
    y = conv.outputs[0]
    if w.shape[0] is None:
        return None
    parts = [w, scale, shift] + ([b] if b is not None else [])
    if all(p is None or p.kind == CONST for p in parts):
        dt = w.dtype.np
        c = w.shape[0]
        s = np.ones(c) if scale is None else scale.data.astype(np.float64)
        new_w = w.data.astype(np.float64) * s.reshape((c,) + (1,) * (w.ndim - 1))
        new_b = (np.zeros(c) if b is None else b.data.astype(np.float64)) * s
        if shift is not None:
            new_b = new_b + shift.data
        return _rebuilt_conv(conv, node, const_value(new_w.astype(dt)), const_value(new_b.astype(dt)))
    if scale is not None and not _cheap_to_scale(w, y):
        return None
    new_w, new_b = w, b
    if scale is not None:
        new_w = ew.mul(w, shp.reshape(scale, shape=(w.shape[0],) + (1,) * (w.ndim - 1)))
        new_b = None if b is None else ew.mul(b, scale)
    if shift is not None:
        new_b = shift if new_b is None else ew.add(new_b, shift)
    return _rebuilt_conv(conv, node, new_w, new_b)


def _conv_input(v: Value, sole: Callable[[Value], bool]) -> Optional[Node]:
    conv = producer(v, "conv")
    return conv if conv is not None and sole(v) and v.ndim >= 3 else None


def fold_batch_norm(node, inputs, sole):
    if node.attrs["training"] or len(node.outputs) != 1:
        return None
    conv = _conv_input(inputs[0], sole)
    if conv is None or normalize_axis(node.attrs["axis"], inputs[0].ndim) != 1:
        return None
    mean, var = inputs[1], inputs[2]
    gamma = inputs[3] if len(inputs) > 3 else None
    beta = inputs[4] if len(inputs) > 4 else None
    stats = [mean, var] + [v for v in (gamma, beta) if v is not None]
    eps = node.attrs["eps"]
    if all(v.kind == CONST for v in stats):
        gain = 1.0 / np.sqrt(var.data.astype(np.float64) + eps)
        if gamma is not None:
            gain = gain * gamma.data
        shift = -mean.data * gain + (0.0 if beta is None else beta.data)
        dt = var.dtype.np
        return _fold_scale_shift(conv, node, const_value(gain.astype(dt)), const_value(shift.astype(dt)))
    gain = ew.rsqrt(ew.add(var, eps))
    if gamma is not None:
        gain = ew.mul(gain, gamma)
    shift = ew.neg(ew.mul(mean, gain))
    if beta is not None:
        shift = ew.add(shift, beta)
    return _fold_scale_shift(conv, node, gain, shift)


def fold_channel_op(node, inputs, sole):
    """conv * per-channel scale, conv + per-channel shift (either operand order) -> conv."""
    out = node.outputs[0]
    for k in (0, 1):
        conv = _conv_input(inputs[k], sole)
        other = inputs[1 - k]
        if conv is None or out.type != inputs[k].type:
            continue
        c = _per_channel(other, out)
        if c is None:
            continue
        vec = const_value(other.data.reshape(c)) if other.kind == CONST else _channel_vector(other, c)
        if node.op.name == "mul":   # the pattern is conv then mul (a scale) or add (a shift)
            return _fold_scale_shift(conv, node, vec, None)
        return _fold_scale_shift(conv, node, None, vec)
    return None
