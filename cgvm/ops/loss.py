"""Loss ops: softmax and sigmoid cross-entropy on logits, cross-entropies on probabilities,
euclidean, mean squared error, hinge and contrastive loss.

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
from ..ir.attrs import Bool, DTypeAttr, Float, Int, Str
from ..ir.graph import Value
from ..ir.types import TensorType, float32, int64
from . import elementwise as ew
from . import nn
from . import reduce as red
from . import shape as shp
from .registry import OPAQUE, defop
from .rules import (assign_out as _assign, broadcast_shapes, dims_agree as _dims_agree, normalize_axis, require_float)

NORMALIZATIONS = ("FULL", "VALID", "BATCH_SIZE", "NONE")




def _scalar(xp, value, dtype, out):
    """A 0-d result of ``dtype`` (NumPy reductions give scalars, sometimes of a wider type)."""
    return _assign(xp, out, xp.asarray(value, dtype=dtype))




def _unbroadcast(g: Value, x: Value) -> Value:
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


def _labels_on_axis(xp, labels, ndim: int, axis: int):
    """Labels as int64 with a size-1 axis where the scores have their classes (ready to broadcast)."""
    if labels.ndim < ndim:
        labels = xp.expand_dims(labels, axis)
    return labels if labels.dtype == xp.int64 else labels.astype(xp.int64)


def _class_hits(xp, labels_on_axis, n_classes: int, ndim: int, axis: int):
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
    hits = _class_hits(xp, _labels_on_axis(xp, labels, like.ndim, a), like.shape[a], like.ndim, a)
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
    lab = _labels_on_axis(xp, labels, logits.ndim, a)
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
        return _scalar(xp, total / divisor, logits.dtype, out)
    a, lab, weights = _sce_parts(xp, logits, labels, axis, ignore_label, normalization)
    picked = xp.take_along_axis(nn.log_softmax_values(xp, logits, a), lab, axis=a)
    return _scalar(xp, -xp.sum(picked * weights), logits.dtype, out)


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
    r -= _class_hits(xp, lab, logits.shape[a], logits.ndim, a)
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
    return _scalar(xp, xp.sum(per * weights), logits.dtype, out)


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
    d_p = _unbroadcast(_unless_clipped(ew.mul(g, d_q), p, eps), p)
    d_t = None
    if t.dtype.is_float:
        d_t = _unbroadcast(ew.mul(g, ew.sub(ew.log1p(ew.neg(q)), ew.log(q))), t)
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
        picked = xp.take_along_axis(q, _labels_on_axis(xp, t, p.ndim, a), axis=a)
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


# --------------------------------------------------------------------------- euclidean, mse

def _euclidean_infer(types):
    a, b = types
    require_float(a, "euclidean input")
    if b.dtype is not a.dtype:
        raise DTypeError(f"euclidean: inputs have dtypes {a.dtype} and {b.dtype}")
    if a.ndim < 1 or b.ndim < 1 or not _dims_agree(a.shape[0], b.shape[0]):
        raise ShapeError(f"euclidean: inputs {a!r} and {b!r} need the same first (batch) dimension")
    per_a, per_b = _prod(a.shape[1:]), _prod(b.shape[1:])
    if per_a is not None and per_b is not None and per_a != per_b:
        raise ShapeError(f"euclidean: inputs {a!r} and {b!r} differ in size per sample")
    return TensorType((), a.dtype)


def _prod(dims: Sequence[Optional[int]]) -> Optional[int]:
    n = 1
    for d in dims:
        if d is None:
            return None
        n *= d
    return n


euclidean = defop("euclidean", num_inputs=2, pattern=OPAQUE, infer=_euclidean_infer,
                  doc="Caffe's EuclideanLoss: sum((a - b)^2) / (2 N), N the first dimension; b may have another "
                      "shape with the same size per sample.")


@euclidean.kernel
def _(xp, a, b, out=None):
    diff = a - b.reshape(a.shape)
    return _scalar(xp, xp.sum(xp.square(diff)) / (2 * max(a.shape[0], 1)), a.dtype, out)


@euclidean.grad
def _(node, g):
    a, b = node.inputs
    diff = ew.sub(a, shp.reshape_like(b, a))
    d_a = ew.mul(diff, ew.div(g, red.reduced_count(a, (0,), a.dtype)))
    return [d_a, shp.reshape_like(ew.neg(d_a), b)]


MSE_REDUCTIONS = ("mean", "sum", "none", "per_sample", "last_axis")


def _mse_axes(ndim: int, reduction: str) -> Optional[Sequence[int]]:
    """The axes mse averages over (None: all), for the reductions that average."""
    return {"mean": None, "per_sample": tuple(range(1, ndim)), "last_axis": (ndim - 1,)}[reduction]


def _mse_infer(types, reduction):
    a, b = types
    require_float(a, "mse input")
    if b.dtype is not a.dtype:
        raise DTypeError(f"mse: inputs have dtypes {a.dtype} and {b.dtype}")
    shape = broadcast_shapes(a.shape, b.shape)
    if reduction in ("mean", "sum"):
        return TensorType((), a.dtype)
    if reduction == "none":
        return TensorType(shape, a.dtype)
    if not shape:
        raise ShapeError(f"mse with reduction {reduction!r} needs at least one axis")
    return TensorType(shape[:1] if reduction == "per_sample" else shape[:-1], a.dtype)


mse = defop("mse", num_inputs=2, pattern=OPAQUE, infer=_mse_infer,
            attrs={"reduction": Str("mean", choices=MSE_REDUCTIONS)},
            doc="Mean squared error of a - b (they broadcast). reduction: 'mean' over all elements (0-d), 'sum', "
                "'none' (elementwise), 'per_sample' (mean over all axes but the first, shape (N,)), 'last_axis' "
                "(mean over the last axis, as Keras' mean_squared_error).")


@mse.kernel
def _(xp, a, b, *, reduction, out=None):
    sq = xp.square(a - b)
    if reduction == "none":
        return _assign(xp, out, sq)
    if reduction == "sum":
        return _scalar(xp, xp.sum(sq), a.dtype, out)
    return _assign(xp, out, xp.asarray(xp.mean(sq, axis=_mse_axes(sq.ndim, reduction)), dtype=a.dtype))


@mse.grad
def _(node, g):
    a, b = node.inputs
    reduction = node.attrs["reduction"]
    diff = ew.sub(a, b)
    if reduction in ("none", "sum"):
        spread = g          # broadcasts against diff
    else:
        axes = _mse_axes(diff.ndim, reduction)
        kept = g if not axes else shp.expand_dims(g, axis=axes)
        spread = ew.div(kept, red.reduced_count(diff, axes, a.dtype))
    d_diff = ew.mul(ew.mul(diff, 2.0), spread)
    return [_unbroadcast(d_diff, a), _unbroadcast(ew.neg(d_diff), b)]


# --------------------------------------------------------------------------- hinge

def _hinge_infer(types, norm):
    scores, labels = types
    require_float(scores, "hinge scores")
    if scores.ndim != 2:
        raise ShapeError(f"hinge: scores must be (N, classes), got {scores!r}")
    check_labels(labels, scores, 1, "hinge")
    return TensorType((), scores.dtype)


hinge = defop("hinge", num_inputs=2, pattern=OPAQUE, infer=_hinge_infer,
              attrs={"norm": Str("L1", choices=("L1", "L2"))},
              doc="Caffe's HingeLoss on scores (N, D) and integer labels (N,): with t = scores, the true class "
                  "negated, l = max(0, 1 + t); L1: sum(l) / N, L2: sum(l^2) / N.")


@hinge.kernel
def _(xp, scores, labels, *, norm, out=None):
    hits = _class_hits(xp, _labels_on_axis(xp, labels, 2, 1), scores.shape[1], 2, 1)
    margins = xp.maximum(xp.where(hits, -scores, scores) + 1, 0)
    total = xp.sum(margins) if norm == "L1" else xp.sum(xp.square(margins))
    return _scalar(xp, total / max(scores.shape[0], 1), scores.dtype, out)


@hinge.grad
def _(node, g):
    scores, labels = node.inputs
    sign = ew.sub(1.0, ew.mul(one_hot_like(labels, scores, axis=1), 2.0))   # -1 at the true class
    before_max = ew.add(ew.mul(scores, sign), 1.0)
    per_sample = ew.div(g, red.reduced_count(scores, (0,), scores.dtype))
    if node.attrs["norm"] == "L1":
        return [ew.relu_grad(ew.mul(sign, per_sample), before_max), None]   # sign where the margin is active
    return [ew.mul(ew.mul(sign, ew.relu(before_max)), ew.mul(per_sample, 2.0)), None]


# --------------------------------------------------------------------------- contrastive

def _contrastive_infer(types, margin, legacy_version):
    a, b, y = types
    require_float(a, "contrastive input")
    if b.dtype is not a.dtype or b.ndim != a.ndim or not all(_dims_agree(p, q) for p, q in zip(a.shape, b.shape)):
        raise ShapeError(f"contrastive: the two inputs {a!r} and {b!r} must have one shape and dtype")
    if a.ndim < 1:
        raise ShapeError("contrastive: the inputs need a batch axis")
    if y.dtype.is_bool or y.ndim < 1 or not _dims_agree(y.shape[0], a.shape[0]) or \
            not all(_dims_agree(d, 1) for d in y.shape[1:]):
        raise ShapeError(f"contrastive: the similarity labels {y!r} must be numbers, one per sample "
                         f"({a.shape[0] if a.shape[0] is not None else '?'},)")
    return TensorType((), a.dtype)


contrastive = defop(
    "contrastive", num_inputs=3, pattern=OPAQUE, infer=_contrastive_infer,
    attrs={"margin": Float(1.0), "legacy_version": Bool(False)},
    doc="Caffe's ContrastiveLoss(a, b, y): d^2 = |a_i - b_i|^2 over the non-batch axes; similar pairs (int(y) != 0) "
        "add d^2, dissimilar ones max(margin - d, 0)^2 (legacy_version: max(margin - d^2, 0)); the sum is divided "
        "by 2 N. The gradient at d = 0 of a dissimilar pair is 0, as in Caffe.")


@contrastive.kernel
def _(xp, a, b, y, *, margin, legacy_version, out=None):
    n = a.shape[0]
    d2 = xp.sum(xp.square((a - b).reshape(n, -1)), axis=1)
    flags = y.reshape(n)
    similar = (flags if flags.dtype.kind in "iu" else flags.astype(xp.int64)) != 0
    if legacy_version:
        apart = xp.maximum(margin - d2, 0)
    else:
        apart = xp.square(xp.maximum(margin - xp.sqrt(d2), 0))
    return _scalar(xp, xp.sum(xp.where(similar, d2, apart)) / (2 * max(n, 1)), a.dtype, out)


@contrastive.grad
def _(node, g):
    # d loss / d(a - b) = (a - b) f / N with f = 1 (similar), -[d^2 < margin] (legacy) or
    # -(margin - d) / d [d < margin] (default, 0 at d = 0)
    a, b, y = node.inputs
    margin = node.attrs["margin"]
    feature_axes = tuple(range(1, a.ndim))
    diff = ew.sub(a, b)
    d2 = red.sum(ew.square(diff), axis=feature_axes)
    as_int = y if y.dtype.is_int else ew.cast(y, dtype=int64)
    similar = shp.reshape_like(ew.ne(as_int, 0), d2)
    if node.attrs["legacy_version"]:
        apart = ew.neg(ew.cast(ew.lt(d2, margin), dtype=a.dtype))
    else:
        positive = ew.gt(d2, 0)
        dist = ew.sqrt(ew.where(positive, d2, shp.ones_like(d2)))   # sqrt'(0) never enters the gradient
        pull = ew.neg(ew.div(ew.sub(margin, dist), dist))
        apart = ew.where(ew.logical_and(positive, ew.lt(dist, margin)), pull, shp.zeros_like(d2))
    factor = ew.where(similar, shp.ones_like(d2), apart)
    factor = ew.mul(factor, ew.div(g, red.reduced_count(a, (0,), a.dtype)))
    d_a = ew.mul(diff, shp.expand_dims(factor, axis=feature_axes) if feature_axes else factor)
    return [d_a, ew.neg(d_a), None]


__all__: Sequence[str] = (
    "NORMALIZATIONS", "loss_weights", "one_hot_like", "softmax_cross_entropy", "softmax_cross_entropy_grad",
    "sigmoid_cross_entropy", "sigmoid_cross_entropy_grad", "binary_crossentropy", "categorical_crossentropy",
    "euclidean", "mse", "hinge", "contrastive", "check_labels", "label_weights")
