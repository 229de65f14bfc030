"""Loss ops: softmax and sigmoid cross-entropy on logits, cross-entropies on probabilities; the
losses on distances and margins (euclidean, mean squared error, hinge, contrastive) are in
loss_distance and re-exported here.

Caffe's loss layers (SoftmaxWithLoss, SigmoidCrossEntropyLoss, EuclideanLoss, HingeLoss,
ContrastiveLoss) return a 0-d loss already normalized as Caffe does: ``ignore_label`` drops
positions, and ``normalization`` picks the divisor of the sum (FULL: every position; VALID: the
positions not ignored; BATCH_SIZE: the product of the axes before the class axis; NONE: 1), never
less than 1. ``binary_crossentropy`` and ``categorical_crossentropy`` follow Keras/Theano: they
work on probabilities and return per-element / per-sample values, unreduced; the frontends
reduce them. Gradients go to every float input (labels and similarity flags are constants).
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..errors import DTypeError, ShapeError
from ..ir.attrs import DTypeAttr, Float, Int, Str
from ..ir.graph import Value
from ..ir.types import TensorType, float32
from . import elementwise as ew
from . import nn
from . import reduce as red
from . import shape as shp
from .registry import OPAQUE, defop
from .rules import (assign_out as _assign, broadcast_shapes, dims_agree as _dims_agree, normalize_axis, require_float)

NORMALIZATIONS = ("FULL", "VALID", "BATCH_SIZE", "NONE")




def scalar_result(xp, value, dtype, out):
    """A 0-d result of ``dtype`` (NumPy reductions give scalars, sometimes of a wider type)."""
    return _assign(xp, out, xp.asarray(value, dtype=dtype))




def unbroadcast(g: Value, x: Value) -> Value:
    """Gradient ``g`` summed down to the shape of ``x``."""
    if g.shape == x.shape and None not in x.shape:
        return g
    return red.sum_to_like(g, x)


def _as_float(t: Value, like: Value) -> Value:
    return t if t.dtype is like.dtype else ew.cast(t, dtype=like.dtype)


# --------------------------------------------------------------------------- labels

def check_labels(labels: TensorType, scores: TensorType, axis: int, what: str) -> None:
    """Labels index the class axis of ``scores``: their shape is scores' without that axis, or with it as 1."""
    if not labels.dtype.is_int:
        raise DTypeError(f"{what}: labels must be integers, got {labels!r}; cast them first")
    expected = scores.shape[:axis] + scores.shape[axis + 1:]
    if labels.ndim == scores.ndim:
        fits = _dims_agree(labels.shape[axis], 1) and all(
            _dims_agree(p, q) for p, q in zip(labels.shape[:axis] + labels.shape[axis + 1:], expected))
    else:
        fits = labels.ndim == len(expected) and all(_dims_agree(p, q) for p, q in zip(labels.shape, expected))
    if not fits:
        raise ShapeError(f"{what}: labels {labels!r} do not fit scores {scores!r} with classes on axis {axis}; "
                         f"expected shape {tuple('?' if d is None else d for d in expected)}")


def labels_on_axis(xp, labels, ndim: int, axis: int):
    """Labels as int64 with a size-1 axis where the scores have their classes (ready to broadcast)."""
    if labels.ndim < ndim:
        labels = xp.expand_dims(labels, axis)
    return labels if labels.dtype == xp.int64 else labels.astype(xp.int64)


def class_hits(xp, labels_on_axis, n_classes: int, ndim: int, axis: int):
    """Boolean one-hot: True where the class index along ``axis`` equals the label."""
    classes = xp.arange(n_classes).reshape((n_classes,) + (1,) * (ndim - axis - 1))
    return labels_on_axis == classes


def label_weights(xp, labels, outer_axes: int, ignore_label: Optional[int], normalization: str, dtype):
    """Per-position weight (not ignored) / normalizer, Caffe's LossLayer normalization (divisor at least 1).

    Float labels are truncated to integers before comparing with ``ignore_label``, as Caffe does.
    """
    valid = None
    if ignore_label is not None:
        as_int = labels if labels.dtype.kind in "iu" else labels.astype(xp.int64)
        valid = as_int != ignore_label
    if normalization == "VALID" and valid is not None:
        count = xp.maximum(xp.sum(valid, dtype=dtype), 1)   # stays on the device
        return valid.astype(dtype) / count
    if normalization in ("FULL", "VALID"):
        divisor = labels.size
    elif normalization == "BATCH_SIZE":
        divisor = 1
        for d in labels.shape[:outer_axes]:
            divisor *= d
    else:
        divisor = 1
    weights = xp.full(labels.shape, 1.0 / max(divisor, 1), dtype=dtype)
    if valid is not None:
        weights *= valid
    return weights


def _weights_infer(types, outer_axes, ignore_label, normalization, dtype):
    if outer_axes < 0 or outer_axes > types[0].ndim:
        raise ValueError(f"loss_weights: outer_axes {outer_axes} is out of range for {types[0]!r}")
    return TensorType(types[0].shape, dtype)


loss_weights = defop("loss_weights", pattern=OPAQUE, differentiable=False, infer=_weights_infer,
                     attrs={"outer_axes": Int(1), "ignore_label": Int(None),
                            "normalization": Str("VALID", choices=NORMALIZATIONS), "dtype": DTypeAttr(float32)},
                     doc="Per-position loss weights, shaped like the labels: 0 where the label is ignore_label, "
                         "else 1 / normalizer (BATCH_SIZE counts the first outer_axes axes).")


@loss_weights.kernel
def _(xp, labels, *, outer_axes, ignore_label, normalization, dtype, out=None):
    return _assign(xp, out, label_weights(xp, labels, outer_axes, ignore_label, normalization, dtype.np))


def _one_hot_like_infer(types, axis):
    labels, like = types
    a = normalize_axis(axis, like.ndim)
    check_labels(labels, like, a, "one_hot_like")
    return like


one_hot_like = defop("one_hot_like", num_inputs=2, pattern=OPAQUE, differentiable=False, infer=_one_hot_like_infer,
                     attrs={"axis": Int(1)},
                     doc="one_hot_like(labels, like): like's shape and dtype, 1 where the index along axis is the "
                         "label, else 0; labels outside [0, classes) give rows of zeros.")


@one_hot_like.kernel
def _(xp, labels, like, *, axis, out=None):
    a = axis % like.ndim
    hits = class_hits(xp, labels_on_axis(xp, labels, like.ndim, a), like.shape[a], like.ndim, a)
    return _assign(xp, out, xp.broadcast_to(hits, like.shape).astype(like.dtype))


def _weights_on_axis(labels: Value, logits: Value, axis: int, **attrs) -> Value:
    """loss_weights for softmax-style labels, with a size-1 class axis to broadcast against the logits."""
    w = loss_weights(labels, outer_axes=axis, dtype=logits.dtype, **attrs)
    return shp.expand_dims(w, axis=axis) if labels.ndim < logits.ndim else w


# --------------------------------------------------------------------------- softmax cross-entropy

_SCE_ATTRS = {"axis": Int(1), "ignore_label": Int(None), "normalization": Str("VALID", choices=NORMALIZATIONS)}


def _sce_infer(types, axis, ignore_label, normalization):
    logits, labels = types[-2:]
    require_float(logits, "softmax_cross_entropy logits")
    if logits.ndim < 1:
        raise ShapeError("softmax_cross_entropy: the logits need a class axis")
    check_labels(labels, logits, normalize_axis(axis, logits.ndim), "softmax_cross_entropy")
    return logits if len(types) == 3 else TensorType((), logits.dtype)


softmax_cross_entropy = defop(
    "softmax_cross_entropy", num_inputs=2, pattern=OPAQUE, infer=_sce_infer, attrs=_SCE_ATTRS,
    doc="Caffe's SoftmaxWithLoss: -sum(log_softmax(logits)[label]) over positions whose label is not "
        "ignore_label, divided by the normalizer (default VALID). Labels: integers, shaped like the logits "
        "without the class axis (or with it as 1). Computed from log-softmax, so it never overflows; Caffe "
        "caps each term at -log(FLT_MIN) = 87.3, this op does not.")


def _sce_parts(xp, logits, labels, axis, ignore_label, normalization):
    """(labels with a class axis, made safe to index with, and the weights)."""
    a = axis % logits.ndim
    lab = labels_on_axis(xp, labels, logits.ndim, a)
    weights = label_weights(xp, lab, a, ignore_label, normalization, logits.dtype)
    if ignore_label is not None:
        lab = xp.where(lab == ignore_label, 0, lab)   # ignored labels may lie outside [0, classes)
    return a, lab, weights


def _rows_and_divisor(logits, labels, axis, ignore_label, normalization):
    """For the common case, (rows, the normalizer): 2-D logits with classes on axis 1, one label per
    row, no ignore_label (every normalization then divides by a constant). Else None. This case
    takes about 8 array calls instead of 20 (a small classifier's loss step: 42 -> 10 us)."""
    if logits.ndim != 2 or axis % 2 != 1 or labels.ndim != 1 or ignore_label is not None:
        return None
    n = logits.shape[0]
    return n, (1 if normalization == "NONE" else max(n, 1))


@softmax_cross_entropy.kernel
def _(xp, logits, labels, *, axis, ignore_label, normalization, out=None):
    common = _rows_and_divisor(logits, labels, axis, ignore_label, normalization)
    t = nn.classes_first(xp, logits, 1) if common is not None else None
    if t is not None:
        n, divisor = common
        t -= t.max(axis=0)
        total = xp.log(xp.exp(t).sum(axis=0)).sum() - t[labels, xp.arange(n)].sum()
        return scalar_result(xp, total / divisor, logits.dtype, out)
    a, lab, weights = _sce_parts(xp, logits, labels, axis, ignore_label, normalization)
    picked = xp.take_along_axis(nn.log_softmax_values(xp, logits, a), lab, axis=a)
    return scalar_result(xp, -xp.sum(picked * weights), logits.dtype, out)


@softmax_cross_entropy.grad
def _(node, g):
    logits, labels = node.inputs
    return [softmax_cross_entropy_grad(g, logits, labels, **node.attrs), None]


softmax_cross_entropy_grad = defop(
    "softmax_cross_entropy_grad", num_inputs=3, pattern=OPAQUE, infer=_sce_infer, attrs=_SCE_ATTRS,
    doc="softmax_cross_entropy_grad(g, logits, labels) = g * (softmax(logits) - onehot(labels)) * weight, "
        "zero at ignored positions.")


@softmax_cross_entropy_grad.kernel
def _(xp, g, logits, labels, *, axis, ignore_label, normalization, out=None):
    common = _rows_and_divisor(logits, labels, axis, ignore_label, normalization)
    if common is not None:
        n, divisor = common
        r = nn.softmax_values(xp, logits, 1, out=out)
        r[xp.arange(n), labels] -= 1
        r *= g / divisor
        return r
    a, lab, weights = _sce_parts(xp, logits, labels, axis, ignore_label, normalization)
    r = nn.softmax_values(xp, logits, a, out=out)
    r -= class_hits(xp, lab, logits.shape[a], logits.ndim, a)
    weights *= g
    r *= weights
    return r


@softmax_cross_entropy_grad.grad
def _(node, gg):
    # out = g (p - onehot) w: linear in the scalar g; in the logits through p = softmax
    g, logits, labels = node.inputs
    attrs = node.attrs
    a = normalize_axis(attrs["axis"], logits.ndim)
    per_unit = softmax_cross_entropy_grad(shp.ones_like(g), logits, labels, **attrs)
    d_g = red.sum(ew.mul(gg, per_unit))
    w = _weights_on_axis(labels, logits, a, ignore_label=attrs["ignore_label"],
                         normalization=attrs["normalization"])
    p = nn.softmax(logits, axis=a)
    d_logits = ew.mul(nn.softmax_grad(ew.mul(gg, w), p, axis=a), g)
    return [d_g, d_logits, None]


# --------------------------------------------------------------------------- sigmoid cross-entropy

_SIGCE_ATTRS = {"ignore_label": Int(None), "normalization": Str("BATCH_SIZE", choices=NORMALIZATIONS)}


def _sigce_infer(types, ignore_label, normalization):
    logits, targets = types[-2:]
    require_float(logits, "sigmoid_cross_entropy logits")
    if targets.dtype.is_bool or targets.ndim != logits.ndim or \
            not all(_dims_agree(p, q) for p, q in zip(targets.shape, logits.shape)):
        raise ShapeError(f"sigmoid_cross_entropy: targets {targets!r} must be numbers shaped like the logits "
                         f"{logits!r}")
    if logits.ndim < 1:
        raise ShapeError("sigmoid_cross_entropy: the logits need a batch axis")
    return logits if len(types) == 3 else TensorType((), logits.dtype)


sigmoid_cross_entropy = defop(
    "sigmoid_cross_entropy", num_inputs=2, pattern=OPAQUE, infer=_sigce_infer, attrs=_SIGCE_ATTRS,
    doc="Caffe's SigmoidCrossEntropyLoss: sum over elements of max(x, 0) - x t + log(1 + exp(-|x|)) (the "
        "stable form of -[t log p + (1 - t) log(1 - p)], p = sigmoid(x)), skipping targets equal to "
        "ignore_label, divided by the normalizer (default BATCH_SIZE: the first axis, Caffe's default).")


@sigmoid_cross_entropy.kernel
def _(xp, logits, targets, *, ignore_label, normalization, out=None):
    weights = label_weights(xp, targets, 1, ignore_label, normalization, logits.dtype)
    t = targets.astype(logits.dtype, copy=False)
    per = xp.maximum(logits, 0) - logits * t + xp.log1p(xp.exp(-xp.abs(logits)))
    return scalar_result(xp, xp.sum(per * weights), logits.dtype, out)


def _sigce_weights(targets: Value, logits: Value, attrs) -> Value:
    return loss_weights(targets, outer_axes=1, dtype=logits.dtype, **attrs)


@sigmoid_cross_entropy.grad
def _(node, g):
    logits, targets = node.inputs
    d_logits = sigmoid_cross_entropy_grad(g, logits, targets, **node.attrs)
    d_targets = None
    if targets.dtype.is_float:   # soft targets: d/dt = -x w
        d_targets = ew.neg(ew.mul(ew.mul(logits, _sigce_weights(targets, logits, node.attrs)), g))
    return [d_logits, d_targets]


sigmoid_cross_entropy_grad = defop(
    "sigmoid_cross_entropy_grad", num_inputs=3, pattern=OPAQUE, infer=_sigce_infer, attrs=_SIGCE_ATTRS,
    doc="sigmoid_cross_entropy_grad(g, logits, targets) = g * (sigmoid(logits) - targets) * weight.")


@sigmoid_cross_entropy_grad.kernel
def _(xp, g, logits, targets, *, ignore_label, normalization, out=None):
    weights = label_weights(xp, targets, 1, ignore_label, normalization, logits.dtype)
    weights *= g
    r = xp.multiply(logits, 0.5, out=out)
    xp.tanh(r, out=r)
    r *= 0.5
    r += 0.5                       # sigmoid, without overflow
    r -= targets.astype(logits.dtype, copy=False)
    r *= weights
    return r


@sigmoid_cross_entropy_grad.grad
def _(node, gg):
    g, logits, targets = node.inputs
    w = ew.mul(gg, _sigce_weights(targets, logits, node.attrs))
    p = ew.sigmoid(logits)
    d_g = red.sum(ew.mul(w, ew.sub(p, _as_float(targets, logits))))
    wg = ew.mul(w, g)
    d_logits = ew.mul(wg, ew.mul(p, ew.sub(1.0, p)))
    d_targets = ew.neg(wg) if targets.dtype.is_float else None
    return [d_g, d_logits, d_targets]


# --------------------------------------------------------------------------- cross-entropies on probabilities
# ``eps`` > 0 clips the probabilities to [eps, 1 - eps] first (Keras); the gradient is then zero
# where the clip is active. eps = 0 is the plain formula (Theano).

def _clipped(p: Value, eps: float) -> Value:
    return ew.clip(p, lo=eps, hi=1.0 - eps) if eps > 0 else p


def _unless_clipped(v: Value, p: Value, eps: float) -> Value:
    """``v`` where p lies inside [eps, 1 - eps], else 0."""
    if eps <= 0:
        return v
    inside = ew.logical_and(ew.ge(p, eps), ew.le(p, 1.0 - eps))
    return ew.where(inside, v, shp.zeros_like(v))


def _bce_infer(types, eps):
    p, t = types
    require_float(p, "binary_crossentropy probabilities")
    if t.dtype.is_bool:
        raise DTypeError("binary_crossentropy: targets must be numbers, got bool; cast them")
    if not 0.0 <= eps < 0.5:
        raise ValueError(f"binary_crossentropy: eps must be in [0, 0.5), got {eps}")
    return TensorType(broadcast_shapes(p.shape, t.shape), p.dtype)


binary_crossentropy = defop(
    "binary_crossentropy", num_inputs=2, pattern=OPAQUE, infer=_bce_infer, attrs={"eps": Float(0.0)},
    doc="binary_crossentropy(probs, targets) = -(t log p + (1 - t) log(1 - p)) per element, not reduced "
        "(Theano's T.nnet.binary_crossentropy; Keras takes the mean over the last axis afterwards). eps > 0 "
        "clips p to [eps, 1 - eps] first, as Keras does with its epsilon.")


@binary_crossentropy.kernel
def _(xp, p, t, *, eps, out=None):
    q = xp.clip(p, eps, 1.0 - eps) if eps > 0 else p
    t = t.astype(p.dtype, copy=False)
    return _assign(xp, out, -(t * xp.log(q) + (1 - t) * xp.log1p(-q)))


@binary_crossentropy.grad
def _(node, g):
    p, t = node.inputs
    eps = node.attrs["eps"]
    q = _clipped(p, eps)
    tf = _as_float(t, p)
    # d/dq = (q - t) / (q (1 - q)); d/dt = log(1 - q) - log(q)
    d_q = ew.div(ew.sub(q, tf), ew.mul(q, ew.sub(1.0, q)))
    d_p = unbroadcast(_unless_clipped(ew.mul(g, d_q), p, eps), p)
    d_t = None
    if t.dtype.is_float:
        d_t = unbroadcast(ew.mul(g, ew.sub(ew.log1p(ew.neg(q)), ew.log(q))), t)
    return [d_p, d_t]


def _cce_infer(types, axis, eps):
    p, t = types
    require_float(p, "categorical_crossentropy probabilities")
    if p.ndim < 1:
        raise ShapeError("categorical_crossentropy: the probabilities need a class axis")
    a = normalize_axis(axis, p.ndim)
    if not 0.0 <= eps < 0.5:
        raise ValueError(f"categorical_crossentropy: eps must be in [0, 0.5), got {eps}")
    if t.dtype.is_float:
        if t.ndim != p.ndim or not all(_dims_agree(x, y) for x, y in zip(t.shape, p.shape)):
            raise ShapeError(f"categorical_crossentropy: float targets {t!r} must be shaped like the "
                             f"probabilities {p!r}")
    else:
        check_labels(t, p, a, "categorical_crossentropy")
    return TensorType(p.shape[:a] + p.shape[a + 1:], p.dtype)


categorical_crossentropy = defop(
    "categorical_crossentropy", num_inputs=2, pattern=OPAQUE, infer=_cce_infer,
    attrs={"axis": Int(1), "eps": Float(0.0)},
    doc="categorical_crossentropy(probs, targets) = -sum(t log p) along axis (default 1, the class axis), one "
        "value per sample, not reduced. Targets: one-hot or soft distributions shaped like probs, or integer "
        "class indices (Theano's T.nnet.categorical_crossentropy). eps > 0 clips p to [eps, 1 - eps] (Keras; "
        "Keras also rescales p to sum to 1 first, which its frontend does).")


@categorical_crossentropy.kernel
def _(xp, p, t, *, axis, eps, out=None):
    a = axis % p.ndim
    q = xp.clip(p, eps, 1.0 - eps) if eps > 0 else p
    if t.dtype.kind == "f":
        r = -xp.sum(t * xp.log(q), axis=a)
    else:
        picked = xp.take_along_axis(q, labels_on_axis(xp, t, p.ndim, a), axis=a)
        r = -xp.log(xp.squeeze(picked, axis=a))
    return _assign(xp, out, r)


@categorical_crossentropy.grad
def _(node, g):
    p, t = node.inputs
    a = normalize_axis(node.attrs["axis"], p.ndim)
    eps = node.attrs["eps"]
    q = _clipped(p, eps)
    target = t if t.dtype.is_float else one_hot_like(t, p, axis=a)
    g_on_axis = shp.expand_dims(g, axis=a)
    d_p = _unless_clipped(ew.neg(ew.mul(g_on_axis, ew.div(target, q))), p, eps)
    d_t = ew.neg(ew.mul(g_on_axis, ew.log(q))) if t.dtype.is_float else None
    return [d_p, d_t]


# the losses on distances and margins, declared in their own module (they read the helpers above)
from .loss_distance import MSE_REDUCTIONS, contrastive, euclidean, hinge, mse  # noqa: E402

__all__: Sequence[str] = (
    "NORMALIZATIONS", "loss_weights", "one_hot_like", "softmax_cross_entropy", "softmax_cross_entropy_grad",
    "sigmoid_cross_entropy", "sigmoid_cross_entropy_grad", "binary_crossentropy", "categorical_crossentropy",
    "euclidean", "mse", "MSE_REDUCTIONS", "hinge", "contrastive", "check_labels", "label_weights")
