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
        # an output_shape past the full result (and the output_padding) grows it at the end
        total = [max(t, 0) for t in total]
        before = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        after = [t - b for t, b in zip(total, before)]
        out_pad = [t - (f - b - a) for t, f, b, a in zip(target, full, before, after)]
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
    before, after = _geometry(n, n.spatial(0), kernel, strides, dilations)
    geo = dict(kernel=tuple(kernel), stride=tuple(strides), ceil_mode=bool(n.attr("ceil_mode", 0)),
               dilation=tuple(dilations))
    return x, nsp, geo, before, after


@rule("MaxPool")
def _max_pool(n):
    x, nsp, geo, before, after = _pool_setup(n)
    spatial = n.spatial(0)
    if before != after:
        x = _explicit_pad(x, before, after, -np.inf if x.dtype.is_float else np.iinfo(x.dtype.np).min)
    pad = tuple(before) if before == after else (0,) * nsp
    if n.num_outputs < 2 or not n.node.output[1]:
        return P.max_pool(x, pad=pad, **geo)
    y, mask = P.max_pool(x, pad=pad, return_mask=True, **geo)
    if before == after:
        before = after = [0] * nsp
    return [y, _onnx_indices(n, mask, spatial, before, after)]


def _onnx_indices(n, mask, spatial, before, after):
    """cgvm's argmax mask (a flat index into the (n, c) plane the pooling read, padded explicitly
    when the pads were asymmetric) as ONNX's Indices: a flat index into the whole unpadded input,
    its plane row-major (storage_order 0) or column-major (1)."""
    nsp = len(spatial)
    read = [d + b + a for d, b, a in zip(spatial, before, after)]
    axes = list(range(nsp)) if int(n.attr("storage_order", 0)) == 0 else list(reversed(range(nsp)))
    out_strides, plane = [0] * nsp, 1
    for d in reversed(axes):
        out_strides[d], plane = plane, plane * spatial[d]
    flat, rest = None, mask
    for d in reversed(range(nsp)):
        coord = E.mod(rest, const(read[d], mask))
        rest = E.floordiv(rest, const(read[d], mask))
        if before[d]:
            coord = E.sub(coord, const(before[d], mask))
        term = E.mul(coord, const(out_strides[d], mask))
        flat = term if flat is None else E.add(flat, term)
    planes = n.input(0).shape[:2]
    if None in planes:
        raise n.error("MaxPool's Indices output needs the batch and channel sizes known")
    base = np.arange(planes[0] * planes[1], dtype=np.int64).reshape(tuple(planes) + (1,) * nsp) * plane
    return E.add(flat, const_value(base))


@rule("AveragePool")
def _avg_pool(n):
    x, nsp, geo, before, after = _pool_setup(n)
    include = bool(n.attr("count_include_pad", 0))
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
    x, nsp, geo, before, after = _pool_setup(n)
    p = float(n.attr("p", 2))
    powered = E.pow(E.abs(x), const(p, x))
    padded = _explicit_pad(powered, before, after, 0.0) if any(before + after) else powered
    mean = P.avg_pool(padded, pad=(0,) * nsp, count_include_pad=True, **geo)
    return E.pow(E.mul(mean, const(float(np.prod(geo["kernel"])), x)), const(1.0 / p, x))


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


@rule("MaxUnpool")
def _max_unpool(n):
    """Each value of X written at its Indices (flat positions over the whole unpooled tensor) into
    zeros shaped (in - 1)·stride - pads + kernel per axis, then zero-padded at the end to
    ``output_shape`` where given."""
    x, idx = n.input(0), n.input(1)
    nsp = x.ndim - 2
    spatial = n.spatial(0)
    kernel = ints(n.attr("kernel_shape"))
    strides = ints(n.attr("strides", [1] * nsp))
    pads = ints(n.attr("pads", [0] * (2 * nsp)))
    lead = n.shape(0)[:2]
    inferred = list(lead) + [(d - 1) * s - (pads[i] + pads[nsp + i]) + k
                             for i, (d, s, k) in enumerate(zip(spatial, strides, kernel))]
    target = inferred
    if n.has_input(2):
        target = ints(n.need_static(2, "output_shape"))
        if len(target) != x.ndim or any(t < i for t, i in zip(target, inferred)):
            raise n.error(f"output_shape {target} must have rank {x.ndim} and be at least the unpooled shape "
                          f"{inferred}")
    total = int(np.prod(inferred))
    zeros = const_value(np.zeros(total, x.dtype.np))
    flat_idx = shp.reshape(idx if idx.dtype.np == np.int64 else E.cast(idx, dtype=np.int64), shape=(-1,))
    placed = shp.reshape(I.take_set(zeros, shp.reshape(x, shape=(-1,)), flat_idx, axis=0), shape=tuple(inferred))
    if target == inferred:
        return placed
    flat_pads = []
    for t, i in zip(target, inferred):
        flat_pads += [0, t - i]
    return I.pad(placed, pads=tuple(flat_pads), mode="constant", value=0.0)
