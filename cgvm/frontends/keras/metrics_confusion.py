"""Keras 3's confusion-matrix metrics: Precision, Recall and AUC.

Unlike the mean metrics (metrics.py), their epoch value is not a mean of batch values: each batch
contributes weighted counts (true/false positives and negatives at every threshold) and the value
is computed from the counts summed so far. In a compiled step the metric's Value is that vector of
counts; the training loop sums the vectors and calls ``result_from``.

As in Keras: labels count as positive when nonzero, a prediction is positive above a threshold,
every element of (batch, ...) counts (flattened), sample weights (and mask weights) scale a
sample's elements; ``class_id`` keeps one column, ``top_k`` keeps the k largest predictions of a
row as the only candidates (threshold then -1e10 unless given). AUC uses ``num_thresholds``
evenly spaced thresholds (plus -1e-7 and 1 + 1e-7 at the ends), ROC, PR or PRGAIN curve, Riemann
sums (interpolation, minoring, majoring) and for PR with interpolation the Davis-Goadrich closed
form. With ``multi_label=True`` (predictions (batch, labels)) the counts are kept per label, one
curve each, and the value is their mean, or their ``label_weights``-weighted mean; without it,
``label_weights`` scale each label's column in the flattened counts.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ...ir.graph import Value, input_value
from ...ir.types import TensorType
from ...ops import elementwise as ew
from ...ops import elementwise_math as em
from ...ops import indexing
from ...ops import join
from ...ops import reduce as red
from ...ops import shape as shp
from ...ops import sorting
from .backend import as_array, get_workspace, to_value

NEG_INF = -1e10
EPSILON = 1e-7


def _divide_no_nan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b == 0, 0.0, a / np.where(b == 0, 1.0, b))


class ConfusionMetric:
    """Counts tp, fp, tn, fn at ``thresholds`` per batch; ``result_from`` turns summed counts into the value."""

    accumulates_counts = True
    #: counts per label (the last axis of a (batch, labels) prediction) rather than over all elements
    multi_label = False
    #: per-label weights of the flattened counts (AUC without multi_label), or None
    count_weights: Optional[np.ndarray] = None
    #: labels of a multi-label metric, when known before the first batch
    num_labels: Optional[int] = None

    def __init__(self, thresholds: Sequence[float], top_k: Optional[int] = None, class_id: Optional[int] = None,
                 name: Optional[str] = None, from_logits: bool = False):
        self.thresholds = [float(t) for t in thresholds]
        self.top_k = None if top_k is None else int(top_k)
        self.class_id = None if class_id is None else int(class_id)
        self.from_logits = bool(from_logits)
        self.name = name or type(self).__name__.lower()
        self._fns: Dict[Any, Any] = {}
        self.reset_state()

    # -- in a compiled step
    def batch_value(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Value:
        """The batch's counts: [tp..., fp..., tn..., fn...] (one per threshold), weighted; with
        multi_label a (4·thresholds, labels) matrix of them."""
        p = to_value(y_pred)
        t = to_value(y_true)
        if p.dtype.name != "float32":
            p = ew.cast(p, dtype="float32")
        if self.from_logits:
            p = em.sigmoid(p)
        if t.ndim == p.ndim - 1:
            t = shp.expand_dims(t, axis=[t.ndim])
        elif t.ndim == p.ndim + 1 and t.shape[-1] == 1:
            t = shp.squeeze(t, axis=[-1])
        w = None
        if sample_weight is not None:
            w = ew.cast(to_value(sample_weight), dtype="float32")
            while w.ndim < p.ndim:
                w = shp.expand_dims(w, axis=[w.ndim])
        if self.top_k is not None:
            kth = indexing.slice(sorting.sort(p, axis=-1), starts=[-self.top_k], stops=[-self.top_k + 1 or None],
                                 axes=[p.ndim - 1])
            p = ew.where(ew.ge(p, kth), p, ew.add(shp.zeros_like(p), np.float32(NEG_INF)))
        if self.class_id is not None:
            cut = dict(starts=[self.class_id], stops=[self.class_id + 1], axes=[p.ndim - 1])
            p, t = indexing.slice(p, **cut), indexing.slice(t, **cut)
        positive = ew.cast(ew.ne(ew.cast(t, dtype="float32"), np.float32(0)), dtype="float32")
        weight = shp.ones_like(p) if w is None else shp.broadcast_like(w, p)
        if self.count_weights is not None:
            weight = ew.mul(weight, self.count_weights.astype(np.float32))   # one weight per label (last axis)
        if self.multi_label:
            if p.ndim != 2:
                raise ValueError(f"{self.name}: multi_label=True needs predictions of rank 2 (batch, labels), "
                                 f"got shape {tuple(p.shape)}")
            # thresholds x batch x labels, summed over the batch: counts per (threshold, label)
            flat = lambda v: shp.expand_dims(v, axis=[0])  # noqa: E731
            thresholds = np.asarray(self.thresholds, np.float32).reshape(-1, 1, 1)
        else:
            flat = lambda v: shp.reshape(v, shape=(1, -1))  # noqa: E731
            thresholds = np.asarray(self.thresholds, np.float32).reshape(-1, 1)
        p, positive, weight = flat(p), flat(positive), flat(weight)
        above = ew.cast(ew.gt(p, thresholds), dtype="float32")                 # thresholds x elements
        below = ew.sub(np.float32(1), above)
        pos_w = ew.mul(positive, weight)
        neg_w = ew.mul(ew.sub(np.float32(1), positive), weight)
        counts = [red.sum(ew.mul(a, b), axis=[1]) for a, b in ((above, pos_w), (above, neg_w),
                                                               (below, neg_w), (below, pos_w))]
        return join.concat(*counts, axis=0)

    def split(self, counts: np.ndarray):
        """tp, fp, tn, fn: each (thresholds,), or (thresholds, labels) with multi_label."""
        k = len(self.thresholds)
        counts = np.asarray(counts, np.float64)
        counts = counts.reshape((4, k) + counts.shape[1:])
        return counts[0], counts[1], counts[2], counts[3]

    def result_from(self, counts: np.ndarray) -> Any:
        """The metric's value from summed counts (defined by each metric)."""
        raise TypeError(f"{type(self).__name__} defines no result")

    # -- standalone use (update_state / result / reset_state)
    def reset_state(self) -> None:
        labels = () if not self.multi_label else (self.num_labels,) if self.num_labels else None
        # a multi-label metric learns its number of labels from the first batch
        self.counts = None if labels is None else np.zeros((4 * len(self.thresholds),) + labels, np.float64)

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        from ...compiled import compile as cg_compile

        t, p = np.asarray(y_true, np.float32), np.asarray(y_pred, np.float32)
        w = None if sample_weight is None else np.asarray(sample_weight, np.float32)
        key = (t.shape, p.shape, None if w is None else w.shape)
        fn = self._fns.get(key)
        if fn is None:
            tv = input_value(TensorType(t.shape, "float32"), "y_true")
            pv = input_value(TensorType(p.shape, "float32"), "y_pred")
            wv = [] if w is None else [input_value(TensorType(w.shape, "float32"), "sample_weight")]
            fn = self._fns[key] = cg_compile([tv, pv] + wv, self.batch_value(tv, pv, *(wv or [None])),
                                             workspace=get_workspace())
        self.accumulate_counts(as_array(fn(t, p, *([] if w is None else [w]))))

    def accumulate_counts(self, counts: np.ndarray) -> None:
        counts = np.asarray(counts, np.float64)
        if self.counts is not None and self.counts.shape != counts.shape:
            raise ValueError(f"{self.name}: a batch of {counts.shape[-1]} labels after batches of "
                             f"{self.counts.shape[-1]}")
        self.counts = counts if self.counts is None else self.counts + counts

    def result(self) -> float:
        if self.counts is None:     # multi-label, nothing seen yet
            return 0.0
        return self.result_from(self.counts)

    def get_config(self) -> Dict[str, Any]:
        return {"name": self.name}

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "ConfusionMetric":
        return cls(**config)


def _one_or_list(values: np.ndarray) -> Any:
    return float(values[0]) if values.size == 1 else [float(v) for v in values]


class Precision(ConfusionMetric):
    """tp / (tp + fp) (0 when nothing is predicted positive)."""

    def __init__(self, thresholds: Any = None, top_k: Optional[int] = None, class_id: Optional[int] = None,
                 name: Optional[str] = None, dtype: Any = None):
        self.init_thresholds = thresholds
        default = 0.5 if top_k is None else NEG_INF
        given = default if thresholds is None else thresholds
        super().__init__(given if isinstance(given, (list, tuple)) else [given], top_k, class_id, name or "precision")

    def result_from(self, counts):
        tp, fp, _, _ = self.split(counts)
        return _one_or_list(_divide_no_nan(tp, tp + fp))

    def get_config(self):
        return {"name": self.name, "thresholds": self.init_thresholds, "top_k": self.top_k, "class_id": self.class_id}


class Recall(Precision):
    """tp / (tp + fn) (0 when there are no positive labels)."""

    def __init__(self, thresholds: Any = None, top_k: Optional[int] = None, class_id: Optional[int] = None,
                 name: Optional[str] = None, dtype: Any = None):
        super().__init__(thresholds, top_k, class_id, name or "recall")

    def result_from(self, counts):
        tp, _, _, fn = self.split(counts)
        return _one_or_list(_divide_no_nan(tp, tp + fn))


class AUC(ConfusionMetric):
    """Area under the ROC, PR or PRGAIN curve from counts at ``num_thresholds`` thresholds."""

    def __init__(self, num_thresholds: int = 200, curve: str = "ROC", summation_method: str = "interpolation",
                 name: Optional[str] = None, dtype: Any = None, thresholds: Any = None, multi_label: bool = False,
                 num_labels: Optional[int] = None, label_weights: Any = None, from_logits: bool = False):
        curve = str(curve).upper()
        if curve not in ("ROC", "PR", "PRGAIN"):
            raise ValueError(f'AUC curve must be "ROC", "PR" or "PRGAIN", got {curve!r}')
        method = str(summation_method).lower()
        if method not in ("interpolation", "minoring", "majoring"):
            raise ValueError(f"AUC summation_method must be interpolation, minoring or majoring, got {method!r}")
        if num_labels and not multi_label:
            raise ValueError("AUC: num_labels is needed only when multi_label is True")
        if thresholds is not None:
            inner = sorted(float(t) for t in thresholds)
            num_thresholds = len(inner) + 2
        else:
            if num_thresholds <= 1:
                raise ValueError(f"AUC needs num_thresholds > 1, got {num_thresholds}")
            inner = [(i + 1) * 1.0 / (num_thresholds - 1) for i in range(num_thresholds - 2)]
        self.num_thresholds, self.curve, self.summation_method = int(num_thresholds), curve, method
        self._explicit = thresholds
        self.multi_label = bool(multi_label)
        self.num_labels = int(num_labels) if num_labels else None
        self.label_weights = None if label_weights is None else np.asarray(label_weights, np.float64).reshape(-1)
        if self.label_weights is not None and self.num_labels and self.label_weights.size != self.num_labels:
            raise ValueError(f"AUC: {self.label_weights.size} label_weights for num_labels={self.num_labels}")
        # without multi_label the label weights scale the counts; with it, the per-label AUCs (result_from)
        self.count_weights = None if self.multi_label else self.label_weights
        super().__init__([0.0 - EPSILON] + inner + [1.0 + EPSILON], name=name or "auc", from_logits=from_logits)

    def _over_labels(self, terms: np.ndarray) -> float:
        """The sum of a curve's terms: per label and averaged (weighted) with multi_label."""
        if not self.multi_label:
            return float(terms.sum())
        by_label = terms.sum(axis=0)
        if self.label_weights is None:
            return float(by_label.mean())
        if self.label_weights.size != by_label.size:
            raise ValueError(f"AUC: {self.label_weights.size} label_weights for {by_label.size} labels")
        return float(_divide_no_nan(np.sum(by_label * self.label_weights), np.sum(self.label_weights)))

    def result_from(self, counts):
        tp, fp, tn, fn = self.split(counts)
        n = self.num_thresholds
        if self.curve == "PR" and self.summation_method == "interpolation":
            dtp = tp[:n - 1] - tp[1:]
            p = tp + fp
            dp = p[:n - 1] - p[1:]
            slope = _divide_no_nan(dtp, np.maximum(dp, 0))
            intercept = tp[1:] - slope * p[1:]
            both = (p[:n - 1] > 0) & (p[1:] > 0)
            ratio = np.where(both, _divide_no_nan(p[:n - 1], np.maximum(p[1:], 0)), 1.0)
            with np.errstate(divide="ignore"):
                increment = _divide_no_nan(slope * (dtp + intercept * np.log(ratio)), np.maximum(tp[1:] + fn[1:], 0))
            return self._over_labels(increment)
        recall = _divide_no_nan(tp, tp + fn)
        if self.curve == "ROC":
            x, y = _divide_no_nan(fp, fp + tn), recall
        elif self.curve == "PR":
            x, y = recall, _divide_no_nan(tp, tp + fp)
        else:
            # precision-recall gain (Flach and Kull): no true positives give recall gain 0 and
            # precision gain 1, and a recall gain below 0 counts as 0, as in Keras
            scale = _divide_no_nan(tp + fn, tn + fp)
            recall_gain = np.where(tp == 0, 0.0, 1.0 - scale * _divide_no_nan(fn, tp))
            precision_gain = np.where(tp == 0, 1.0, 1.0 - scale * _divide_no_nan(fp, tp))
            x, y = np.maximum(recall_gain, 0.0), precision_gain
        if self.summation_method == "interpolation":
            heights = (y[:n - 1] + y[1:]) / 2.0
        elif self.summation_method == "minoring":
            heights = np.minimum(y[:n - 1], y[1:])
        else:
            heights = np.maximum(y[:n - 1], y[1:])
        return self._over_labels((x[:n - 1] - x[1:]) * heights)

    def get_config(self):
        return {"name": self.name, "num_thresholds": self.num_thresholds, "curve": self.curve,
                "summation_method": self.summation_method, "thresholds": self._explicit,
                "multi_label": self.multi_label, "num_labels": self.num_labels,
                "label_weights": None if self.label_weights is None else [float(v) for v in self.label_weights],
                "from_logits": self.from_logits}


CLASSES = {"Precision": Precision, "Recall": Recall, "AUC": AUC}
NAMES = {"precision": Precision, "recall": Recall, "auc": AUC}


__all__: List[str] = ["Precision", "Recall", "AUC", "ConfusionMetric"]
