"""Neural-network ONNX ops: Conv, ConvTranspose, pooling, Gemm, MatMul, LRN.

ONNX pads may differ before and after an axis and ``auto_pad`` derives them from the shapes;
cgvm's conv and pool pad symmetrically, so asymmetric padding becomes an explicit ``pad`` first
(-inf for max pooling; for average pooling without counting the pad, the divisor is the pooled
count of ones).
"""
from __future__ import annotations

import numpy as np

from cgvm.ir.graph import const_value
from cgvm.ops import conv as CV
from cgvm.ops import elementwise as E
from cgvm.ops import indexing as I
from cgvm.ops import linalg as L
from cgvm.ops import nn as NN
from cgvm.ops import pool as P
from cgvm.ops import reduce as R
from cgvm.ops import shape as shp

from ..translate import rule
from .common import const, ints


def _geometry(n, spatial, kernel, strides, dilations):
    """(pads before, pads after) per spatial axis, from ``pads`` or ``auto_pad``."""
    nsp = len(kernel)
    auto = n.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        before, after = [], []
        for d, k, s, dl in zip(spatial, kernel, strides, dilations):
            out = -(-d // s)
            total = max((out - 1) * s + (k - 1) * dl + 1 - d, 0)
            small, big = total // 2, total - total // 2
            before.append(small if auto == "SAME_UPPER" else big)
            after.append(big if auto == "SAME_UPPER" else small)
        return before, after
    if auto == "VALID":
        return [0] * nsp, [0] * nsp
    pads = ints(n.attr("pads", [0] * (2 * nsp)))
    return pads[:nsp], pads[nsp:]


def _explicit_pad(x, before, after, value):
    flat = [0, 0, 0, 0]
    for b, a in zip(before, after):
        flat += [b, a]
    return I.pad(x, pads=tuple(flat), mode="constant", value=value)


def _attrs(n, nsp):
    strides = ints(n.attr("strides", [1] * nsp))
    dilations = ints(n.attr("dilations", [1] * nsp))
    return strides, dilations


def conv_of(n, x, w, bias=None, w_input: int = 1):
    """The convolution node ``n``'s attributes describe (Conv, ConvInteger, QLinearConv), of ``x`` by ``w``
    (input ``w_input`` of the node: its spatial shape is the default kernel shape), zero padded."""
    nsp = x.ndim - 2
    kernel = ints(n.attr("kernel_shape", n.spatial(w_input)))
    strides, dilations = _attrs(n, nsp)
    before, after = _geometry(n, tuple(x.shape[2:]), kernel, strides, dilations)
    if before != after:
        x = _explicit_pad(x, before, after, 0.0)
        before = [0] * nsp
    args = [x, w] + ([bias] if bias is not None else [])
    return CV.conv(*args, stride=tuple(strides), pad=tuple(before), dilation=tuple(dilations),
                   groups=int(n.attr("group", 1)))


@rule("Conv")
def _conv(n):
    n.spatial(0)
    return conv_of(n, n.input(0), n.input(1), n.input(2) if n.has_input(2) else None)


@rule("ConvTranspose")
def _conv_transpose(n):
    x, w = n.input(0), n.input(1)
    nsp = x.ndim - 2
    spatial = n.spatial(0)
    kernel = ints(n.attr("kernel_shape", n.spatial(1)))
    strides, dilations = _attrs(n, nsp)
    out_pad = ints(n.attr("output_padding", [0] * nsp))
    group = int(n.attr("group", 1))
    full = [(d - 1) * s + (k - 1) * dl + 1 for d, s, k, dl in zip(spatial, strides, kernel, dilations)]
    out_shape = n.attr("output_shape")
    auto = n.attr("auto_pad", "NOTSET")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = ints(out_shape)[-nsp:] if out_shape is not None else [d * s for d, s in zip(spatial, strides)]
        total = [f + op - t for f, op, t in zip(full, out_pad, target)]
        before = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        after = [t - b for t, b in zip(total, before)]
        out_pad = [0] * nsp
    else:
        pads = ints(n.attr("pads", [0] * (2 * nsp)))
        before, after = pads[:nsp], pads[nsp:]
    # cgvm's conv_transpose crops `pad` on both sides and adds output_padding at the end
    sym = [min(b, a) for b, a in zip(before, after)]
    extra_after = [a - s for a, s in zip(after, sym)]
    extra_before = [b - s for b, s in zip(before, sym)]
    args = [x, w] + ([n.input(2)] if n.has_input(2) else [])
    y = CV.conv_transpose(*args, stride=tuple(strides), pad=tuple(sym), dilation=tuple(dilations), groups=group,
                          output_padding=tuple(max(op - ea, 0) for op, ea in zip(out_pad, extra_after)))
    if any(extra_before) or any(ea > op for ea, op in zip(extra_after, out_pad)):
        shape = y.shape
        stops = tuple(shape[2 + i] - max(extra_after[i] - out_pad[i], 0) for i in range(nsp))
        y = I.slice(y, starts=tuple(extra_before), stops=stops, steps=(1,) * nsp, axes=tuple(range(2, 2 + nsp)))
    return y


def _pool_setup(n):
    x = n.input(0)
    nsp = x.ndim - 2
    kernel = ints(n.attr("kernel_shape"))
    strides = ints(n.attr("strides", [1] * nsp))
    dilations = ints(n.attr("dilations", [1] * nsp))
    if any(d != 1 for d in dilations):
        raise n.error("pooling with dilations is not supported")
    before, after = _geometry(n, n.spatial(0), kernel, strides, dilations)
    return x, nsp, kernel, strides, before, after, bool(n.attr("ceil_mode", 0))


@rule("MaxPool")
def _max_pool(n):
    x, nsp, kernel, strides, before, after, ceil = _pool_setup(n)
    if n.num_outputs > 1 and n.node.output[1]:
        raise n.error("MaxPool's Indices output is not supported")
    if before != after:
        x = _explicit_pad(x, before, after, -np.inf if x.dtype.is_float else np.iinfo(x.dtype.np).min)
        before = [0] * nsp
    return P.max_pool(x, kernel=tuple(kernel), stride=tuple(strides), pad=tuple(before), ceil_mode=ceil)


@rule("AveragePool")
def _avg_pool(n):
    x, nsp, kernel, strides, before, after, ceil = _pool_setup(n)
    include = bool(n.attr("count_include_pad", 0))
    geo = dict(kernel=tuple(kernel), stride=tuple(strides), ceil_mode=ceil)
    if before == after:
        return P.avg_pool(x, pad=tuple(before), count_include_pad=include, **geo)
    padded = _explicit_pad(x, before, after, 0.0)
    total = P.avg_pool(padded, pad=(0,) * nsp, count_include_pad=True, **geo)
    if include:
        return total
    ones = np.ones((1, 1) + n.spatial(0), x.dtype.np)
    ones = np.pad(ones, [(0, 0), (0, 0)] + list(zip(before, after)))
    frac = P.avg_pool(const_value(ones), pad=(0,) * nsp, count_include_pad=True, **geo)
    return E.div(total, frac)


@rule("GlobalAveragePool")
def _gap(n):
    x = n.input(0)
    return R.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@rule("GlobalMaxPool")
def _gmp(n):
    x = n.input(0)
    return R.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@rule("LpPool")
def _lp_pool(n):
    x, nsp, kernel, strides, before, after, ceil = _pool_setup(n)
    p = float(n.attr("p", 2))
    padded = _explicit_pad(E.pow(E.abs(x), const(p, x)), before, after, 0.0) if any(before + after) else \
        E.pow(E.abs(x), const(p, x))
    mean = P.avg_pool(padded, kernel=tuple(kernel), stride=tuple(strides), pad=(0,) * nsp, ceil_mode=ceil,
                      count_include_pad=True)
    return E.pow(E.mul(mean, const(float(np.prod(kernel)), x)), const(1.0 / p, x))


@rule("GlobalLpPool")
def _glp(n):
    x = n.input(0)
    p = float(n.attr("p", 2))
    s = R.sum(E.pow(E.abs(x), const(p, x)), axis=tuple(range(2, x.ndim)), keepdims=True)
    return E.pow(s, const(1.0 / p, x))


@rule("Gemm")
def _gemm(n):
    a, b = n.input(0), n.input(1)
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    ta, tb = bool(n.attr("transA", 0)), bool(n.attr("transB", 0))
    if n.has_input(2) and a.dtype.is_float:
        return L.gemm(a, b, n.input(2), trans_a=ta, trans_b=tb, alpha=alpha, beta=beta)
    if ta:
        a = shp.transpose(a, perm=(1, 0))
    if tb:
        b = shp.transpose(b, perm=(1, 0))
    y = L.matmul(a, b)
    if alpha != 1.0:
        y = E.mul(y, const(alpha, y))
    if n.has_input(2):
        c = n.input(2)
        y = E.add(y, E.mul(c, const(beta, c)) if beta != 1.0 else c)
    return y


_NATIVE_FLOATS = ("float16", "float32", "float64")


@rule("MatMul")
def _matmul(n):
    a, b = n.input(0), n.input(1)
    if a.dtype.is_float and a.dtype.name not in _NATIVE_FLOATS and a.dtype is b.dtype:
        # storage formats (bfloat16, float8): NumPy's matmul of them answers float32 (and rounds only
        # into a buffer of their own); the product is accumulated in float32 and rounded once
        return E.cast(L.matmul(E.cast(a, dtype="float32"), E.cast(b, dtype="float32")), dtype=a.dtype)
    return L.matmul(a, b)


@rule("LRN")
def _lrn(n):
    x = n.input(0)
    return NN.lrn(x, local_size=int(n.attr("size")), norm_region="ACROSS_CHANNELS",
                  alpha=float(n.attr("alpha", 1e-4)), beta=float(n.attr("beta", 0.75)), k=float(n.attr("bias", 1.0)))
