"""Vision layers: Convolution, Deconvolution, Im2col, Pooling, SPP, LRN, Crop.

Geometry follows Caffe exactly: convolution sizes floor, pooling sizes use Caffe's ceil rule
(with the clip of a last window that would start in the right padding; ``round_mode: FLOOR``
floors), MAX pooling ignores padding and keeps the first maximum, AVE pooling counts padding in
the divisor but not the ceil-mode overhang.
"""
from __future__ import annotations

import math
from typing import List, Sequence, Tuple

import numpy as np

from cgvm.env import check_bytes

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.layers.base import LayerContext, canonical_axis, count, need_bottoms, register
from cgvm.ir import Value
from cgvm.ir.builder import as_value
from cgvm.ops import conv as cv
from cgvm.ops import elementwise as ew
from cgvm.ops import indexing as ix
from cgvm.ops import nn
from cgvm.ops import pool
from cgvm.ops import join
from cgvm.ops import shape as shp

_P = caffe_pb2.PoolingParameter


# --------------------------------------------------------------------------- convolution geometry

def _spatial(repeated: Sequence[int], h_value: int, w_value: int, has_hw: bool, nsp: int, default: int,
             what: str, ctx: LayerContext) -> Tuple[int, ...]:
    """One value per spatial axis from Caffe's repeated field or its _h/_w pair."""
    if has_hw:
        if repeated:
            raise ctx.error(f"give either {what} or {what}_h/{what}_w, not both")
        if nsp != 2:
            raise ctx.error(f"{what}_h/{what}_w are for 2-D convolution only; this one has {nsp} spatial axes")
        return (int(h_value), int(w_value))
    if not repeated:
        return (default,) * nsp
    if len(repeated) == 1:
        return (int(repeated[0]),) * nsp
    if len(repeated) != nsp:
        raise ctx.error(f"{what} has {len(repeated)} values; give 1 or {nsp} (one per spatial axis)")
    return tuple(int(v) for v in repeated)


def conv_geometry(param: caffe_pb2.ConvolutionParameter, nsp: int, ctx: LayerContext):
    """(kernel, stride, pad, dilation) tuples per spatial axis, checked as Caffe checks them."""
    kernel = _spatial(param.kernel_size, param.kernel_h, param.kernel_w,
                      param.HasField("kernel_h") or param.HasField("kernel_w"), nsp, 0, "kernel_size", ctx)
    if any(k <= 0 for k in kernel):
        raise ctx.error("convolution_param needs kernel_size (or kernel_h and kernel_w) greater than 0")
    stride = _spatial(param.stride, param.stride_h, param.stride_w,
                      param.HasField("stride_h") or param.HasField("stride_w"), nsp, 1, "stride", ctx)
    if any(s <= 0 for s in stride):
        raise ctx.error(f"stride must be positive, got {stride}")
    pad = _spatial(param.pad, param.pad_h, param.pad_w,
                   param.HasField("pad_h") or param.HasField("pad_w"), nsp, 0, "pad", ctx)
    dilation = _spatial(param.dilation, 0, 0, False, nsp, 1, "dilation", ctx)
    return kernel, stride, pad, dilation


def _to_batched(x: Value, axis: int) -> Tuple[Value, Tuple[int, ...]]:
    """x with the axes before the channel axis merged into one batch axis (conv wants N, C, spatial)."""
    if axis == 1:
        return x, ()
    lead = tuple(x.shape[:axis])
    return shp.reshape(x, shape=(count(lead),) + tuple(x.shape[axis:])), lead


def _from_batched(y: Value, lead: Tuple[int, ...], axis: int) -> Value:
    if axis == 1:
        return y
    return shp.reshape(y, shape=lead + tuple(y.shape[1:]))


def _conv_like(layer, bottoms, ctx, transpose: bool) -> List[Value]:
    param = layer.convolution_param
    if not param.num_output:
        raise ctx.error("convolution_param.num_output must be given and positive")
    tops = []
    weight = bias = None
    for x in bottoms:
        axis = canonical_axis(param.axis, x.ndim, ctx)
        nsp = x.ndim - axis - 1
        if nsp < 1:
            raise ctx.error(f"bottom of shape {tuple(x.shape)} has no spatial axes after channel axis {axis}")
        kernel, stride, pad, dilation = conv_geometry(param, nsp, ctx)
        channels, group = int(x.shape[axis]), int(param.group)
        if group < 1 or channels % group or param.num_output % group:
            raise ctx.error(f"group {group} must divide the input channels ({channels}) and num_output "
                            f"({param.num_output})")
        if weight is None:
            shape = ((channels, param.num_output // group) if transpose else
                     (param.num_output, channels // group)) + kernel
            weight = ctx.param(0, shape, param.weight_filler if param.HasField("weight_filler") else None)
            if param.bias_term:
                bias = ctx.param(1, (param.num_output,),
                                 param.bias_filler if param.HasField("bias_filler") else None)
        elif int(weight.shape[0 if transpose else 1]) * (1 if transpose else group) != channels:
            raise ctx.error(f"all bottoms must have {channels} channels")
        xb, lead = _to_batched(x, axis)
        op = cv.conv_transpose if transpose else cv.conv
        args = (xb, weight) if bias is None else (xb, weight, bias)
        y = op(*args, stride=stride, pad=pad, dilation=dilation, groups=group)
        tops.append(_from_batched(y, lead, axis))
    return tops


@register("Convolution")
def convolution(layer, bottoms, ctx):
    """y[o] = b[o] + sum over the group's channels and the kernel of W[o, c, k] x[c, p*s - pad + k*d]."""
    return _conv_like(layer, bottoms, ctx, transpose=False)


@register("Deconvolution")
def deconvolution(layer, bottoms, ctx):
    """The gradient of convolution: weight (C_in, num_output/group, k...), out = s(in-1) + d(k-1)+1 - 2 pad."""
    return _conv_like(layer, bottoms, ctx, transpose=True)


@register("Im2col")
def im2col(layer, bottoms, ctx):
    """Patches as channels ordered (c, kh, kw): a grouped convolution with a constant one-hot kernel."""
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    param = layer.convolution_param
    axis = canonical_axis(param.axis, x.ndim, ctx)
    nsp = x.ndim - axis - 1
    kernel, stride, pad, dilation = conv_geometry(param, nsp, ctx)
    channels, taps = int(x.shape[axis]), math.prod(kernel)
    # the one-hot kernel is channels * taps**2 values, made now: checked before it is allocated
    check_bytes(channels * taps * taps * x.dtype.np.itemsize, f"{ctx.where}: the Im2col kernel of {kernel}")
    picks = np.zeros((channels * taps, 1) + kernel, dtype=x.dtype.np)
    flat = picks.reshape(channels, taps, taps)
    flat[:] = np.eye(taps, dtype=x.dtype.np)
    xb, lead = _to_batched(x, axis)
    y = cv.conv(xb, as_value(picks), stride=stride, pad=pad, dilation=dilation, groups=channels)
    return [_from_batched(y, lead, axis)]


# --------------------------------------------------------------------------- pooling

def _pool_geometry(param: caffe_pb2.PoolingParameter, x: Value, ctx: LayerContext):
    """(kernel, stride, pad) as (h, w) pairs, or None for global pooling."""
    has_kernel = param.HasField("kernel_size") or param.HasField("kernel_h") or param.HasField("kernel_w")
    if param.global_pooling:
        if has_kernel:
            raise ctx.error("with global_pooling the kernel is the whole image; do not give kernel_size")
        if param.pad or param.pad_h or param.pad_w or param.stride_h or param.stride_w or param.stride != 1:
            raise ctx.error("global pooling takes no pad and stride 1 only")
        return None
    if param.HasField("kernel_size") and (param.HasField("kernel_h") or param.HasField("kernel_w")):
        raise ctx.error("give either kernel_size or kernel_h/kernel_w, not both")
    if param.HasField("kernel_size"):
        kernel = (param.kernel_size, param.kernel_size)
    elif param.HasField("kernel_h") and param.HasField("kernel_w"):
        kernel = (param.kernel_h, param.kernel_w)
    else:
        raise ctx.error("pooling_param needs kernel_size, or both kernel_h and kernel_w (or global_pooling)")
    if min(kernel) <= 0:
        raise ctx.error(f"the pooling kernel must be positive, got {kernel}")
    pad = (param.pad_h, param.pad_w) if (param.HasField("pad_h") or param.HasField("pad_w")) else (param.pad,) * 2
    stride = ((param.stride_h, param.stride_w) if (param.HasField("stride_h") or param.HasField("stride_w"))
              else (param.stride,) * 2)
    if min(stride) <= 0:
        raise ctx.error(f"the pooling stride must be positive, got {stride}")
    if any(pad):
        if param.pool not in (_P.MAX, _P.AVE):
            raise ctx.error("padding is implemented for MAX and AVE pooling only")
        if pad[0] >= kernel[0] or pad[1] >= kernel[1]:
            raise ctx.error(f"pad {pad} must be smaller than the kernel {kernel}")
    return tuple(map(int, kernel)), tuple(map(int, stride)), tuple(map(int, pad))


def pool2d(x: Value, method: int, kernel, stride, pad, ceil_mode: bool, ctx: LayerContext,
           with_mask: bool = False) -> List[Value]:
    """One Caffe pooling of a 4-D value (MAX, AVE, or STOCHASTIC at test time)."""
    attrs = dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil_mode)
    if method == _P.MAX:
        if with_mask:
            y, mask = pool.max_pool(x, return_mask=True, **attrs)
            return [y, ew.cast(mask, dtype=x.dtype)]
        return [pool.max_pool(x, **attrs)]
    if with_mask:
        raise ctx.error("a second top (the argmax mask) exists for MAX pooling only")
    if method == _P.AVE:
        return [pool.avg_pool(x, **attrs)]
    if ctx.phase == caffe_pb2.TRAIN:
        raise ctx.error("STOCHASTIC pooling in TRAIN samples on the GPU only in Caffe (its CPU path is "
                        "not implemented); use MAX or AVE, or run the net in TEST")
    # TEST: sum(x^2) / sum(x) over each window (0 where the sum is 0); the divisors cancel
    squares = pool.avg_pool(ew.square(x), **attrs)
    sums = pool.avg_pool(x, **attrs)
    zero = ew.eq(sums, 0.0)
    return [ew.where(zero, 0.0, ew.div(squares, ew.where(zero, 1.0, sums)))]


@register("Pooling")
def pooling(layer, bottoms, ctx):
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    if x.ndim != 4:
        raise ctx.error(f"Pooling needs a 4-D (N, C, H, W) bottom, got shape {tuple(x.shape)}")
    param = layer.pooling_param
    geometry = _pool_geometry(param, x, ctx)
    with_mask = len(layer.top) > 1
    if geometry is None:
        if param.pool == _P.MAX:
            kernel = (int(x.shape[2]), int(x.shape[3]))
            return pool2d(x, param.pool, kernel, (1, 1), (0, 0), True, ctx, with_mask)
        if param.pool == _P.AVE and not with_mask:
            return [pool.global_avg_pool(x)]
        return pool2d(x, param.pool, (int(x.shape[2]), int(x.shape[3])), (1, 1), (0, 0), True, ctx, with_mask)
    kernel, stride, pad = geometry
    ceil_mode = param.round_mode == _P.CEIL
    if param.HasField("ceil_mode"):   # the forks' spelling of the same choice (docs/caffe_forks.md)
        if param.HasField("round_mode") and param.ceil_mode != ceil_mode:
            raise ctx.error(f"pooling_param has round_mode: {_P.RoundMode.Name(param.round_mode)} and ceil_mode: "
                            f"{str(param.ceil_mode).lower()}, which disagree; give one of them")
        ceil_mode = param.ceil_mode
    return pool2d(x, param.pool, kernel, stride, pad, ceil_mode, ctx, with_mask)


@register("SPP")
def spatial_pyramid_pooling(layer, bottoms, ctx):
    """Pyramid levels l = 0..H-1 of 2^l x 2^l bins, each pooled, flattened and concatenated."""
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    if x.ndim != 4:
        raise ctx.error(f"SPP needs a 4-D (N, C, H, W) bottom, got shape {tuple(x.shape)}")
    height = layer.spp_param.pyramid_height
    if height < 1:
        raise ctx.error("spp_param.pyramid_height must be at least 1")
    levels = []
    h, w = int(x.shape[2]), int(x.shape[3])
    for level in range(height):
        bins = 2 ** level
        kernel = (math.ceil(h / bins), math.ceil(w / bins))
        pad = ((kernel[0] * bins - h + 1) // 2, (kernel[1] * bins - w + 1) // 2)
        y = pool2d(x, layer.spp_param.pool, kernel, kernel, pad, True, ctx)[0]
        levels.append(shp.flatten(y, axis=1))
    return [levels[0] if len(levels) == 1 else join.concat(*levels, axis=1)]


@register("LRN")
def local_response_normalization(layer, bottoms, ctx):
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    if x.ndim != 4:
        raise ctx.error(f"LRN needs a 4-D (N, C, H, W) bottom, got shape {tuple(x.shape)}")
    param = layer.lrn_param
    if param.local_size % 2 == 0:
        raise ctx.error(f"lrn_param.local_size must be odd, got {param.local_size}")
    region = caffe_pb2.LRNParameter.NormRegion.Name(param.norm_region)
    return [nn.lrn(x, local_size=param.local_size, norm_region=region, alpha=param.alpha, beta=param.beta,
                   k=param.k)]


@register("Crop")
def crop(layer, bottoms, ctx):
    """bottom[0] cut to bottom[1]'s shape on the axes from `axis` on, starting at the offsets."""
    need_bottoms(bottoms, (2,), ctx)
    x, like = bottoms
    if x.ndim != like.ndim:
        raise ctx.error(f"the two bottoms must have the same number of axes, got {tuple(x.shape)} and "
                        f"{tuple(like.shape)}")
    param = layer.crop_param
    start = canonical_axis(param.axis, x.ndim, ctx)
    cropped = x.ndim - start
    offsets = list(param.offset)
    if len(offsets) == 1:
        offsets = offsets * cropped
    elif not offsets:
        offsets = [0] * cropped
    elif len(offsets) != cropped:
        raise ctx.error(f"crop_param.offset has {len(offsets)} values; give 0, 1 or {cropped} (one per cropped "
                        f"axis from axis {start})")
    starts, stops, axes = [], [], []
    for i, off in zip(range(start, x.ndim), offsets):
        size, want = int(x.shape[i]), int(like.shape[i])
        if off + want > size:
            raise ctx.error(f"crop of axis {i}: offset {off} + size {want} runs past the bottom's {size}")
        if off or want != size:
            starts.append(int(off))
            stops.append(int(off) + want)
            axes.append(i)
    if not axes:
        return [shp.reshape(x, shape=tuple(x.shape))]
    return [ix.slice(x, starts=starts, stops=stops, axes=axes)]
