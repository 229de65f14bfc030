"""Metrics: per-sample graph functions averaged over each epoch, and stateful Metric objects.

During ``fit`` a metric is a per-sample Value in the compiled step; the epoch value is the
sample-weighted running mean kept in Python (Keras' MeanMetricWrapper). Metric objects used
on their own (``update_state`` with arrays) evaluate the same graph function eagerly.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import numpy as np

from ...ir.graph import Value, input_value
from ...ir.types import TensorType
from ...ops import elementwise as ew
from ...ops import join
from ...ops import reduce as red
from ...ops import shape as shp
from . import losses as losses_mod
from .backend import as_array, get_workspace, to_value
from .serialization import KerasConfigError
from . import metrics_confusion
from .metrics_confusion import AUC, Precision, Recall  # noqa: F401  (keras.metrics.AUC, ...)


def _float(v: Value, like: Value) -> Value:
    return v if v.dtype is like.dtype else ew.cast(v, dtype=like.dtype)


def binary_accuracy(y_true, y_pred, threshold: float = 0.5):
    p = to_value(y_pred)
    t = _float(to_value(y_true), p)
    hit = ew.eq(ew.cast(ew.gt(p, threshold), dtype=p.dtype), t)
    return red.mean(ew.cast(hit, dtype=p.dtype), axis=[-1])


def categorical_accuracy(y_true, y_pred):
    p = to_value(y_pred)
    t = to_value(y_true)
    hit = ew.eq(red.argmax(t, axis=-1), red.argmax(p, axis=-1))
    return ew.cast(hit, dtype=p.dtype)


def sparse_categorical_accuracy(y_true, y_pred):
    p = to_value(y_pred)
    t = to_value(y_true)
    if t.ndim == p.ndim and t.shape[-1] == 1:
        t = shp.squeeze(t, axis=[-1])
    if not t.dtype.is_int:
        t = ew.cast(t, dtype="int64")
    hit = ew.eq(red.argmax(p, axis=-1), ew.cast(t, dtype="int64"))
    return ew.cast(hit, dtype=p.dtype)


def top_k_categorical_accuracy(y_true, y_pred, k: int = 5):
    return sparse_top_k_categorical_accuracy(red.argmax(to_value(y_true), axis=-1), y_pred, k)


def sparse_top_k_categorical_accuracy(y_true, y_pred, k: int = 5):
    p = to_value(y_pred)
    t = to_value(y_true)
    if t.ndim == p.ndim:
        t = shp.squeeze(t, axis=[-1])
    t = ew.cast(t, dtype="int64")
    # the true class is in the top k when fewer than k scores beat it
    true_score = red.sum(ew.mul(p, losses_mod.indexing.one_hot(t, depth=p.shape[-1], dtype=p.dtype)),
                         axis=[-1], keepdims=True)
    better = red.sum(ew.cast(ew.gt(p, true_score), dtype=p.dtype), axis=[-1])
    return ew.cast(ew.lt(better, float(k)), dtype=p.dtype)


_FUNCTIONS: Dict[str, Callable[..., Value]] = {
    "binary_accuracy": binary_accuracy, "categorical_accuracy": categorical_accuracy,
    "sparse_categorical_accuracy": sparse_categorical_accuracy,
    "top_k_categorical_accuracy": top_k_categorical_accuracy,
    "sparse_top_k_categorical_accuracy": sparse_top_k_categorical_accuracy,
    "mean_squared_error": losses_mod.mean_squared_error, "mse": losses_mod.mean_squared_error,
    "mean_absolute_error": losses_mod.mean_absolute_error, "mae": losses_mod.mean_absolute_error,
    "mean_absolute_percentage_error": losses_mod.mean_absolute_percentage_error,
    "mape": losses_mod.mean_absolute_percentage_error,
    "binary_crossentropy": losses_mod.binary_crossentropy,
    "categorical_crossentropy": losses_mod.categorical_crossentropy,
    "sparse_categorical_crossentropy": losses_mod.sparse_categorical_crossentropy,
    "kl_divergence": losses_mod.kl_divergence, "poisson": losses_mod.poisson, "hinge": losses_mod.hinge,
}


class Metric:
    """A running, sample-weighted mean of a per-sample function ``fn(y_true, y_pred)``."""

    def __init__(self, fn: Optional[Callable[..., Value]] = None, name: Optional[str] = None, dtype: Any = None,
                 **options: Any):
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(self).__name__.lower())
        self.options = options
        self._fns: Dict[Any, Any] = {}
        self.reset_state()

    def per_sample(self, y_true: Any, y_pred: Any) -> Value:
        return self.fn(y_true, y_pred, **self.options)

    def _per_sample_and_weights(self, y_true: Any, y_pred: Any, sample_weight: Any):
        per = self.per_sample(y_true, y_pred)
        if sample_weight is None:
            return per, None
        w = to_value(sample_weight)
        w = w if w.dtype is per.dtype else ew.cast(w, dtype=per.dtype)
        while w.ndim < per.ndim:
            w = shp.expand_dims(w, axis=[w.ndim])
        return per, shp.broadcast_like(w, per)

    def batch_value(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Value:
        """Mean of the per-sample values over the batch, weighted by ``sample_weight`` if given."""
        per, w = self._per_sample_and_weights(y_true, y_pred, sample_weight)
        if w is None:
            return red.mean(per)
        return ew.div(red.sum(ew.mul(per, w)), ew.maximum(red.sum(w), 1e-12))

    def batch_sums(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Value:
        """``[sum of weighted values, sum of weights]`` over the batch: what data-parallel ranks add up
        (keras.distribution), so that ``result_from_sums`` of the total is the whole batch's mean."""
        per, w = self._per_sample_and_weights(y_true, y_pred, sample_weight)
        w = shp.ones_like(per) if w is None else w
        one = lambda v: shp.reshape(v, shape=(1,))  # noqa: E731
        return join.concat(one(red.sum(ew.mul(per, w))), one(red.sum(w)), axis=0)

    @staticmethod
    def result_from_sums(sums: Any) -> float:
        """The batch mean from ``batch_sums`` (added over the ranks)."""
        total, weight = (float(v) for v in np.asarray(sums, np.float64).reshape(2))
        return total / max(weight, 1e-12)

    # -- stateful use
    def reset_state(self) -> None:
        self.total = 0.0
        self.count = 0.0

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        t, p = np.asarray(y_true), np.asarray(y_pred, dtype=np.float32)
        if t.dtype == np.float64:
            t = t.astype(np.float32)
        key = (t.shape, t.dtype.name, p.shape)
        fn = self._fns.get(key)
        if fn is None:
            from ...compiled import compile as cg_compile

            tv = input_value(TensorType(t.shape, t.dtype.name), "y_true")
            pv = input_value(TensorType(p.shape, "float32"), "y_pred")
            fn = self._fns[key] = cg_compile([tv, pv], self.per_sample(tv, pv), workspace=get_workspace())
        values = as_array(fn(t, p)).astype(np.float64)
        w = np.ones_like(values) if sample_weight is None else np.broadcast_to(
            np.asarray(sample_weight, dtype=np.float64).reshape(values.shape[:1] + (1,) * (values.ndim - 1)),
            values.shape)
        self.total += float((values * w).sum())
        self.count += float(w.sum())

    def accumulate(self, batch_mean: float, weight: float) -> None:
        self.total += batch_mean * weight
        self.count += weight

    def result(self) -> float:
        return self.total / self.count if self.count else 0.0

    def get_config(self) -> Dict[str, Any]:
        return {"name": self.name, **self.options}

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "Metric":
        return cls(**config)


MeanMetricWrapper = Metric


def _metric_class(name: str, fn: Callable[..., Value], default_name: str):
    def __init__(self, name: Optional[str] = None, dtype: Any = None, **options: Any):
        Metric.__init__(self, fn, name=name or default_name, **options)
    return type(name, (Metric,), {"__init__": __init__, "__module__": __name__})


Accuracy = _metric_class("Accuracy", lambda t, p: ew.cast(ew.eq(to_value(t), to_value(p)), dtype="float32"),
                         "accuracy")
BinaryAccuracy = _metric_class("BinaryAccuracy", binary_accuracy, "binary_accuracy")
CategoricalAccuracy = _metric_class("CategoricalAccuracy", categorical_accuracy, "categorical_accuracy")
SparseCategoricalAccuracy = _metric_class("SparseCategoricalAccuracy", sparse_categorical_accuracy,
                                          "sparse_categorical_accuracy")
TopKCategoricalAccuracy = _metric_class("TopKCategoricalAccuracy", top_k_categorical_accuracy,
                                        "top_k_categorical_accuracy")
SparseTopKCategoricalAccuracy = _metric_class("SparseTopKCategoricalAccuracy", sparse_top_k_categorical_accuracy,
                                              "sparse_top_k_categorical_accuracy")
MeanSquaredError = _metric_class("MeanSquaredError", losses_mod.mean_squared_error, "mean_squared_error")
MeanAbsoluteError = _metric_class("MeanAbsoluteError", losses_mod.mean_absolute_error, "mean_absolute_error")
BinaryCrossentropy = _metric_class("BinaryCrossentropy", losses_mod.binary_crossentropy, "binary_crossentropy")
CategoricalCrossentropy = _metric_class("CategoricalCrossentropy", losses_mod.categorical_crossentropy,
                                        "categorical_crossentropy")
SparseCategoricalCrossentropy = _metric_class("SparseCategoricalCrossentropy",
                                              losses_mod.sparse_categorical_crossentropy,
                                              "sparse_categorical_crossentropy")

_CLASSES = {c.__name__: c for c in (Accuracy, BinaryAccuracy, CategoricalAccuracy, SparseCategoricalAccuracy,
                                    TopKCategoricalAccuracy, SparseTopKCategoricalAccuracy, MeanSquaredError,
                                    MeanAbsoluteError, BinaryCrossentropy, CategoricalCrossentropy,
                                    SparseCategoricalCrossentropy)}


def get(identifier: Any, loss: Any = None, y_true_ndim: Optional[int] = None,
        y_pred_shape: Any = None) -> Metric:
    """A metric object; "accuracy"/"acc" picks binary, sparse or categorical accuracy as Keras does."""
    if isinstance(identifier, (Metric, metrics_confusion.ConfusionMetric)):
        return identifier
    if isinstance(identifier, str) and identifier in metrics_confusion.NAMES:
        return metrics_confusion.NAMES[identifier]()
    if isinstance(identifier, dict) and identifier.get("class_name") in metrics_confusion.CLASSES:
        return metrics_confusion.CLASSES[identifier["class_name"]].from_config(identifier.get("config") or {})
    if isinstance(identifier, str):
        if identifier in ("accuracy", "acc"):
            last = y_pred_shape[-1] if y_pred_shape else None
            lname = losses_mod.loss_name(loss) if loss is not None else ""
            if "binary" in lname or last == 1:
                fn = binary_accuracy
            elif "sparse" in lname or (y_true_ndim is not None and y_pred_shape is not None
                                       and y_true_ndim < len(y_pred_shape)):
                fn = sparse_categorical_accuracy
            else:
                fn = categorical_accuracy
            return Metric(fn, name=identifier)
        if identifier in _FUNCTIONS:
            return Metric(_FUNCTIONS[identifier], name=identifier)
        if identifier in _CLASSES:
            return _CLASSES[identifier]()
        raise KerasConfigError(f"unknown metric {identifier!r}; known: {', '.join(sorted(_FUNCTIONS))}")
    if isinstance(identifier, dict):
        return _CLASSES[identifier["class_name"]].from_config(identifier.get("config") or {})
    if callable(identifier):
        return Metric(identifier)
    raise KerasConfigError(f"cannot use {identifier!r} as a metric")
