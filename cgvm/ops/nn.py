"""Neural-network ops: softmax, log-softmax, LRN, batch normalization, dropout, embedding, PReLU.

Layout is NCHW: the channel axis is 1 unless an op's ``axis`` attribute says otherwise.
Convolution and pooling live in ``conv.py``; the loss functions in ``loss.py``.

The heavy ops (softmax, LRN, batch norm in training mode) have a dedicated first-order gradient
op that does the whole backward pass in one kernel; each of those gradient ops has a gradient
rule of its own, built from ordinary ops, so every op here can be differentiated to any order
(dropout and embedding are linear, PReLU piecewise linear).
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

from ..errors import DTypeError, ShapeError
from ..ir.attrs import Bool, Float, Int, Str
from ..ir.graph import Value
from ..ir.types import TensorType
from . import elementwise as ew
from . import reduce as red
from . import shape as shp
from .registry import INJECTIVE, OPAQUE, defop
from .rules import normalize_axis, require_float


def _assign(xp, out, value):
    """Write ``value`` into the planned buffer ``out``, or hand it back as an array when there is none."""
    if out is None:
        return xp.asarray(value)
    out[...] = value
    return out


def _dims_agree(a: Optional[int], b: Optional[int]) -> bool:
    return a is None or b is None or a == b


def _add(a: Optional[Value], b: Optional[Value]) -> Optional[Value]:
    """Sum of two gradient terms where ``None`` stands for zero."""
    if a is None:
        return b
    return a if b is None else ew.add(a, b)


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
                doc="exp(x) / sum(exp(x)) along axis (default 1, the channel axis), shifted by the maximum.")


def softmax_values(xp, x, axis: int, out=None):
    """Softmax of array ``x`` along ``axis`` (stable: the maximum is subtracted first)."""
    shift = xp.max(x, axis=axis, keepdims=True)
    y = xp.subtract(x, shift, out=out)
    xp.exp(y, out=y)
    y /= xp.sum(y, axis=axis, keepdims=True)
    return y


def log_softmax_values(xp, x, axis: int, out=None):
    """Log-softmax of array ``x`` along ``axis``: x - max - log(sum(exp(x - max)))."""
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
    along = xp.sum(g * y, axis=axis, keepdims=True)
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


# --------------------------------------------------------------------------- LRN
# Caffe's formulas. ACROSS_CHANNELS: s = k + alpha/n * (sum of x^2 over the n channels centred on
# each channel, zero beyond the edges). WITHIN_CHANNEL: s = 1 + alpha/n^2 * (sum of x^2 over the
# n x n spatial window, zero-padded) -- Caffe builds it from AVE pooling, whose divisor counts the
# padding, so it is always n^2, and ``k`` is not used. Then y = x * s^-beta.

ACROSS, WITHIN = "ACROSS_CHANNELS", "WITHIN_CHANNEL"
_WINDOW_ATTRS = {"local_size": Int(5), "norm_region": Str(ACROSS, choices=(ACROSS, WITHIN))}
_LRN_ATTRS = dict(_WINDOW_ATTRS, alpha=Float(1.0), beta=Float(0.75), k=Float(1.0))


def _lrn_infer(types, local_size, norm_region, **_):
    t = types[-1]
    require_float(t, "lrn input")
    if local_size < 1 or local_size % 2 == 0:
        raise ValueError(f"lrn: local_size must be a positive odd number, got {local_size}")
    if norm_region == WITHIN and t.ndim != 4:
        raise ShapeError(f"lrn WITHIN_CHANNEL needs a 4-D (N, C, H, W) input, got {t!r}")
    if t.ndim < 2:
        raise ShapeError(f"lrn needs an (N, C, ...) input, got {t!r}")
    for other in types[:-1]:
        if other.ndim != t.ndim or not all(_dims_agree(a, b) for a, b in zip(other.shape, t.shape)):
            raise ShapeError(f"the gradient {other!r} does not match the input {t!r}")
    return types[0]


def _centred_window_sum(xp, a, axis: int, size: int):
    """Sum of ``a`` over a window of ``size`` (odd) centred on each position along ``axis``, zero-padded."""
    n = a.shape[axis]
    total = a.copy()
    lead = (slice(None),) * axis
    for d in range(1, min(size // 2, n - 1) + 1):
        head, tail = lead + (slice(0, n - d),), lead + (slice(d, n),)
        total[head] += a[tail]   # position c gains c + d
        total[tail] += a[head]   # position c gains c - d
    return total


def _lrn_window(xp, a, local_size: int, norm_region: str):
    if norm_region == ACROSS:
        return _centred_window_sum(xp, a, 1, local_size)
    # a zero-padded n x n box is the product of two 1-D windows
    return _centred_window_sum(xp, _centred_window_sum(xp, a, 2, local_size), 3, local_size)


def _lrn_coefficients(local_size: int, norm_region: str, alpha: float, k: float) -> Tuple[float, float]:
    """(coef, base) with s = base + coef * window_sum(x^2)."""
    if norm_region == ACROSS:
        return alpha / local_size, k
    return alpha / (local_size * local_size), 1.0


def _lrn_scale(xp, x, local_size, norm_region, alpha, k):
    coef, base = _lrn_coefficients(local_size, norm_region, alpha, k)
    s = _lrn_window(xp, xp.square(x), local_size, norm_region)
    s *= coef
    s += base
    return s


lrn = defop("lrn", pattern=OPAQUE, infer=_lrn_infer, inplace=((0, 0),), attrs=_LRN_ATTRS,
            doc="Local response normalization as Caffe computes it: y = x * s^-beta with s = k + alpha/n * "
                "(sum of x^2 over n neighbouring channels) across channels, or s = 1 + alpha/n^2 * (sum over "
                "an n x n window) within a channel (k unused there).")


@lrn.kernel
def _(xp, x, *, local_size, norm_region, alpha, beta, k, out=None):
    s = _lrn_scale(xp, x, local_size, norm_region, alpha, k)
    xp.power(s, -beta, out=s)
    return xp.multiply(x, s, out=out)


@lrn.grad
def _(node, g):
    return [lrn_grad(g, node.inputs[0], **node.attrs)]


lrn_grad = defop("lrn_grad", num_inputs=2, pattern=OPAQUE, infer=_lrn_infer, attrs=_LRN_ATTRS,
                 doc="The gradient of lrn at x for output gradient g (Caffe's backward formula, one kernel).")


@lrn_grad.kernel
def _(xp, g, x, *, local_size, norm_region, alpha, beta, k, out=None):
    # dx = g s^-beta - (2 alpha beta / n) x W(g x s^(-beta-1)), W the (self-adjoint) window sum
    coef, _ = _lrn_coefficients(local_size, norm_region, alpha, k)
    s = _lrn_scale(xp, x, local_size, norm_region, alpha, k)
    p = xp.power(s, -beta)
    inner = g * x
    inner *= p
    inner /= s
    back = _lrn_window(xp, inner, local_size, norm_region)
    back *= x
    back *= 2.0 * coef * beta
    r = xp.multiply(g, p, out=out)
    r -= back
    return r


@lrn_grad.grad
def _(node, gg):
    # lrn_grad(g, x) = g P0 - C x W(g x P1) with Pe = s^e, P0 = s^-b, P1 = s^(-b-1), P2 = s^(-b-2),
    # C = 2 coef b and ds_i/dx_j = 2 coef x_j [j in window(i)]. With U = W(g x P1), V = W(gg x):
    #   d/dg = gg P0 - C x P1 V
    #   d/dx = -C (x W(gg g P1) + gg U + V g P1 + 2 coef (-b-1) x W(V g x P2))
    g, x = node.inputs
    attrs = node.attrs
    beta = attrs["beta"]
    coef, base = _lrn_coefficients(attrs["local_size"], attrs["norm_region"], attrs["alpha"], attrs["k"])
    big_c = 2.0 * coef * beta

    def window(v):
        return lrn_window_sum(v, local_size=attrs["local_size"], norm_region=attrs["norm_region"])

    s = ew.add(ew.mul(window(ew.square(x)), coef), base)
    p0, p1, p2 = ew.pow(s, -beta), ew.pow(s, -beta - 1.0), ew.pow(s, -beta - 2.0)
    v = window(ew.mul(gg, x))
    u = window(ew.mul(ew.mul(g, x), p1))
    dg = ew.sub(ew.mul(gg, p0), ew.mul(ew.mul(x, p1), ew.mul(v, big_c)))
    vg = ew.mul(v, g)
    terms = ew.add(ew.add(ew.mul(x, window(ew.mul(ew.mul(gg, g), p1))), ew.mul(gg, u)),
                   ew.add(ew.mul(vg, p1), ew.mul(ew.mul(x, window(ew.mul(ew.mul(vg, x), p2))),
                                                 2.0 * coef * (-beta - 1.0))))
    return [dg, ew.mul(terms, -big_c)]


lrn_window_sum = defop("lrn_window_sum", pattern=OPAQUE, infer=_lrn_infer, attrs=_WINDOW_ATTRS,
                       doc="The zero-padded window sum LRN uses (channels, or an n x n spatial box); linear "
                           "and self-adjoint.")


@lrn_window_sum.kernel
def _(xp, x, *, local_size, norm_region, out=None):
    return _assign(xp, out, _lrn_window(xp, x, local_size, norm_region))


@lrn_window_sum.grad
def _(node, g):
    return [lrn_window_sum(g, **node.attrs)]


# --------------------------------------------------------------------------- batch normalization
# Statistics run over every axis but the channel axis. In training mode the op also returns the
# batch mean and the *biased* batch variance (what it normalizes with); Caffe stores
# m/(m-1) * var in its running variance, so a frontend applies that correction itself.

_BN_ATTRS = {"eps": Float(1e-5), "training": Bool(False), "axis": Int(1)}


def _bn_axes(ndim: int, axis: int) -> Tuple[Tuple[int, ...], int]:
    """(the reduced axes, the channel axis)."""
    a = normalize_axis(axis, ndim)
    return tuple(i for i in range(ndim) if i != a), a


def _bn_infer(types, eps, training, axis):
    x = types[0]
    require_float(x, "batch_norm input")
    if x.ndim < 2:
        raise ShapeError(f"batch_norm needs an input with a batch axis and a channel axis, got {x!r}")
    _, a = _bn_axes(x.ndim, axis)
    channels = x.shape[a]
    for name, t in zip(("mean", "var", "scale", "bias"), types[1:]):
        if t.ndim != 1 or not _dims_agree(t.shape[0], channels):
            raise ShapeError(f"batch_norm: {name} must have shape ({'?' if channels is None else channels},) "
                             f"(one value per channel of axis {a}), got {t!r}")
        if t.dtype is not x.dtype:
            raise DTypeError(f"batch_norm: {name} has dtype {t.dtype}, the input {x.dtype}")
    if training:
        stat = TensorType((channels,), x.dtype)
        return [x, stat, stat]
    return x


batch_norm = defop(
    "batch_norm", num_inputs=(3, 5), num_outputs=lambda attrs, n: 3 if attrs["training"] else 1,
    pattern=OPAQUE, infer=_bn_infer, inplace=((0, 0),), attrs=_BN_ATTRS,
    doc="batch_norm(x, mean, var[, scale[, bias]]): (x - mean) / sqrt(var + eps) * scale + bias per channel "
        "of `axis`. training=False uses the given mean/var and returns y; training=True ignores them, "
        "normalizes with the batch statistics and returns (y, batch_mean, batch_var), batch_var biased.")


@batch_norm.kernel
def _(xp, x, mean, var, scale=None, bias=None, *, eps, training, axis, out=None):
    axes, a = _bn_axes(x.ndim, axis)
    bshape = tuple(x.shape[a] if i == a else 1 for i in range(x.ndim))
    if training:
        mean = xp.mean(x, axis=axes)
        centred = x - mean.reshape(bshape)
        var = xp.mean(xp.square(centred), axis=axes)
    gain = xp.reciprocal(xp.sqrt(var + eps))
    if scale is not None:
        gain *= scale
    if training:
        centred *= gain.reshape(bshape)
        if bias is not None:
            centred += bias.reshape(bshape)
        return centred, mean, var
    shift = -mean * gain
    if bias is not None:
        shift += bias
    y = xp.multiply(x, gain.reshape(bshape), out=out)
    y += shift.reshape(bshape)
    return y


def _per_channel(v: Value, ndim: int, a: int) -> Value:
    """A (C,) value reshaped to broadcast along channel axis ``a`` of an ``ndim``-d tensor."""
    return shp.expand_dims(v, axis=tuple(i for i in range(ndim) if i != a))


@batch_norm.grad
def _(node, gy, gmean=None, gvar=None):
    x, mean, var = node.inputs[:3]
    scale = node.inputs[3] if len(node.inputs) > 3 else None
    eps, axis = node.attrs["eps"], node.attrs["axis"]
    axes, a = _bn_axes(x.ndim, axis)
    grads = [None] * len(node.inputs)
    if node.attrs["training"]:
        bmean, bvar = node.outputs[1], node.outputs[2]
        if gy is not None:
            dx, dscale, dbias = batch_norm_grad(gy, x, bmean, bvar, *node.inputs[3:4], eps=eps, axis=axis)
            grads[0] = dx
            grads[3:] = [dscale, dbias][:len(node.inputs) - 3]
        # batch_mean = mean(x) and batch_var = mean((x - batch_mean)^2) are outputs too
        count = red.reduced_count(x, axes, x.dtype)
        if gmean is not None:
            grads[0] = _add(grads[0], shp.broadcast_like(_per_channel(ew.div(gmean, count), x.ndim, a), x))
        if gvar is not None:
            centred = ew.sub(x, _per_channel(bmean, x.ndim, a))
            grads[0] = _add(grads[0], ew.mul(centred, _per_channel(ew.div(ew.mul(gvar, 2.0), count), x.ndim, a)))
        return grads
    # inference: y = (x - mean) r scale + bias with r = (var + eps)^-1/2; mean and var are inputs
    r = ew.rsqrt(ew.add(var, eps))
    gain = r if scale is None else ew.mul(r, scale)
    xhat = ew.mul(ew.sub(x, _per_channel(mean, x.ndim, a)), _per_channel(r, x.ndim, a))
    summed = red.sum(gy, axis=axes)
    scaled = red.sum(ew.mul(gy, xhat), axis=axes)
    grads[0] = ew.mul(gy, _per_channel(gain, x.ndim, a))
    grads[1] = ew.neg(ew.mul(summed, gain))
    dvar = ew.mul(scaled, ew.mul(ew.square(r), -0.5))
    grads[2] = dvar if scale is None else ew.mul(dvar, scale)
    if scale is not None:
        grads[3] = scaled
    if len(node.inputs) > 4:
        grads[4] = summed
    return grads


def _bn_grad_infer(types, eps, axis):
    gy, x, mean, var = types[:4]
    _bn_infer(types[1:], eps, False, axis)
    if gy.ndim != x.ndim or not all(_dims_agree(p, q) for p, q in zip(gy.shape, x.shape)):
        raise ShapeError(f"the gradient {gy!r} does not match the input {x!r}")
    return [x, mean, mean]


batch_norm_grad = defop(
    "batch_norm_grad", num_inputs=(4, 5), num_outputs=3, pattern=OPAQUE, infer=_bn_grad_infer,
    attrs={"eps": Float(1e-5), "axis": Int(1)},
    doc="batch_norm_grad(gy, x, batch_mean, batch_var[, scale]) -> (dx, dscale, dbias): the training-mode "
        "backward pass of batch_norm, through the batch statistics.")


@batch_norm_grad.kernel
def _(xp, gy, x, mean, var, scale=None, *, eps, axis):
    axes, a = _bn_axes(x.ndim, axis)
    bshape = tuple(x.shape[a] if i == a else 1 for i in range(x.ndim))
    count = x.size // max(x.shape[a], 1)
    inv_std = xp.reciprocal(xp.sqrt(var + eps))
    xhat = x - mean.reshape(bshape)
    xhat *= inv_std.reshape(bshape)
    dbias = xp.sum(gy, axis=axes)
    dscale = xp.sum(gy * xhat, axis=axes)
    # dx = scale r (gy - mean(gy) - xhat mean(gy xhat))
    xhat *= (dscale / count).reshape(bshape)
    dx = gy - (dbias / count).reshape(bshape)
    dx -= xhat
    dx *= (inv_std if scale is None else inv_std * scale).reshape(bshape)
    return dx, dscale, dbias


@batch_norm_grad.grad
def _(node, g_dx, g_dscale, g_dbias):
    # Per channel, with r = (v + eps)^-1/2, xh = (x - mu) r and means M over the reduced axes:
    #   dx = gamma r (gy - M(gy) - xh M(gy xh)),  dscale = sum(gy xh),  dbias = sum(gy).
    # With output gradients A (for dx), Bs, Bb and H = dPhi/dxh = -gamma r (gy M(A xh) + M(gy xh) A) + Bs gy:
    #   d/dgy = gamma r (A - M(A) - xh M(A xh)) + Bs xh + Bb
    #   d/dx = H r,  d/dmu = -r sum(H),  S = sum(A (gy - M(gy) - xh M(gy xh))),  d/dgamma = r S
    #   d/dv = -1/2 r^2 (r gamma S + sum(H xh))
    gy, x, mu, v = node.inputs[:4]
    scale = node.inputs[4] if len(node.inputs) > 4 else None
    axes, a = _bn_axes(x.ndim, node.attrs["axis"])

    def chan(t):
        return _per_channel(t, x.ndim, a)

    def mean_of(t):
        return red.mean(t, axis=axes, keepdims=True)

    r = ew.rsqrt(ew.add(v, node.attrs["eps"]))
    gain = chan(r if scale is None else ew.mul(r, scale))
    xh = ew.mul(ew.sub(x, chan(mu)), chan(r))
    d_gy = h = s = None
    if g_dx is not None:
        m_axh = mean_of(ew.mul(g_dx, xh))
        d_gy = ew.mul(gain, ew.sub(ew.sub(g_dx, mean_of(g_dx)), ew.mul(xh, m_axh)))
        m_gyxh = mean_of(ew.mul(gy, xh))
        h = ew.neg(ew.mul(gain, ew.add(ew.mul(gy, m_axh), ew.mul(m_gyxh, g_dx))))
        s = red.sum(ew.mul(g_dx, ew.sub(ew.sub(gy, mean_of(gy)), ew.mul(xh, m_gyxh))), axis=axes)
    if g_dscale is not None:
        d_gy = _add(d_gy, ew.mul(chan(g_dscale), xh))
        h = _add(h, ew.mul(chan(g_dscale), gy))
    if g_dbias is not None:
        d_gy = _add(d_gy, shp.broadcast_like(chan(g_dbias), gy))
    d_x = d_mu = d_v = d_scale = None
    if h is not None:
        d_x = ew.mul(h, chan(r))
        d_mu = ew.neg(ew.mul(r, red.sum(h, axis=axes)))
        d_v = red.sum(ew.mul(h, xh), axis=axes)
    if s is not None:
        d_scale = ew.mul(r, s) if scale is not None else None
        rs = ew.mul(r, s)
        d_v = _add(d_v, rs if scale is None else ew.mul(rs, scale))
    if d_v is not None:
        d_v = ew.mul(d_v, ew.mul(ew.square(r), -0.5))
    return [d_gy, d_x, d_mu, d_v] + ([d_scale] if scale is not None else [])


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
    rng = xp.random.default_rng(int(seed.reshape(())) & 0xFFFFFFFFFFFFFFFF)  # default_rng wants seed >= 0
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


embedding = defop("embedding", num_inputs=2, pattern=INJECTIVE, infer=_embedding_infer,
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


def _scatter_add_rows(xp, target, rows, values) -> None:
    """target[rows] += values, adding repeated rows up (NumPy's ufunc.at; CuPy has cupyx.scatter_add)."""
    if hasattr(xp.add, "at"):
        xp.add.at(target, rows, values)
    else:
        import cupyx

        cupyx.scatter_add(target, rows, values)


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
    _scatter_add_rows(xp, out, rows, g.reshape((rows.size,) + tuple(weights.shape[1:])))
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
    "softmax", "softmax_grad", "log_softmax", "log_softmax_grad", "softmax_values", "log_softmax_values",
    "lrn", "lrn_grad", "lrn_window_sum", "batch_norm", "batch_norm_grad", "dropout", "dropout_grad",
    "embedding", "embedding_grad", "prelu")
