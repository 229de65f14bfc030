"""Keras losses as graph builders: ``fn(y_true, y_pred) -> per-sample Value`` (the last axis reduced),
reduced over the batch as Keras' "sum_over_batch_size": ``sum(per_sample * sample_weight) / count``.

Probabilities are clipped to ``[1e-7, 1 - 1e-7]`` and categorical ones renormalized, as Keras does.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional

from ...errors import GraphBuildError
from ...ir.graph import Value
from ...ops import elementwise as ew
from ...ops import elementwise_math as em
from ...ops import indexing
from ...ops import nn
from ...ops import reduce as red
from ...ops import shape as shp
from .backend import epsilon, to_value
from .serialization import KerasConfigError


def _float(y_true: Value, like: Value) -> Value:
    return y_true if y_true.dtype is like.dtype else ew.cast(y_true, dtype=like.dtype)


def _clip(p: Value) -> Value:
    return ew.clip(p, lo=epsilon(), hi=1.0 - epsilon())


def mean_squared_error(y_true, y_pred):
    p = to_value(y_pred)
    return red.mean(ew.square(ew.sub(p, _float(to_value(y_true), p))), axis=[-1])


def mean_absolute_error(y_true, y_pred):
    p = to_value(y_pred)
    return red.mean(ew.abs(ew.sub(p, _float(to_value(y_true), p))), axis=[-1])


def mean_absolute_percentage_error(y_true, y_pred):
    p = to_value(y_pred)
    t = _float(to_value(y_true), p)
    diff = ew.abs(ew.div(ew.sub(t, p), ew.maximum(ew.abs(t), epsilon())))
    return ew.mul(red.mean(diff, axis=[-1]), 100.0)


def mean_squared_logarithmic_error(y_true, y_pred):
    p = to_value(y_pred)
    t = _float(to_value(y_true), p)
    a = em.log(ew.add(ew.maximum(p, epsilon()), 1.0))
    b = em.log(ew.add(ew.maximum(t, epsilon()), 1.0))
    return red.mean(ew.square(ew.sub(a, b)), axis=[-1])


def binary_crossentropy(y_true, y_pred, from_logits: bool = False, label_smoothing: float = 0.0):
    p = to_value(y_pred)
    t = _float(to_value(y_true), p)
    if label_smoothing:
        t = ew.add(ew.mul(t, 1.0 - label_smoothing), 0.5 * label_smoothing)
    if from_logits:
        # max(x, 0) - x t + log(1 + exp(-|x|))
        per = ew.add(ew.sub(em.relu(p), ew.mul(p, t)), em.softplus(ew.neg(ew.abs(p))))
    else:
        q = _clip(p)
        per = ew.neg(ew.add(ew.mul(t, em.log(q)), ew.mul(ew.sub(1.0, t), em.log(ew.sub(1.0, q)))))
    return red.mean(per, axis=[-1])


def categorical_crossentropy(y_true, y_pred, from_logits: bool = False, label_smoothing: float = 0.0,
                             axis: int = -1):
    p = to_value(y_pred)
    t = _float(to_value(y_true), p)
    if label_smoothing:
        k = p.shape[axis]
        t = ew.add(ew.mul(t, 1.0 - label_smoothing), label_smoothing / k)
    if from_logits:
        logp = nn.log_softmax(p, axis=axis)
    else:
        q = ew.div(p, red.sum(p, axis=[axis], keepdims=True))
        logp = em.log(_clip(q))
    return ew.neg(red.sum(ew.mul(t, logp), axis=[axis]))


def sparse_categorical_crossentropy(y_true, y_pred, from_logits: bool = False, axis: int = -1,
                                    ignore_class: Optional[int] = None):
    p = to_value(y_pred)
    t = to_value(y_true)
    if t.ndim == p.ndim and t.shape[-1] == 1:
        t = shp.squeeze(t, axis=[-1])
    if not t.dtype.is_int:
        t = ew.cast(t, dtype="int64")
    onehot = indexing.one_hot(t, depth=p.shape[axis], dtype=p.dtype)
    return categorical_crossentropy(onehot, p, from_logits=from_logits, axis=axis)


def hinge(y_true, y_pred):
    p = to_value(y_pred)
    t = _signed(_float(to_value(y_true), p))
    return red.mean(em.relu(ew.sub(1.0, ew.mul(t, p))), axis=[-1])


def squared_hinge(y_true, y_pred):
    p = to_value(y_pred)
    t = _signed(_float(to_value(y_true), p))
    return red.mean(ew.square(em.relu(ew.sub(1.0, ew.mul(t, p)))), axis=[-1])


def _signed(t: Value) -> Value:
    """Keras maps 0/1 labels to -1/1 for the hinge losses."""
    return ew.where(ew.eq(t, 0.0), shp.full_like(t, value=-1.0), t)


def huber(y_true, y_pred, delta: float = 1.0):
    p = to_value(y_pred)
    err = ew.abs(ew.sub(p, _float(to_value(y_true), p)))
    quad = ew.mul(ew.square(err), 0.5)
    lin = ew.sub(ew.mul(err, delta), 0.5 * delta * delta)
    return red.mean(ew.where(ew.le(err, delta), quad, lin), axis=[-1])


def log_cosh(y_true, y_pred):
    p = to_value(y_pred)
    x = ew.sub(p, _float(to_value(y_true), p))
    # log(cosh(x)) = x + softplus(-2x) - log 2
    return red.mean(ew.sub(ew.add(x, em.softplus(ew.mul(x, -2.0))), math.log(2.0)), axis=[-1])


def kl_divergence(y_true, y_pred):
    p = to_value(y_pred)
    t = ew.clip(_float(to_value(y_true), p), lo=epsilon(), hi=1.0)
    q = ew.clip(p, lo=epsilon(), hi=1.0)
    return red.sum(ew.mul(t, em.log(ew.div(t, q))), axis=[-1])


def poisson(y_true, y_pred):
    p = to_value(y_pred)
    t = _float(to_value(y_true), p)
    return red.mean(ew.sub(p, ew.mul(t, em.log(ew.add(p, epsilon())))), axis=[-1])


def cosine_similarity(y_true, y_pred, axis: int = -1):
    p = to_value(y_pred)
    t = _float(to_value(y_true), p)

    def unit(v):
        return ew.div(v, em.sqrt(ew.maximum(red.sum(ew.square(v), axis=[axis], keepdims=True), 1e-12)))
    return ew.neg(red.sum(ew.mul(unit(t), unit(p)), axis=[axis]))


_FUNCTIONS: Dict[str, Callable[..., Value]] = {
    "mean_squared_error": mean_squared_error, "mse": mean_squared_error,
    "mean_absolute_error": mean_absolute_error, "mae": mean_absolute_error,
    "mean_absolute_percentage_error": mean_absolute_percentage_error, "mape": mean_absolute_percentage_error,
    "mean_squared_logarithmic_error": mean_squared_logarithmic_error, "msle": mean_squared_logarithmic_error,
    "binary_crossentropy": binary_crossentropy, "categorical_crossentropy": categorical_crossentropy,
    "sparse_categorical_crossentropy": sparse_categorical_crossentropy, "hinge": hinge,
    "squared_hinge": squared_hinge, "huber": huber, "log_cosh": log_cosh, "logcosh": log_cosh,
    "kl_divergence": kl_divergence, "kld": kl_divergence, "poisson": poisson,
    "cosine_similarity": cosine_similarity,
}
MSE, MAE = mean_squared_error, mean_absolute_error


class Loss:
    """A loss object: ``loss(y_true, y_pred, sample_weight)`` is the reduced scalar Value."""

    fn: Callable[..., Value] = staticmethod(mean_squared_error)

    def __init__(self, name: Optional[str] = None, reduction: str = "sum_over_batch_size", **options: Any):
        self.name = name or _snake(type(self).__name__)
        self.reduction = reduction
        self.options = options

    def per_sample(self, y_true: Any, y_pred: Any) -> Value:
        return type(self).fn(y_true, y_pred, **self.options)

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None, mask: Any = None) -> Value:
        return reduce_loss(self.per_sample(y_true, y_pred), sample_weight, self.reduction, mask=mask)

    def get_config(self) -> Dict[str, Any]:
        return {"name": self.name, "reduction": self.reduction, **self.options}

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "Loss":
        return cls(**config)


def _snake(name: str) -> str:
    from .backend import snake_case

    return snake_case(name)


def masked_weights(sample_weight: Any, mask: Any, dtype: Any) -> Value:
    """Sample weights times the prediction's mask (as floats), broadcast to the mask's shape."""
    m = to_value(mask)
    m = ew.cast(m, dtype=dtype)
    if sample_weight is None:
        return m
    w = to_value(sample_weight)
    w = w if w.dtype is m.dtype else ew.cast(w, dtype=m.dtype)
    while w.ndim < m.ndim:
        w = shp.expand_dims(w, axis=[w.ndim])
    return ew.mul(m, w)


def reduce_loss(per_sample: Value, sample_weight: Any = None, reduction: str = "sum_over_batch_size",
                mask: Any = None) -> Value:
    """Keras' reductions: "sum_over_batch_size" divides the weighted sum by the element count.

    A ``mask`` (the prediction's Keras mask, e.g. (batch, time) on a sequence output) joins the
    sample weights, and for the mean reductions the sum is divided by the number of unmasked
    entries instead of all of them (Keras 3's ``apply_mask``)."""
    if mask is not None:
        m = ew.cast(to_value(mask), dtype=per_sample.dtype)
        if m.ndim > per_sample.ndim:
            raise GraphBuildError(f"a mask of shape {tuple(m.shape)} cannot weight per-sample losses of shape "
                                  f"{tuple(per_sample.shape)}")
        weights = masked_weights(sample_weight, m, per_sample.dtype)
        if reduction in ("mean", "sum_over_batch_size"):
            # valid entries weigh total/valid, so the mean over all entries is the mean over valid ones
            total = red.reduced_count(m, None, m.dtype)
            valid = red.sum(m)
            scale = ew.where(ew.gt(valid, 0.0), ew.div(total, ew.maximum(valid, 1.0)), 0.0)
            weights = ew.mul(weights, scale)
        return reduce_loss(per_sample, weights, "sum_over_batch_size" if reduction == "mean" else reduction)
    v = per_sample
    if sample_weight is not None:
        w = to_value(sample_weight)
        if w.dtype is not v.dtype:
            w = ew.cast(w, dtype=v.dtype)
        while w.ndim < v.ndim:
            w = shp.expand_dims(w, axis=[w.ndim])
        v = ew.mul(v, w)
    if reduction in ("none", None):
        return v
    total = red.sum(v)
    if reduction == "sum":
        return total
    if reduction == "mean" and sample_weight is not None:
        return ew.div(total, red.sum(ew.mul(shp.ones_like(per_sample), to_value(sample_weight))))
    return red.mean(v) if sample_weight is None else ew.div(total, red.reduced_count(v, None, v.dtype))


def _loss_class(name: str, fn: Callable[..., Value], defaults: Dict[str, Any]):
    def __init__(self, name: Optional[str] = None, reduction: str = "sum_over_batch_size", **options: Any):
        Loss.__init__(self, name=name or _snake(type(self).__name__), reduction=reduction, **{**defaults, **options})
    return type(name, (Loss,), {"fn": staticmethod(fn), "__init__": __init__, "__module__": __name__})


MeanSquaredError = _loss_class("MeanSquaredError", mean_squared_error, {})
MeanAbsoluteError = _loss_class("MeanAbsoluteError", mean_absolute_error, {})
MeanAbsolutePercentageError = _loss_class("MeanAbsolutePercentageError", mean_absolute_percentage_error, {})
MeanSquaredLogarithmicError = _loss_class("MeanSquaredLogarithmicError", mean_squared_logarithmic_error, {})
BinaryCrossentropy = _loss_class("BinaryCrossentropy", binary_crossentropy, {"from_logits": False})
CategoricalCrossentropy = _loss_class("CategoricalCrossentropy", categorical_crossentropy, {"from_logits": False})
SparseCategoricalCrossentropy = _loss_class("SparseCategoricalCrossentropy", sparse_categorical_crossentropy,
                                            {"from_logits": False})
Hinge = _loss_class("Hinge", hinge, {})
SquaredHinge = _loss_class("SquaredHinge", squared_hinge, {})
Huber = _loss_class("Huber", huber, {"delta": 1.0})
LogCosh = _loss_class("LogCosh", log_cosh, {})
KLDivergence = _loss_class("KLDivergence", kl_divergence, {})
Poisson = _loss_class("Poisson", poisson, {})
CosineSimilarity = _loss_class("CosineSimilarity", cosine_similarity, {})

_CLASSES = {c.__name__: c for c in (MeanSquaredError, MeanAbsoluteError, MeanAbsolutePercentageError,
                                    MeanSquaredLogarithmicError, BinaryCrossentropy, CategoricalCrossentropy,
                                    SparseCategoricalCrossentropy, Hinge, SquaredHinge, Huber, LogCosh,
                                    KLDivergence, Poisson, CosineSimilarity)}


def get(identifier: Any) -> Any:
    """A loss object (or plain function) from a name, a config dict, a class instance or a callable."""
    if identifier is None:
        return None
    if isinstance(identifier, str):
        if identifier in _FUNCTIONS:
            return _FUNCTIONS[identifier]
        if identifier in _CLASSES:
            return _CLASSES[identifier]()
        raise KerasConfigError(f"unknown loss {identifier!r}; known: {', '.join(sorted(_FUNCTIONS))}")
    if isinstance(identifier, dict):
        name = identifier.get("class_name")
        if name in _CLASSES:
            config = dict(identifier.get("config") or {})
            config.pop("fn", None)
            return _CLASSES[name].from_config(config)
        return get(identifier.get("config", name) if name == "function" else name)
    return identifier


def loss_name(loss: Any) -> str:
    if isinstance(loss, Loss):
        return loss.name
    return getattr(loss, "__name__", str(loss))
