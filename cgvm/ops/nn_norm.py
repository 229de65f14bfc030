"""Normalization ops of the nn family: local response normalization (LRN) and batch normalization.

Part of the nn family (``cgvm.ops.nn`` re-exports every op here). Layout is NCHW: the channel
axis is 1 unless an op's ``axis`` attribute says otherwise. Each op has a one-kernel gradient op
(``lrn_grad``, ``batch_norm_grad``) for the first derivative, and each of those has a gradient
rule built from ordinary ops, so both can be differentiated to any order.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from ..errors import DTypeError, ShapeError
from ..ir.attrs import Bool, Float, Int, Str
from ..ir.graph import Value
from ..ir.types import TensorType
from . import elementwise as ew
from . import reduce as red
from . import shape as shp
from .registry import OPAQUE, defop
from .rules import assign_out as _assign, dims_agree as _dims_agree, normalize_axis, require_float






def _add(a: Optional[Value], b: Optional[Value]) -> Optional[Value]:
    """Sum of two gradient terms where ``None`` stands for zero."""
    if a is None:
        return b
    return a if b is None else ew.add(a, b)


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


#: LRN and batch norm work on this many bytes of samples at a time: their temporaries (x², window
#: sums, normalized inputs) stay cache-sized instead of whole activations (AlexNet's norm1: 2 x 18
#: MiB; ResNet-18's first batch norm gradient: 2 x 49 MiB)
CHUNK_BYTES = 1 << 20


def _sample_chunks(x) -> list:
    per_sample = max(1, x.nbytes // max(x.shape[0], 1))
    step = max(1, CHUNK_BYTES // per_sample)
    return [slice(i, i + step) for i in range(0, x.shape[0], step)]


@lrn.kernel
def _(xp, x, *, local_size, norm_region, alpha, beta, k, out=None):
    out = xp.empty_like(x) if out is None else out
    for part in _sample_chunks(x):   # samples are independent: both windows stay inside one sample
        s = _lrn_scale(xp, x[part], local_size, norm_region, alpha, k)
        xp.power(s, -beta, out=s)
        xp.multiply(x[part], s, out=out[part])
    return out


@lrn.grad
def _(node, g):
    return [lrn_grad(g, node.inputs[0], **node.attrs)]


lrn_grad = defop("lrn_grad", num_inputs=2, pattern=OPAQUE, infer=_lrn_infer, attrs=_LRN_ATTRS,
                 doc="The gradient of lrn at x for output gradient g (Caffe's backward formula, one kernel).")


@lrn_grad.kernel
def _(xp, g, x, *, local_size, norm_region, alpha, beta, k, out=None):
    # dx = g s^-beta - (2 alpha beta / n) x W(g x s^(-beta-1)), W the (self-adjoint) window sum
    coef, _ = _lrn_coefficients(local_size, norm_region, alpha, k)
    out = xp.empty_like(g) if out is None else out
    for part in _sample_chunks(x):
        xs, gs = x[part], g[part]
        s = _lrn_scale(xp, xs, local_size, norm_region, alpha, k)
        p = xp.power(s, -beta)
        inner = gs * xs
        inner *= p
        inner /= s
        back = _lrn_window(xp, inner, local_size, norm_region)
        back *= xs
        back *= 2.0 * coef * beta
        r = xp.multiply(gs, p, out=out[part])
        r -= back
    return out


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
    pattern=OPAQUE, infer=_bn_infer, inplace=((0, 0),), attrs=_BN_ATTRS, multi_out=True,
    doc="batch_norm(x, mean, var[, scale[, bias]]): (x - mean) / sqrt(var + eps) * scale + bias per channel "
        "of `axis`. training=False uses the given mean/var and returns y; training=True ignores them, "
        "normalizes with the batch statistics and returns (y, batch_mean, batch_var), batch_var biased.")


def _bn_parts(x: Any, a: int) -> list:
    """Slices of the samples for the chunked passes (the whole when axis 0 is the channel axis)."""
    return _sample_chunks(x) if a != 0 else [slice(None)]


def _outputs(out: Any, n: int) -> tuple:
    """A multi_out kernel's ``out``: a buffer or None per output."""
    return tuple(out) if out is not None else (None,) * n


def _put(xp: Any, buf: Any, value: Any) -> Any:
    if buf is None:
        return value
    buf[...] = value
    return buf


@batch_norm.kernel
def _(xp, x, mean, var, scale=None, bias=None, *, eps, training, axis, out=None):
    axes, a = _bn_axes(x.ndim, axis)
    bshape = tuple(x.shape[a] if i == a else 1 for i in range(x.ndim))
    if not training:
        gain = xp.reciprocal(xp.sqrt(var + eps))
        if scale is not None:
            gain *= scale
        shift = -mean * gain
        if bias is not None:
            shift += bias
        y = xp.multiply(x, gain.reshape(bshape), out=out)
        y += shift.reshape(bshape)
        return y
    y_out, mean_out, var_out = _outputs(out, 3)
    y = xp.empty_like(x) if y_out is None else y_out
    count = x.size // max(x.shape[a], 1)
    mean = xp.mean(x, axis=axes)
    xp.subtract(x, mean.reshape(bshape), out=y)          # centred, normalized in place below
    squares = xp.zeros_like(mean)
    for part in _bn_parts(x, a):
        squares += xp.sum(xp.square(y[part]), axis=axes)
    var = squares / count
    gain = xp.reciprocal(xp.sqrt(var + eps))
    if scale is not None:
        gain *= scale
    y *= gain.reshape(bshape)
    if bias is not None:
        y += bias.reshape(bshape)
    return y, _put(xp, mean_out, mean), _put(xp, var_out, var)


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
    attrs={"eps": Float(1e-5), "axis": Int(1)}, multi_out=True,
    doc="batch_norm_grad(gy, x, batch_mean, batch_var[, scale]) -> (dx, dscale, dbias): the training-mode "
        "backward pass of batch_norm, through the batch statistics.")


@batch_norm_grad.kernel
def _(xp, gy, x, mean, var, scale=None, *, eps, axis, out=None):
    # dx = scale r (gy - mean(gy) - xhat mean(gy xhat)) with r = (var + eps)^-1/2, xhat = (x - mean) r;
    # xhat is made a chunk of samples at a time, twice, instead of kept whole
    axes, a = _bn_axes(x.ndim, axis)
    bshape = tuple(x.shape[a] if i == a else 1 for i in range(x.ndim))
    count = x.size // max(x.shape[a], 1)
    dx_out, dscale_out, dbias_out = _outputs(out, 3)
    inv_std = xp.reciprocal(xp.sqrt(var + eps))
    centre, r = mean.reshape(bshape), inv_std.reshape(bshape)
    parts = _bn_parts(x, a)
    dbias = xp.sum(gy, axis=axes)
    dscale = xp.zeros_like(dbias)
    for part in parts:
        xhat = xp.subtract(x[part], centre)
        xhat *= r
        xhat *= gy[part]
        dscale += xp.sum(xhat, axis=axes)
    dx = xp.empty_like(x) if dx_out is None else dx_out
    mean_gy = (dbias / count).reshape(bshape)
    mean_gy_xhat = (dscale / count).reshape(bshape)
    gain = (inv_std if scale is None else inv_std * scale).reshape(bshape)
    for part in parts:
        xhat = xp.subtract(x[part], centre)
        xhat *= r
        xhat *= mean_gy_xhat
        d = dx[part]
        xp.subtract(gy[part], mean_gy, out=d)
        d -= xhat
        d *= gain
    return dx, _put(xp, dscale_out, dscale), _put(xp, dbias_out, dbias)


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


__all__: Sequence[str] = ("ACROSS", "WITHIN", "lrn", "lrn_grad", "lrn_window_sum", "batch_norm", "batch_norm_grad")
