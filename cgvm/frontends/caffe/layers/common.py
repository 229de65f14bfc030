"""Common and structural layers: InnerProduct, Embed, Scale, Bias, Eltwise, Concat, Slice, Split,
Flatten, Reshape, Softmax, ArgMax, Reduction, Tile, Silence, BatchReindex, Parameter.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.fillers import constant_filler
from cgvm.frontends.caffe.layers.base import (LayerContext, as_index, canonical_axis, count, need_bottoms, register,
                                              scalar)
from cgvm.frontends.caffe.layers.neuron import identity
from cgvm.ir import Value
from cgvm.ops import elementwise as ew
from cgvm.ops import indexing as ix
from cgvm.ops import linalg
from cgvm.ops import nn
from cgvm.ops import reduce as red
from cgvm.ops import join
from cgvm.ops import shape as shp
from cgvm.ops import sorting


def _filler(param, field: str, default: Optional[caffe_pb2.FillerParameter] = None):
    return getattr(param, field) if param.HasField(field) else default


@register("InnerProduct")
def inner_product(layer, bottoms, ctx):
    """y = x_flat W^T + b with x flattened from `axis` on (W is (N, K), or (K, N) with transpose)."""
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    param = layer.inner_product_param
    if not param.num_output:
        raise ctx.error("inner_product_param.num_output must be given and positive")
    axis = canonical_axis(param.axis, x.ndim, ctx)
    k, m, n = count(x.shape, axis), count(x.shape, 0, axis), int(param.num_output)
    weight = ctx.param(0, (k, n) if param.transpose else (n, k), _filler(param, "weight_filler"))
    args = [shp.reshape(x, shape=(m, k)), weight]
    if param.bias_term:
        args.append(ctx.param(1, (n,), _filler(param, "bias_filler")))
    y = linalg.gemm(*args, trans_b=not param.transpose)
    return [shp.reshape(y, shape=tuple(x.shape[:axis]) + (n,))]


@register("Embed")
def embed(layer, bottoms, ctx):
    """Rows of W (input_dim, num_output) picked by the integer values of the bottom (+ bias)."""
    need_bottoms(bottoms, (1,), ctx)
    param = layer.embed_param
    if not param.num_output or not param.input_dim:
        raise ctx.error("embed_param needs num_output and input_dim")
    weight = ctx.param(0, (param.input_dim, param.num_output), _filler(param, "weight_filler"))
    y = nn.embedding(as_index(bottoms[0]), weight)
    if param.bias_term:
        y = ew.add(y, ctx.param(1, (param.num_output,), _filler(param, "bias_filler")))
    return [y]


def _broadcast_operand(x: Value, operand_shape: Sequence[int], axis: int, operand: Value) -> Value:
    """``operand`` (shape = x.shape[axis:axis+k]) reshaped to broadcast against x."""
    trailing = x.ndim - axis - len(operand_shape)
    return operand if trailing == 0 else shp.reshape(operand, shape=tuple(operand_shape) + (1,) * trailing)


def _scale_axes(x: Value, param, second: Optional[Value], ctx: LayerContext) -> Tuple[int, Tuple[int, ...]]:
    """(axis, operand shape) for Scale/Bias: from the second bottom, or from axis/num_axes."""
    if second is not None:
        if second.ndim == 0:
            return 0, ()
        axis = canonical_axis(param.axis, x.ndim, ctx)
        shape = tuple(int(d) for d in second.shape)
        if tuple(x.shape[axis:axis + len(shape)]) != shape:
            raise ctx.error(f"bottom[1] of shape {shape} must match bottom[0] {tuple(x.shape)} from axis {axis}")
        return axis, shape
    axis = canonical_axis(param.axis, x.ndim, ctx) if x.ndim else 0
    if param.num_axes < -1:
        raise ctx.error(f"num_axes must be -1 (to the end) or non-negative, got {param.num_axes}")
    end = x.ndim if param.num_axes == -1 else axis + param.num_axes
    if end > x.ndim:
        raise ctx.error(f"axis {axis} + num_axes {param.num_axes} runs past the bottom's {x.ndim} axes")
    return axis, tuple(int(d) for d in x.shape[axis:end])


@register("Scale")
def scale(layer, bottoms, ctx):
    """x times a scale (bottom[1] or a learned blob, default 1) broadcast from `axis`, plus an optional bias."""
    need_bottoms(bottoms, (1, 2), ctx)
    x = bottoms[0]
    param = layer.scale_param
    second = bottoms[1] if len(bottoms) == 2 else None
    axis, shape = _scale_axes(x, param, second, ctx)
    factor = second if second is not None else ctx.param(0, shape, _filler(param, "filler", constant_filler(1.0)))
    y = ew.mul(x, _broadcast_operand(x, shape, axis, factor))
    if param.bias_term:
        index = 0 if second is not None else 1
        bias = ctx.param(index, shape, _filler(param, "bias_filler", constant_filler(0.0)))
        y = ew.add(y, _broadcast_operand(x, shape, axis, bias))
    return [y]


@register("Bias")
def bias(layer, bottoms, ctx):
    """x plus a bias (bottom[1] or a learned blob, default 0) broadcast from `axis`."""
    need_bottoms(bottoms, (1, 2), ctx)
    x = bottoms[0]
    param = layer.bias_param
    second = bottoms[1] if len(bottoms) == 2 else None
    axis, shape = _scale_axes(x, param, second, ctx)
    operand = second if second is not None else ctx.param(0, shape, _filler(param, "filler", constant_filler(0.0)))
    return [ew.add(x, _broadcast_operand(x, shape, axis, operand))]


_E = caffe_pb2.EltwiseParameter


@register("Eltwise")
def eltwise(layer, bottoms, ctx):
    """PROD, SUM (with coefficients) or MAX of equally shaped bottoms (MAX ties as Caffe breaks them)."""
    if len(bottoms) < 2:
        raise ctx.error(f"Eltwise takes at least 2 bottoms, got {len(bottoms)}")
    first = tuple(bottoms[0].shape)
    for i, b in enumerate(bottoms[1:], 1):
        if tuple(b.shape) != first:
            raise ctx.error(f"bottom {i} has shape {tuple(b.shape)}, bottom 0 has {first}; Eltwise needs equal shapes")
    param = layer.eltwise_param
    coeffs = list(param.coeff)
    if coeffs and (param.operation != _E.SUM or len(coeffs) != len(bottoms)):
        raise ctx.error("eltwise_param.coeff is for SUM only, with one coefficient per bottom")
    if param.operation == _E.PROD:
        y = bottoms[0]
        for b in bottoms[1:]:
            y = ew.mul(y, b)
        return [y]
    if param.operation == _E.SUM:
        terms = [b if not coeffs or coeffs[i] == 1.0 else ew.mul(b, scalar(coeffs[i], b))
                 for i, b in enumerate(bottoms)]
        y = terms[0]
        for t in terms[1:]:
            y = ew.add(y, t)
        return [y]
    # MAX: bottom 1 wins a tie with bottom 0; later bottoms replace only when strictly greater.
    y = bottoms[0]
    for i, b in enumerate(bottoms[1:], 1):
        y = ew.where(ew.ge(b, y) if i == 1 else ew.gt(b, y), b, y)
    return [y]


@register("Concat")
def concat(layer, bottoms, ctx):
    if not bottoms:
        raise ctx.error("Concat needs at least one bottom")
    param = layer.concat_param
    if param.HasField("concat_dim") and param.HasField("axis"):
        raise ctx.error("give either axis or the deprecated concat_dim, not both")
    axis = param.concat_dim if param.HasField("concat_dim") else param.axis
    axis = canonical_axis(axis, bottoms[0].ndim, ctx)
    if len(bottoms) == 1:
        return [identity(bottoms[0])]
    for i, b in enumerate(bottoms[1:], 1):
        a, c = tuple(bottoms[0].shape), tuple(b.shape)
        if len(a) != len(c) or a[:axis] + a[axis + 1:] != c[:axis] + c[axis + 1:]:
            raise ctx.error(f"bottom {i} of shape {c} does not fit bottom 0 of shape {a} for concat along axis {axis}")
    return [join.concat(*bottoms, axis=axis)]


@register("Slice")
def slice_layer(layer, bottoms, ctx):
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    param = layer.slice_param
    if param.HasField("slice_dim") and param.HasField("axis"):
        raise ctx.error("give either axis or the deprecated slice_dim, not both")
    axis = canonical_axis(param.slice_dim if param.HasField("slice_dim") else param.axis, x.ndim, ctx)
    size, tops = int(x.shape[axis]), len(layer.top)
    points = list(param.slice_point)
    if points:
        if len(points) != tops - 1:
            raise ctx.error(f"{len(points)} slice_point(s) for {tops} tops; give one fewer than the tops")
        bounds = [0] + points + [size]
        if any(b > a for a, b in zip(bounds[1:], bounds[:-1])) or bounds[-2] > size:
            raise ctx.error(f"slice_point {points} must increase and stay within the axis size {size}")
        sizes = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    else:
        if size % tops:
            raise ctx.error(f"axis {axis} of size {size} does not split evenly into {tops} tops")
        sizes = [size // tops] * tops
    if tops == 1:
        return [identity(x)]
    parts = join.split(x, axis=axis, sizes=sizes)
    return list(parts)


@register("Split")
def split(layer, bottoms, ctx):
    """Every top is the bottom; backward sums the top gradients."""
    need_bottoms(bottoms, (1,), ctx)
    return [identity(bottoms[0]) for _ in layer.top]


@register("Flatten")
def flatten(layer, bottoms, ctx):
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    start = canonical_axis(layer.flatten_param.axis, x.ndim, ctx)
    end = canonical_axis(layer.flatten_param.end_axis, x.ndim, ctx, "end_axis")
    if end < start:
        raise ctx.error(f"end_axis {end} comes before axis {start}")
    return [shp.flatten(x, axis=start, end_axis=end)]


def reshape_target(in_shape: Sequence[int], param: caffe_pb2.ReshapeParameter, ctx: LayerContext) -> Tuple[int, ...]:
    """Caffe's Reshape: dims replace axes [axis, axis+num_axes); 0 copies, one -1 is inferred."""
    ndim = len(in_shape)
    axis = param.axis
    start = axis if axis >= 0 else ndim + axis + 1
    if not 0 <= start <= ndim:
        raise ctx.error(f"reshape axis {axis} is out of range for a bottom with {ndim} axes")
    if param.num_axes < -1:
        raise ctx.error(f"num_axes must be -1 or non-negative, got {param.num_axes}")
    end = ndim if param.num_axes == -1 else start + param.num_axes
    if end > ndim:
        raise ctx.error(f"axis {start} + num_axes {param.num_axes} runs past the bottom's {ndim} axes")
    dims: List[int] = []
    infer_at = None
    for i, d in enumerate(param.shape.dim):
        if d == 0:
            if start + i >= ndim:
                raise ctx.error(f"shape dim {i} is 0 (copy), but the bottom has no axis {start + i}")
            dims.append(int(in_shape[start + i]))
        elif d == -1:
            if infer_at is not None:
                raise ctx.error("at most one shape dim may be -1")
            infer_at = i
            dims.append(1)
        elif d < -1:
            raise ctx.error(f"shape dim {d} is negative")
        else:
            dims.append(int(d))
    out = list(in_shape[:start]) + dims + list(in_shape[end:])
    total = count(in_shape)
    if infer_at is not None:
        known = count(out)
        if known == 0 or total % known:
            raise ctx.error(f"cannot infer the -1 dim: {total} elements do not fit shape {tuple(param.shape.dim)}")
        out[start + infer_at] = total // known
    if count(out) != total:
        raise ctx.error(f"cannot reshape {tuple(in_shape)} ({total} elements) to {tuple(out)}")
    return tuple(int(d) for d in out)


@register("Reshape")
def reshape(layer, bottoms, ctx):
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    return [shp.reshape(x, shape=reshape_target(tuple(int(d) for d in x.shape), layer.reshape_param, ctx))]


@register("Softmax")
def softmax(layer, bottoms, ctx):
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    return [nn.softmax(x, axis=canonical_axis(layer.softmax_param.axis, x.ndim, ctx))]


def top_k_indices(x: Value, axis: int, k: int) -> Value:
    """Indices of the k largest values along ``axis``, largest first; ties go to the larger index (Caffe)."""
    order = sorting.argsort(x, axis=axis)                   # stable ascending: equal values by index
    size = int(x.shape[axis])
    return ix.slice(order, starts=(size - 1,), stops=(size - 1 - k if size - 1 - k >= 0 else None,),
                    steps=(-1,), axes=(axis,))


@register("ArgMax")
def argmax(layer, bottoms, ctx):
    """Indices (or with out_max_val, values) of the top_k largest entries, per sample or along `axis`."""
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    param = layer.argmax_param
    k = int(param.top_k)
    if param.HasField("axis"):
        axis = canonical_axis(param.axis, x.ndim, ctx)
        if k > int(x.shape[axis]):
            raise ctx.error(f"top_k {k} is larger than axis {axis} ({int(x.shape[axis])})")
        index = top_k_indices(x, axis, k)
        if param.out_max_val:
            return [sorting.take_along_axis(x, index, axis=axis)]
        return [ew.cast(index, dtype=x.dtype)]
    num = int(x.shape[0])
    flat = shp.reshape(x, shape=(num, count(x.shape, 1)))
    if k > int(flat.shape[1]):
        raise ctx.error(f"top_k {k} is larger than the {int(flat.shape[1])} values per sample")
    index = top_k_indices(flat, 1, k)
    indices = ew.cast(index, dtype=x.dtype)
    if param.out_max_val:
        values = sorting.take_along_axis(flat, index, axis=1)
        return [join.stack(indices, values, axis=1)]
    return [shp.reshape(indices, shape=(num, 1, k))]


_R = caffe_pb2.ReductionParameter


@register("Reduction")
def reduction(layer, bottoms, ctx):
    """SUM, ASUM, SUMSQ or MEAN over all axes from `axis` on, times coeff."""
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    param = layer.reduction_param
    axis = canonical_axis(param.axis, x.ndim, ctx) if x.ndim else 0
    axes = tuple(range(axis, x.ndim))
    operand = {_R.SUM: x, _R.MEAN: x, _R.ASUM: ew.abs(x), _R.SUMSQ: ew.square(x)}[param.operation]
    y = (red.mean if param.operation == _R.MEAN else red.sum)(operand, axis=axes) if axes else identity(operand)
    return [y if param.coeff == 1.0 else ew.mul(y, scalar(param.coeff, x))]


@register("Tile")
def tile(layer, bottoms, ctx):
    need_bottoms(bottoms, (1,), ctx)
    x = bottoms[0]
    param = layer.tile_param
    if param.tiles < 1:
        raise ctx.error("tile_param.tiles must be positive")
    axis = canonical_axis(param.axis, x.ndim, ctx)
    reps = tuple(param.tiles if i == axis else 1 for i in range(x.ndim))
    return [join.tile(x, reps=reps)]


@register("Silence")
def silence(layer, bottoms, ctx):
    """Consumes its bottoms and produces nothing."""
    return []


@register("BatchReindex")
def batch_reindex(layer, bottoms, ctx):
    need_bottoms(bottoms, (2,), ctx)
    x, index = bottoms
    return [ix.take(x, as_index(index), axis=0)]


@register("Parameter")
def parameter(layer, bottoms, ctx):
    """A learned blob of parameter_param.shape as the top."""
    need_bottoms(bottoms, (0,), ctx)
    shape = tuple(int(d) for d in layer.parameter_param.shape.dim)
    return [identity(ctx.param(0, shape, None))]
