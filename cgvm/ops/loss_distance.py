"""Loss ops on distances and margins: euclidean and mean squared error, hinge, contrastive.

Caffe's EuclideanLoss, HingeLoss and ContrastiveLoss return a 0-d loss normalized as Caffe does
(see cgvm.ops.loss); ``mse`` follows Keras' reductions. Gradients go to every float input.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ..errors import DTypeError, ShapeError
from ..ir.attrs import Bool, Float, Str
from ..ir.types import TensorType, int64
from . import elementwise as ew
from . import reduce as red
from . import shape as shp
from .loss import check_labels, class_hits, labels_on_axis, one_hot_like, scalar_result, unbroadcast
from .registry import OPAQUE, defop
from .rules import assign_out as _assign, broadcast_shapes, dims_agree as _dims_agree, prod_dims, require_float


# --------------------------------------------------------------------------- euclidean, mse

def _euclidean_infer(types):
    a, b = types
    require_float(a, "euclidean input")
    if b.dtype is not a.dtype:
        raise DTypeError(f"euclidean: inputs have dtypes {a.dtype} and {b.dtype}")
    if a.ndim < 1 or b.ndim < 1 or not _dims_agree(a.shape[0], b.shape[0]):
        raise ShapeError(f"euclidean: inputs {a!r} and {b!r} need the same first (batch) dimension")
    per_a, per_b = prod_dims(a.shape[1:]), prod_dims(b.shape[1:])
    if per_a is not None and per_b is not None and per_a != per_b:
        raise ShapeError(f"euclidean: inputs {a!r} and {b!r} differ in size per sample")
    return TensorType((), a.dtype)


euclidean = defop("euclidean", num_inputs=2, pattern=OPAQUE, infer=_euclidean_infer,
                  doc="Caffe's EuclideanLoss: sum((a - b)^2) / (2 N), N the first dimension; b may have another "
                      "shape with the same size per sample.")


@euclidean.kernel
def _(xp, a, b, out=None):
    diff = a - b.reshape(a.shape)
    return scalar_result(xp, xp.sum(xp.square(diff)) / (2 * max(a.shape[0], 1)), a.dtype, out)


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
        return scalar_result(xp, xp.sum(sq), a.dtype, out)
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
    return [unbroadcast(d_diff, a), unbroadcast(ew.neg(d_diff), b)]


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
    hits = class_hits(xp, labels_on_axis(xp, labels, 2, 1), scores.shape[1], 2, 1)
    margins = xp.maximum(xp.where(hits, -scores, scores) + 1, 0)
    total = xp.sum(margins) if norm == "L1" else xp.sum(xp.square(margins))
    return scalar_result(xp, total / max(scores.shape[0], 1), scores.dtype, out)


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
    return scalar_result(xp, xp.sum(xp.where(similar, d2, apart)) / (2 * max(n, 1)), a.dtype, out)


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


__all__: Sequence[str] = ("euclidean", "mse", "MSE_REDUCTIONS", "hinge", "contrastive")
