"""Neural-network ops: softmax, log-softmax, LRN, batch normalization, dropout, embedding, PReLU.

Layout is NCHW: the channel axis is 1 unless an op's ``axis`` attribute says otherwise.
LRN and batch normalization are declared in ``nn_norm.py`` and re-exported here, so ``nn.lrn``
and ``nn.softmax`` are found alike. Convolution and pooling live in ``conv.py``; the losses in ``loss.py``.

The heavy ops (softmax, LRN, batch norm in training mode) have a dedicated first-order gradient
op that does the whole backward pass in one kernel; each of those gradient ops has a gradient
rule of its own, built from ordinary ops, so every op here can be differentiated to any order
(dropout and embedding are linear, PReLU piecewise linear).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import DTypeError, ShapeError
from ..ir.attrs import Bool, Float, Int
from ..ir.types import TensorType
from . import elementwise as ew
from . import indexing
from . import reduce as red
from . import shape as shp
from .nn_norm import (  # noqa: F401  (re-exported: the nn family's normalization ops)
    ACROSS, WITHIN, batch_norm, batch_norm_grad, lrn, lrn_grad, lrn_window_sum)
from .registry import OPAQUE, defop
from .rules import assign_out as _assign, dims_agree as _dims_agree, normalize_axis, over_steps_along, require_float






# --------------------------------------------------------------------------- softmax, log_softmax

def _softmax_infer(types, axis):
    t = types[0]
    require_float(t, "softmax input")
    if t.ndim == 0:
        raise ShapeError("softmax needs at least one axis, got a 0-d tensor")
    normalize_axis(axis, t.ndim)
    return t


def _softmax_grad_infer(types, axis):
    g, y = types
    if g.ndim != y.ndim or not all(_dims_agree(a, b) for a, b in zip(g.shape, y.shape)):
        raise ShapeError(f"the gradient {g!r} does not match the output {y!r}")
    return _softmax_infer([g], axis)


softmax = defop("softmax", pattern=OPAQUE, infer=_softmax_infer, inplace=((0, 0),), attrs={"axis": Int(1)},
                nonnegative=True,
                doc="exp(x) / sum(exp(x)) along axis (default 1, the channel axis), shifted by the maximum.")


#: NumPy reduces along a short last axis slowly (13 us for the maximum over 10 classes of 128 rows,
#: 3 us with the classes first): (rows, classes) arrays with at most this many classes are
#: normalized in a transposed copy
SHORT_CLASS_AXIS = 32


def classes_first(xp, x, axis: int):
    """A contiguous (classes, rows) copy of a 2-D ``x`` with few classes on its last axis, else None."""
    if x.ndim == 2 and axis % 2 == 1 and x.shape[1] <= SHORT_CLASS_AXIS and x.shape[0] > x.shape[1]:
        return xp.ascontiguousarray(x.T)
    return None


def _transposed_back(xp, t, like, out):
    if out is None:
        out = xp.empty_like(like)
    out[...] = t.T
    return out


def _kept(xp, how: str, x, axis: int):
    """``x`` reduced along ``axis``, the axis kept: on NumPy through ``ufunc.reduce`` itself, without
    numpy.max's and numpy.sum's Python layer (half the cost of a few-row softmax)."""
    if xp is np:
        return (np.maximum if how == "max" else np.add).reduce(x, axis=axis, keepdims=True)
    return (xp.max if how == "max" else xp.sum)(x, axis=axis, keepdims=True)


def softmax_values(xp, x, axis: int, out=None):
    """Softmax of array ``x`` along ``axis`` (stable: the maximum is subtracted first)."""
    t = classes_first(xp, x, axis)
    if t is not None:
        t -= t.max(axis=0)
        xp.exp(t, out=t)
        t /= t.sum(axis=0)
        return _transposed_back(xp, t, x, out)
    y = xp.subtract(x, _kept(xp, "max", x, axis), out=out)
    xp.exp(y, out=y)
    y /= _kept(xp, "sum", y, axis)
    return y


def log_softmax_values(xp, x, axis: int, out=None):
    """Log-softmax of array ``x`` along ``axis``: x - max - log(sum(exp(x - max)))."""
    t = classes_first(xp, x, axis)
    if t is not None:
        t -= t.max(axis=0)
        t -= xp.log(xp.exp(t).sum(axis=0))
        return _transposed_back(xp, t, x, out)
    shift = xp.max(x, axis=axis, keepdims=True)
    y = xp.subtract(x, shift, out=out)
    y -= xp.log(xp.sum(xp.exp(y), axis=axis, keepdims=True))
    return y


@softmax.kernel
def _(xp, x, *, axis, out=None):
    return softmax_values(xp, x, axis, out)


@softmax.grad
def _(node, g):
    return [softmax_grad(g, node.outputs[0], axis=node.attrs["axis"])]


softmax_grad = defop("softmax_grad", num_inputs=2, pattern=OPAQUE, infer=_softmax_grad_infer, inplace=((0, 0),),
                     attrs={"axis": Int(1)},
                     doc="y * (g - sum(g * y, axis)): the gradient of softmax given its output y; linear in g.")


@softmax_grad.kernel
def _(xp, g, y, *, axis, out=None):
    along = _kept(xp, "sum", g * y, axis)
    r = xp.subtract(g, along, out=out)
    r *= y
    return r


@softmax_grad.grad
def _(node, gg):
    # out_i = y_i (g_i - s), s = sum_j g_j y_j. The map g -> out is symmetric, so d/dg is the same
    # op on gg; d/dy_k = gg_k (g_k - s) - g_k t with t = sum_i gg_i y_i.
    g, y = node.inputs
    axis = node.attrs["axis"]
    s = red.sum(ew.mul(g, y), axis=axis, keepdims=True)
    t = red.sum(ew.mul(gg, y), axis=axis, keepdims=True)
    dy = ew.sub(ew.mul(gg, ew.sub(g, s)), ew.mul(g, t))
    return [softmax_grad(gg, y, axis=axis), dy]


for _op in (softmax, softmax_grad):
    _op.over_steps(over_steps_along("axis"))


log_softmax = defop("log_softmax", pattern=OPAQUE, infer=_softmax_infer, inplace=((0, 0),), attrs={"axis": Int(1)},
                    doc="x - logsumexp(x) along axis (default 1), computed without overflow.")


@log_softmax.kernel
def _(xp, x, *, axis, out=None):
    return log_softmax_values(xp, x, axis, out)


@log_softmax.grad
def _(node, g):
    return [log_softmax_grad(g, node.outputs[0], axis=node.attrs["axis"])]


log_softmax_grad = defop("log_softmax_grad", num_inputs=2, pattern=OPAQUE, infer=_softmax_grad_infer,
                         inplace=((0, 0),), attrs={"axis": Int(1)},
                         doc="g - exp(y) * sum(g, axis): the gradient of log_softmax given its output y.")


@log_softmax_grad.kernel
def _(xp, g, y, *, axis, out=None):
    total = xp.sum(g, axis=axis, keepdims=True)
    spread = xp.exp(y)
    spread *= total
    return xp.subtract(g, spread, out=out)


@log_softmax_grad.grad
def _(node, gg):
    # out = g - p S with p = exp(y), S = sum(g): d/dg = gg - sum(gg p), d/dy = -gg p S
    g, y = node.inputs
    axis = node.attrs["axis"]
    p = ew.exp(y)
    dg = ew.sub(gg, red.sum(ew.mul(gg, p), axis=axis, keepdims=True))
    dy = ew.neg(ew.mul(ew.mul(gg, p), red.sum(g, axis=axis, keepdims=True)))
    return [dg, dy]


for _op in (log_softmax, log_softmax_grad):
    _op.over_steps(over_steps_along("axis"))


# --------------------------------------------------------------------------- dropout
# The mask is drawn from xp.random.default_rng(seed) with seed an int64 scalar input (the frontend
# keeps it in the Workspace and advances it), so dropout_grad regenerates the same mask instead of
# keeping it alive between the passes. The draws are float32 whatever x's dtype, so a float64 run
# drops the same elements as a float32 one.

_DROPOUT_ATTRS = {"ratio": Float(0.5), "scale_train": Bool(True)}


def _dropout_infer(types, ratio, scale_train):
    x, seed = types
    require_float(x, "dropout input")
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"dropout ratio must be in [0, 1), got {ratio}")
    if not seed.dtype.is_int or seed.size not in (1, None) or seed.ndim > 1:
        raise DTypeError(f"dropout: the seed must be an integer scalar, got {seed!r}")
    return x


def _dropout_multiplier(xp, seed, shape, dtype, ratio: float, scale_train: bool):
    """0 for dropped elements, 1/(1-ratio) (or 1 without scale_train) for kept ones."""
    rng = xp.random.default_rng(int(seed.reshape(())) & 0x7FFFFFFFFFFFFFFF)  # default_rng wants seed >= 0
    keep = xp.asarray(rng.random(shape, dtype=xp.float32)) >= ratio
    multiplier = keep.astype(dtype)
    if scale_train:
        multiplier *= 1.0 / (1.0 - ratio)
    return multiplier


def _dropout_kernel(xp, x, seed, *, ratio, scale_train, out=None):
    multiplier = _dropout_multiplier(xp, seed, x.shape, x.dtype, ratio, scale_train)
    if out is None:
        return xp.asarray(xp.multiply(x, multiplier))
    return xp.multiply(x, multiplier, out=out)


dropout = defop("dropout", num_inputs=2, pattern=OPAQUE, infer=_dropout_infer, inplace=((0, 0),), stateful=True,
                attrs=_DROPOUT_ATTRS,
                doc="dropout(x, seed): training-time dropout. Each element is kept with probability 1 - ratio "
                    "and scaled by 1/(1 - ratio) (Caffe's inverted dropout; scale_train=False keeps it unscaled, "
                    "as in the caffe-fast-rcnn fork). seed: int64 scalar, the explicit RNG state.")
dropout.kernel(_dropout_kernel)


@dropout.grad
def _(node, g):
    return [dropout_grad(g, node.inputs[1], **node.attrs), None]


dropout_grad = defop("dropout_grad", num_inputs=2, pattern=OPAQUE, infer=_dropout_infer, inplace=((0, 0),),
                     stateful=True, attrs=_DROPOUT_ATTRS,
                     doc="dropout_grad(g, seed): g times the mask dropout drew for the same seed and shape.")
dropout_grad.kernel(_dropout_kernel)


@dropout_grad.grad
def _(node, gg):
    return [dropout_grad(gg, node.inputs[1], **node.attrs), None]


# --------------------------------------------------------------------------- embedding

def _embedding_infer(types):
    indices, weights = types
    if not indices.dtype.is_int:
        raise DTypeError(f"embedding: indices must be integers, got {indices!r}; cast them first")
    if weights.ndim < 1:
        raise ShapeError(f"embedding: weights need at least one axis (the vocabulary), got {weights!r}")
    return TensorType(indices.shape + weights.shape[1:], weights.dtype)


embedding = defop("embedding", num_inputs=2, infer=_embedding_infer,
                  doc="embedding(indices, weights) = weights[indices]: rows of weights (vocabulary, ...) picked "
                      "by integer indices; the output has shape indices.shape + weights.shape[1:]. Negative "
                      "indices count from the end, as in NumPy.")


@embedding.kernel
def _(xp, indices, weights, out=None):
    if out is None:
        return xp.asarray(xp.take(weights, indices, axis=0))
    return xp.take(weights, indices, axis=0, out=out)


@embedding.grad
def _(node, g):
    indices, weights = node.inputs
    return [None, embedding_grad(g, indices, weights)]


embedding_grad = defop("embedding_grad", num_inputs=3, pattern=OPAQUE,
                       infer=lambda types: TensorType(types[2].shape, types[0].dtype),
                       doc="embedding_grad(g, indices, weights): zeros like weights with the rows of g added at "
                           "the indices (weights gives only the shape).")


@embedding_grad.kernel
def _(xp, g, indices, weights, out=None):
    if out is None:
        out = xp.zeros(weights.shape, dtype=g.dtype)
    else:
        out.fill(0)
    rows = indices.reshape(-1)
    indexing.scatter_add(xp, out, rows, g.reshape((rows.size,) + tuple(weights.shape[1:])))
    return out


@embedding_grad.grad
def _(node, gg):
    return [embedding(node.inputs[1], gg), None, None]


# --------------------------------------------------------------------------- PReLU

def _slope_padding(x_ndim: int, axis: int, slope_ndim: int) -> int:
    """How many trailing size-1 axes make the slope line up with x from the channel axis on."""
    return x_ndim - normalize_axis(axis, x_ndim) - slope_ndim


def _prelu_infer(types, axis):
    x, slope = types
    require_float(x, "prelu input")
    if slope.dtype is not x.dtype:
        raise DTypeError(f"prelu: the slope has dtype {slope.dtype}, the input {x.dtype}")
    if x.ndim < 1:
        raise ShapeError("prelu needs at least one axis")
    a = normalize_axis(axis, x.ndim)
    trailing = x.shape[a:]
    fits = slope.ndim <= len(trailing) and all(
        d in (1, None) or _dims_agree(d, xd) for d, xd in zip(slope.shape, trailing))
    if not fits:
        raise ShapeError(f"prelu: the slope {slope!r} must be a scalar, one value per channel, or broadcast "
                         f"against the input's axes from axis {a} on {tuple(trailing)}")
    return x


prelu = defop("prelu", num_inputs=2, pattern=OPAQUE, infer=_prelu_infer, inplace=((0, 0),), attrs={"axis": Int(1)},
              doc="prelu(x, slope): x where x > 0, else slope * x. The slope lines up with x from `axis` (default 1) "
                  "on: shape (C,) is Caffe's channel-wise PReLU, a scalar or (1,) its channel_shared form.")


@prelu.kernel
def _(xp, x, slope, *, axis, out=None):
    aligned = slope.reshape(slope.shape + (1,) * _slope_padding(x.ndim, axis, slope.ndim))
    return _assign(xp, out, xp.where(x > 0, x, x * aligned))


@prelu.grad
def _(node, g):
    x, slope = node.inputs
    pad = _slope_padding(x.ndim, node.attrs["axis"], slope.ndim)
    trailing = tuple(range(slope.ndim, slope.ndim + pad))
    aligned = shp.expand_dims(slope, axis=trailing) if pad else slope
    passed = ew.relu_grad(g, x)                      # g where x > 0
    dx = ew.add(passed, ew.mul(aligned, ew.sub(g, passed)))
    negative_part = ew.sub(x, ew.relu(x))            # min(x, 0)
    dslope = red.sum_to_like(ew.mul(g, negative_part), aligned)
    return [dx, shp.squeeze(dslope, axis=trailing) if pad else dslope]


__all__: Sequence[str] = (
    "ACROSS", "WITHIN", "softmax", "softmax_grad", "log_softmax", "log_softmax_grad", "softmax_values",
    "log_softmax_values", "classes_first",
    "lrn", "lrn_grad", "lrn_window_sum", "batch_norm", "batch_norm_grad", "dropout", "dropout_grad",
    "embedding", "embedding_grad", "prelu")
