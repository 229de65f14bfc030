"""Pooling, NCHW with any number of spatial axes: max_pool, avg_pool, their global forms, and gradient ops.

Attributes: ``kernel`` (one value or one per spatial axis), ``stride`` (default: the kernel),
``pad`` (1, n symmetric, or 2·n values ``(begins..., ends...)``; each must be smaller than the
kernel, as Caffe requires), ``ceil_mode`` (False: floor rule), ``dilation`` (default 1: the
window's k taps lie ``dilation`` apart, so it spans ``(k - 1)·dilation + 1``, as in ONNX and
PyTorch; ``k`` below stands for that span).

Output size per axis: ``floor((in + pad_begin + pad_end - k) / stride) + 1``, or with
``ceil_mode`` Caffe's rule: ``ceil(...) + 1``, then ``out -= 1`` if ``(out-1)·stride >= in + pad_begin``
(the last window must start inside the image or its left padding). Caffe applies the clip only
when pad > 0; without padding it only matters when stride > kernel, where Caffe would produce an
empty window, so here it always applies (as PyTorch does).

Max pooling ignores padding (-inf padding); ties go to the first maximum in row-major window
order, as in Caffe. ``return_mask`` adds Caffe's top[1]: the argmax as a flat index into the
(n, c) spatial plane. Average pooling divides by the window clipped to the padded extent
(in + pads), so padding counts but the ceil-mode overhang does not (Caffe, PyTorch's
count_include_pad); ``count_include_pad=False`` divides by the in-image part only.

Window geometry and the kernels that work for any windows are in cgvm.ops.kernels.pool_windows; windows
that tile the input have their own layouts (cgvm.ops.kernels.pool_tiled).
"""
from __future__ import annotations

from typing import Any, Sequence, Tuple

import numpy as np

from ..errors import ShapeError
from ..ir.attrs import Bool, Ints
from ..ir.types import TensorType, int64
from .kernels import pool_native as native
from .kernels import pool_tiled as tiled
from .kernels.pool_windows import (PoolGeometry, chunked_max_grad, lowest_value, pad_to_extent, scatter_windows,
                           separable_pool, store_into, window_argmax)
from .registry import OPAQUE, defop
from .rules import dims_agree, require_float

# --------------------------------------------------------------------------- type rules

_POOL_ATTRS = {"kernel": Ints(), "stride": Ints(None), "pad": Ints((0,)), "ceil_mode": Bool(False),
               "dilation": Ints((1,))}
_AVG_ATTRS = dict(_POOL_ATTRS, count_include_pad=Bool(True))


def _check_input(t: TensorType, what: str) -> None:
    if t.ndim < 3:
        raise ShapeError(f"{what} input must be (N, C, spatial...) with at least one spatial axis, got rank {t.ndim}")
    if t.dtype.is_bool:
        raise ShapeError(f"{what} needs a numeric input, got {t!r}")


def _geometry_attrs(attrs) -> tuple:
    return attrs["kernel"], attrs["stride"], attrs["pad"], attrs["ceil_mode"], attrs["dilation"]


def _pooled_type(t: TensorType, geo: PoolGeometry) -> TensorType:
    return TensorType(t.shape[:2] + geo.out_sizes(t.shape[2:]), t.dtype)


def _max_pool_infer(types, kernel, stride, pad, ceil_mode, dilation, return_mask):
    x = types[0]
    _check_input(x, "max_pool")
    y = _pooled_type(x, PoolGeometry(x.ndim - 2, kernel, stride, pad, ceil_mode, dilation))
    return [y, y.with_dtype(int64)] if return_mask else y


def _avg_pool_infer(types, kernel, stride, pad, ceil_mode, dilation, count_include_pad):
    x = types[0]
    _check_input(x, "avg_pool")
    require_float(x, "avg_pool input")
    return _pooled_type(x, PoolGeometry(x.ndim - 2, kernel, stride, pad, ceil_mode, dilation))


def _x_shaped(types, **attrs):
    """(x, g[, y]) -> x's shape with g's dtype (the max-pool routing op)."""
    x, g = types[:2]
    _check_input(x, "max_pool_grad")
    if len(types) == 3 and (types[2].dtype is not x.dtype or not dims_agree(types[2].shape, g.shape)):
        raise ShapeError(f"max_pool_grad: the pooled output {types[2]!r} must match x's dtype and g's shape {g!r}")
    PoolGeometry(x.ndim - 2, *_geometry_attrs(attrs))
    return x.with_dtype(g.dtype)


def _y_shaped(types, **attrs):
    """(x, v) -> pooled shape of x with v's dtype (the max-pool gather op)."""
    x, v = types
    _check_input(x, "max_pool_select")
    geo = PoolGeometry(x.ndim - 2, *_geometry_attrs(attrs))
    return _pooled_type(x, geo).with_dtype(v.dtype)


def _avg_grad_infer(types, **attrs):
    g, x_like = types
    _check_input(x_like, "avg_pool_grad")
    PoolGeometry(x_like.ndim - 2, *_geometry_attrs(attrs))
    return x_like.with_dtype(g.dtype)


def _pool_attrs(node) -> dict:
    return {k: node.attrs[k] for k in _POOL_ATTRS}


# --------------------------------------------------------------------------- max pooling

max_pool = defop("max_pool", num_inputs=1, pattern=OPAQUE, attrs=dict(_POOL_ATTRS, return_mask=Bool(False)),
                 num_outputs=lambda attrs, n: 2 if attrs["return_mask"] else 1, infer=_max_pool_infer,
                 doc="Max pooling (Caffe Pooling MAX); with return_mask also the argmax as a flat in-plane index.")


@max_pool.kernel
def _(xp, x, *, kernel, stride, pad, ceil_mode, dilation=(1,), return_mask, out=None):
    geo = PoolGeometry(x.ndim - 2, kernel, stride, pad, ceil_mode, dilation)
    if return_mask:
        best, index, out_sizes = window_argmax(xp, x, geo)
        return best, _flat_mask(xp, index, x.shape[2:], out_sizes, geo)
    out_sizes = geo.out_sizes(x.shape[2:])
    target = xp.empty(x.shape[:2] + out_sizes, dtype=x.dtype) if out is None else out
    lowest = lowest_value(x.dtype)
    if native.pool_forward(xp, x, geo, target):
        return target
    return separable_pool(xp, x, geo, out_sizes, target, lowest, xp.maximum)


def _flat_mask(xp: Any, index: Any, in_sizes: Sequence[int], out_sizes: Sequence[int], geo: PoolGeometry) -> Any:
    """Offset indices turned into flat positions h·W + w within the unpadded (n, c) plane."""
    plane_strides = [int(np.prod(in_sizes[d + 1:], dtype=np.int64)) for d in range(len(in_sizes))]
    base = np.zeros((), dtype=np.int64)
    for o, s, (b, _), st in zip(out_sizes, geo.stride, geo.pads, plane_strides):
        base = np.add.outer(base, (np.arange(o) * s - b) * st)
    offset_flat = np.array([sum(k * st for k, st in zip(kk, plane_strides)) for kk in geo.positions()],
                           dtype=np.int64)
    return xp.asarray(base) + xp.take(xp.asarray(offset_flat), index)


@max_pool.grad
def _(node, g, *_mask_grad):
    # the pooled output rides along: the tiled kernel then need not find the window maxima again
    return [None if g is None else max_pool_grad(node.inputs[0], g, node.outputs[0], **_pool_attrs(node))]


max_pool_grad = defop("max_pool_grad", num_inputs=(2, 3), pattern=OPAQUE, attrs=dict(_POOL_ATTRS), infer=_x_shaped,
                      doc="Gradient of max_pool: (x, g[, y = max_pool(x)]) -> g routed to each window's first "
                          "argmax in x.")


@max_pool_grad.kernel
def _(xp, x, g, y=None, *, kernel, stride, pad, ceil_mode, dilation=(1,), out=None):
    geo = PoolGeometry(x.ndim - 2, kernel, stride, pad, ceil_mode, dilation)
    done = native.pool_grad(xp, x, g, y, geo, out)
    if done is not None:
        return done
    if xp is np and not np.isfinite(g).all():
        # the kernels below route g by multiplying it with 0/1 masks, and 0 * inf is NaN; as in
        # Caffe (a scatter to the argmax), every element but the window's maximum gets exactly 0
        # (checked on the CPU only: on a device the test would wait for the device at every call)
        _, index, _ = window_argmax(xp, x, geo)
        zero = xp.zeros((), dtype=g.dtype)
        return scatter_windows(xp, lambda i: xp.where(index == i, g, zero), g.dtype, x.shape, geo, out)
    if x.ndim == 4 and tiled.tiles(geo, x.shape[2:]) and tuple(geo.kernel) == (2, 2):
        return tiled.max_grad_2x2(xp, x, g, y, out)
    if tiled.tiles(geo, x.shape[2:]):
        return tiled.max_grad(xp, x, g, geo, out, y)
    return chunked_max_grad(xp, x, g, y, geo, out)


@max_pool_grad.grad
def _(node, gg):
    return [None, max_pool_select(node.inputs[0], gg, **_pool_attrs(node))] + [None] * (len(node.inputs) - 2)


max_pool_select = defop("max_pool_select", num_inputs=2, pattern=OPAQUE, attrs=dict(_POOL_ATTRS), infer=_y_shaped,
                        doc="(x, v) -> v read at each window's first argmax in x (adjoint of max_pool_grad).")


@max_pool_select.kernel
def _(xp, x, v, *, kernel, stride, pad, ceil_mode, dilation=(1,), out=None):
    geo = PoolGeometry(x.ndim - 2, kernel, stride, pad, ceil_mode, dilation)
    _, index, out_sizes = window_argmax(xp, x, geo)
    vpad = pad_to_extent(xp, v, geo, geo.extent(x.shape[2:], out_sizes), 0)
    target = xp.zeros(x.shape[:2] + out_sizes, dtype=v.dtype) if out is None else out
    for i, sl in enumerate(geo.offset_slices(out_sizes)):
        xp.copyto(target, vpad[sl], where=index == i)
    return target


@max_pool_select.grad
def _(node, gg):
    return [None, max_pool_grad(node.inputs[0], gg, **_pool_attrs(node))]


# --------------------------------------------------------------------------- average pooling

avg_pool = defop("avg_pool", num_inputs=1, pattern=OPAQUE, attrs=dict(_AVG_ATTRS), infer=_avg_pool_infer,
                 doc="Average pooling (Caffe Pooling AVE): padding counts in the divisor unless count_include_pad=False.")


def _reciprocal(xp: Any, geo: PoolGeometry, in_sizes: Sequence[int], out_sizes: Sequence[int], include_pad: bool,
                dtype: Any) -> Any:
    return xp.asarray((1.0 / geo.divisor(in_sizes, out_sizes, include_pad)).astype(dtype))


@avg_pool.kernel
def _(xp, x, *, kernel, stride, pad, ceil_mode, dilation=(1,), count_include_pad, out=None):
    geo = PoolGeometry(x.ndim - 2, kernel, stride, pad, ceil_mode, dilation)
    in_sizes = x.shape[2:]
    out_sizes = geo.out_sizes(in_sizes)
    target = xp.empty(x.shape[:2] + out_sizes, dtype=x.dtype) if out is None else out
    separable_pool(xp, x, geo, out_sizes, target, 0, xp.add)   # padding adds nothing to a sum
    target *= _reciprocal(xp, geo, in_sizes, out_sizes, count_include_pad, x.dtype)
    return target


@avg_pool.grad
def _(node, g):
    return [avg_pool_grad(g, node.inputs[0], **node.attrs)]


avg_pool_grad = defop("avg_pool_grad", num_inputs=2, pattern=OPAQUE, attrs=dict(_AVG_ATTRS), infer=_avg_grad_infer,
                      doc="Gradient of avg_pool: (g, x_like) -> g spread over each window / its divisor.")


@avg_pool_grad.kernel
def _(xp, g, x_like, *, kernel, stride, pad, ceil_mode, dilation=(1,), count_include_pad, out=None):
    geo = PoolGeometry(x_like.ndim - 2, kernel, stride, pad, ceil_mode, dilation)
    in_sizes = x_like.shape[2:]
    scaled = g * _reciprocal(xp, geo, in_sizes, geo.out_sizes(in_sizes), count_include_pad, g.dtype)
    return scatter_windows(xp, lambda i: scaled, g.dtype, x_like.shape, geo, out)


@avg_pool_grad.grad
def _(node, gg):
    # avg_pool_grad is avg_pool's adjoint, so its own adjoint is avg_pool
    return [avg_pool(gg, **node.attrs), None]


# --------------------------------------------------------------------------- global pooling

def _global_infer(types):
    x = types[0]
    _check_input(x, "global pooling")
    return TensorType(x.shape[:2] + (1,) * (x.ndim - 2), x.dtype)


def _spatial_axes(ndim: int) -> Tuple[int, ...]:
    return tuple(range(2, ndim))


global_avg_pool = defop("global_avg_pool", num_inputs=1, infer=_global_infer,
                        doc="Mean over all spatial axes, kept as size-1 axes: (N, C, s...) -> (N, C, 1...).")


@global_avg_pool.kernel
def _(xp, x, out=None):
    return xp.mean(x, axis=_spatial_axes(x.ndim), keepdims=True, out=out)


@global_avg_pool.grad
def _(node, g):
    return [global_avg_pool_grad(g, node.inputs[0])]


global_avg_pool_grad = defop("global_avg_pool_grad", num_inputs=2, pattern=OPAQUE,
                             infer=lambda types: types[1].with_dtype(types[0].dtype),
                             doc="(g, x_like) -> g / (spatial size) broadcast to x_like's shape.")


@global_avg_pool_grad.kernel
def _(xp, g, x_like, out=None):
    target = xp.empty(x_like.shape, dtype=g.dtype) if out is None else out
    scale = xp.asarray(1.0 / max(int(np.prod(x_like.shape[2:])), 1), dtype=g.dtype)
    xp.multiply(g, scale, out=target)
    return target


@global_avg_pool_grad.grad
def _(node, gg):
    return [global_avg_pool(gg), None]


global_max_pool = defop("global_max_pool", num_inputs=1, infer=_global_infer,
                        doc="Max over all spatial axes, kept as size-1 axes: (N, C, s...) -> (N, C, 1...).")


@global_max_pool.kernel
def _(xp, x, out=None):
    return xp.max(x, axis=_spatial_axes(x.ndim), keepdims=True, out=out)


@global_max_pool.grad
def _(node, g):
    return [global_max_pool_grad(node.inputs[0], g)]


def _plane_argmax(xp: Any, x: Any) -> Any:
    """First argmax over the flattened spatial plane, shape (N, C, 1)."""
    return xp.argmax(x.reshape(x.shape[0], x.shape[1], -1), axis=2)[:, :, None]


global_max_pool_grad = defop("global_max_pool_grad", num_inputs=2, pattern=OPAQUE,
                             infer=lambda types: types[0].with_dtype(types[1].dtype),
                             doc="(x, g) -> g placed at the first spatial argmax of x, zeros elsewhere.")


@global_max_pool_grad.kernel
def _(xp, x, g, out=None):
    n, c = x.shape[:2]
    hit = xp.arange(int(np.prod(x.shape[2:]))).reshape(1, 1, -1) == _plane_argmax(xp, x)
    result = xp.where(hit, g.reshape(n, c, 1), xp.zeros((), dtype=g.dtype)).reshape(x.shape)
    return store_into(result, out)


@global_max_pool_grad.grad
def _(node, gg):
    return [None, global_max_pool_select(node.inputs[0], gg)]


global_max_pool_select = defop("global_max_pool_select", num_inputs=2, pattern=OPAQUE,
                               infer=lambda types: _global_infer(types[:1]).with_dtype(types[1].dtype),
                               doc="(x, v) -> v at the first spatial argmax of x, shape (N, C, 1...).")


@global_max_pool_select.kernel
def _(xp, x, v, out=None):
    n, c = x.shape[:2]
    picked = xp.take_along_axis(v.reshape(n, c, -1), _plane_argmax(xp, x), axis=2)
    return store_into(picked.reshape((n, c) + (1,) * (x.ndim - 2)), out)


@global_max_pool_select.grad
def _(node, gg):
    return [None, global_max_pool_grad(node.inputs[0], gg)]
