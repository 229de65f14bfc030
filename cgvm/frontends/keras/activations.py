"""Keras activation functions as cgvm graph builders (``get("relu")(x)`` builds the nodes)."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict

from ...ir.graph import Value
from ...ops import elementwise as ew
from ...ops import elementwise_math as em
from ...ops import nn
from .backend import to_value
from .serialization import KerasConfigError


def linear(x: Any) -> Value:
    return to_value(x)


def relu(x: Any, negative_slope: float = 0.0, max_value: Any = None, threshold: float = 0.0) -> Value:
    v = to_value(x)
    if threshold != 0.0:
        # f(x) = x for x >= threshold, negative_slope * (x - threshold) below it
        below = ew.mul(ew.sub(v, threshold), negative_slope) if negative_slope else ew.mul(v, 0.0)
        y = ew.where(ew.ge(v, threshold), v, below)
    else:
        y = em.relu(v, negative_slope=float(negative_slope))
    if max_value is not None:
        y = ew.minimum(y, float(max_value))
    return y


def relu6(x: Any) -> Value:
    return ew.clip(to_value(x), lo=0.0, hi=6.0)


def leaky_relu(x: Any, negative_slope: float = 0.2) -> Value:
    return em.relu(to_value(x), negative_slope=float(negative_slope))


def sigmoid(x: Any) -> Value:
    return em.sigmoid(to_value(x))


def tanh(x: Any) -> Value:
    return em.tanh(to_value(x))


def softplus(x: Any) -> Value:
    return em.softplus(to_value(x))


def softsign(x: Any) -> Value:
    v = to_value(x)
    return ew.div(v, ew.add(ew.abs(v), 1.0))


def elu(x: Any, alpha: float = 1.0) -> Value:
    return em.elu(to_value(x), alpha=float(alpha))


def selu(x: Any) -> Value:
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    return ew.mul(em.elu(to_value(x), alpha=alpha), scale)


def exponential(x: Any) -> Value:
    return em.exp(to_value(x))


def silu(x: Any) -> Value:
    v = to_value(x)
    return ew.mul(v, em.sigmoid(v))


def gelu(x: Any, approximate: bool = False) -> Value:
    v = to_value(x)
    if approximate:
        inner = ew.mul(ew.add(v, ew.mul(ew.pow(v, 3.0), 0.044715)), math.sqrt(2.0 / math.pi))
        return ew.mul(ew.mul(v, 0.5), ew.add(em.tanh(inner), 1.0))
    return ew.mul(ew.mul(v, 0.5), ew.add(em.erf(ew.mul(v, 1.0 / math.sqrt(2.0))), 1.0))


def hard_sigmoid(x: Any) -> Value:
    """Keras 3: relu6(x + 3) / 6."""
    return ew.div(relu6(ew.add(to_value(x), 3.0)), 6.0)


def hard_silu(x: Any) -> Value:
    v = to_value(x)
    return ew.mul(v, hard_sigmoid(v))


def softmax(x: Any, axis: int = -1) -> Value:
    return nn.softmax(to_value(x), axis=axis)


def log_softmax(x: Any, axis: int = -1) -> Value:
    return nn.log_softmax(to_value(x), axis=axis)


def mish(x: Any) -> Value:
    v = to_value(x)
    return ew.mul(v, em.tanh(em.softplus(v)))


def log_sigmoid(x: Any) -> Value:
    return ew.neg(em.softplus(ew.neg(to_value(x))))


_ACTIVATIONS: Dict[str, Callable[..., Value]] = {
    "linear": linear, "relu": relu, "relu6": relu6, "leaky_relu": leaky_relu, "sigmoid": sigmoid, "tanh": tanh,
    "softplus": softplus, "softsign": softsign, "elu": elu, "selu": selu, "exponential": exponential,
    "silu": silu, "swish": silu, "gelu": gelu, "hard_sigmoid": hard_sigmoid, "hard_silu": hard_silu,
    "hard_swish": hard_silu, "softmax": softmax, "log_softmax": log_softmax, "mish": mish,
    "log_sigmoid": log_sigmoid,
}
_NAMES = {fn: name for name, fn in _ACTIVATIONS.items() if name not in ("swish", "hard_swish")}


def get(identifier: Any) -> Callable[..., Value]:
    """An activation from a name (``None`` is linear), a serialized dict or a callable."""
    if identifier is None:
        return linear
    if isinstance(identifier, dict):
        identifier = identifier.get("config", identifier.get("class_name"))
        if isinstance(identifier, dict):
            identifier = identifier.get("name")
    if isinstance(identifier, str):
        fn = _ACTIVATIONS.get(identifier)
        if fn is None:
            raise KerasConfigError(f"unknown activation {identifier!r}; known: {', '.join(sorted(_ACTIVATIONS))}")
        return fn
    if callable(identifier):
        return identifier
    raise KerasConfigError(f"cannot use {identifier!r} as an activation")


def serialize(fn: Callable[..., Value]) -> str:
    name = _NAMES.get(fn)
    if name is None:
        name = getattr(fn, "__name__", "linear")
    return name
