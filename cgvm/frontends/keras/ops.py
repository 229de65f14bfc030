"""``keras.ops``: the tensor functions custom layers and Lambda code call, over cgvm ops.

Each takes KerasTensors, Variables, cgvm Values or Theano-style variables and returns a
KerasTensor (recorded as an operation in functional models, direct inside a layer's call).
"""
from __future__ import annotations

from typing import Any

from ...ops import elementwise as ew
from ...ops import elementwise_math as em
from ...ops import linalg
from ...ops import nn
from ...ops import reduce as red
from ...ops import join
from ...ops import shape as shp
from . import activations
from .layers.base import apply_operation


def _op(fn):
    def wrapper(*args: Any, **kwargs: Any):
        return apply_operation(lambda *vals: fn(*vals, **kwargs), *args)
    wrapper.__name__ = getattr(fn, "__name__", "op")
    return wrapper


add, subtract, multiply, divide = _op(ew.add), _op(ew.sub), _op(ew.mul), _op(ew.div)
maximum, minimum, power, negative = _op(ew.maximum), _op(ew.minimum), _op(ew.pow), _op(ew.neg)
square, abs, sign = _op(ew.square), _op(ew.abs), _op(ew.sign)
exp, log, sqrt, tanh = _op(em.exp), _op(em.log), _op(em.sqrt), _op(em.tanh)
sigmoid, relu, softplus = _op(em.sigmoid), _op(activations.relu), _op(em.softplus)
matmul = _op(linalg.matmul)


def sum(x, axis=None, keepdims=False):
    return apply_operation(lambda v: red.sum(v, axis=_axes(axis), keepdims=keepdims), x)


def mean(x, axis=None, keepdims=False):
    return apply_operation(lambda v: red.mean(v, axis=_axes(axis), keepdims=keepdims), x)


def max(x, axis=None, keepdims=False):
    return apply_operation(lambda v: red.max(v, axis=_axes(axis), keepdims=keepdims), x)


def softmax(x, axis=-1):
    return apply_operation(lambda v: nn.softmax(v, axis=axis), x)


def reshape(x, newshape):
    return apply_operation(lambda v: shp.reshape(v, shape=tuple(-1 if d is None else d for d in newshape)), x)


def transpose(x, axes=None):
    return apply_operation(lambda v: shp.transpose(v, perm=axes), x)


def concatenate(xs, axis=0):
    return apply_operation(lambda *vs: join.concat(*vs, axis=axis), *xs)


def expand_dims(x, axis):
    return apply_operation(lambda v: shp.expand_dims(v, axis=_axes(axis)), x)


def squeeze(x, axis=None):
    return apply_operation(lambda v: shp.squeeze(v, axis=_axes(axis)), x)


def clip(x, x_min, x_max):
    return apply_operation(lambda v: ew.clip(v, lo=float(x_min), hi=float(x_max)), x)


def cast(x, dtype):
    return apply_operation(lambda v: ew.cast(v, dtype=dtype), x)


def _axes(axis):
    if axis is None:
        return None
    return list(axis) if isinstance(axis, (list, tuple)) else [axis]
