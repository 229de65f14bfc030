"""Shape and layout ONNX ops: Reshape, Flatten, Transpose, (Un)Squeeze, Concat, Split, Shape, Expand,
Tile, constants and generators (Constant, ConstantOfShape, Range, EyeLike), DepthToSpace, Trilu."""
from __future__ import annotations

import numpy as np

from cgvm.ir.graph import const_value
from cgvm.ops import elementwise as E
from cgvm.ops import join as J
from cgvm.ops import shape as shp

from ..translate import rule
from .common import axes_of, axis_of, ints


@rule("Identity")
def _identity(n):
    return [n.input(0)]     # (in a list: the input may be a sequence, itself a list)


@rule("Constant")
def _constant(n):
    for key in ("value", "sparse_value"):
        if key in n.attrs:
            if key == "sparse_value":
                raise n.error("sparse tensors are not supported")
            return np.asarray(n.attr(key))
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in n.attrs:
            return np.asarray(n.attr(key), dtype=dtype)
    raise n.error("Constant has no supported value attribute (strings are not supported)")


def _target_shape(n, in_shape, target, allowzero):
    out = []
    for k, d in enumerate(target):
        if d == 0 and not allowzero:
            if k >= len(in_shape) or in_shape[k] is None:
                raise n.error(f"shape entry {k} copies input dimension {k}, which is unknown")
            d = in_shape[k]
        out.append(int(d))
    if allowzero and 0 in out:
        # a literal zero-size dimension: cgvm's reshape reads 0 as "copy", so name it as the one inferred
        # dimension (-1), which the (empty) input's size resolves to 0
        if -1 in out or out.count(0) > 1:
            raise n.error(f"shape {list(target)} with allowzero: a 0 beside a -1, or several 0s, cannot be resolved")
        out[out.index(0)] = -1
    return tuple(out)


@rule("Reshape")
def _reshape(n):
    x = n.input(0)
    target = n.attr("shape") if n.opset < 5 else n.need_static(1, "shape")
    shape = _target_shape(n, x.shape, ints(target), n.attr("allowzero", 0))
    return shp.reshape(x, shape=shape)


@rule("Flatten")
def _flatten(n):
    x = n.input(0)
    axis = n.attr("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis      # 0..ndim (ndim: everything in the first axis)
    if not 0 <= axis <= x.ndim:
        raise n.error(f"axis {n.attr('axis', 1)} is out of range for rank {x.ndim}")
    s = x.shape
    if None not in s:
        lead, rest = int(np.prod(s[:axis], dtype=np.int64)), int(np.prod(s[axis:], dtype=np.int64))
        return shp.reshape(x, shape=(lead, rest))
    if axis == 0:
        return shp.expand_dims(shp.flatten(x, axis=0, end_axis=-1), axis=(0,))
    y = shp.flatten(x, axis=axis, end_axis=-1) if axis < x.ndim else shp.expand_dims(x, axis=(x.ndim,))
    return shp.flatten(y, axis=0, end_axis=axis - 1) if axis > 1 else y


@rule("Transpose")
def _transpose(n):
    x = n.input(0)
    perm = n.attr("perm")
    return shp.transpose(x, perm=tuple(perm) if perm is not None else tuple(reversed(range(x.ndim))))


@rule("Squeeze")
def _squeeze(n):
    x = n.input(0)
    axes = n.attr("axes") if n.opset < 13 else (n.need_static(1, "axes") if n.has_input(1) else None)
    if axes is None:
        axes = [k for k, d in enumerate(x.shape) if d == 1]
    return shp.squeeze(x, axis=axes_of(ints(axes), x.ndim))


@rule("Unsqueeze")
def _unsqueeze(n):
    x = n.input(0)
    axes = n.attr("axes") if n.opset < 13 else n.need_static(1, "axes")
    axes = ints(axes)
    return shp.expand_dims(x, axis=axes_of(axes, x.ndim + len(axes)))


@rule("Concat")
def _concat(n):
    xs = [v for v in n.inputs if v is not None]
    xs = [x for x in xs if not (x.ndim == 1 and x.shape[0] == 0)] or xs[:1]
    return J.concat(*xs, axis=axis_of(n.attr("axis", 0), xs[0].ndim)) if len(xs) > 1 else shp.contiguous(xs[0])


@rule("Split")
def _split(n):
    x = n.input(0)
    axis = axis_of(n.attr("axis", 0), x.ndim)
    sizes = n.attr("split") if n.opset < 13 else (n.need_static(1, "split") if n.has_input(1) else None)
    k = n.num_outputs
    if sizes is None:
        dim = n.shape(0)[axis]
        parts = n.attr("num_outputs", k)
        chunk = -(-dim // parts)
        sizes = [min(chunk, dim - chunk * i) for i in range(parts)]
    sizes = ints(sizes)
    if len(sizes) == 1:
        return [shp.contiguous(x)]
    return list(J.split(x, axis=axis, sizes=tuple(sizes)))


@rule("Shape")
def _shape(n):
    x = n.input(0)
    start, end = n.attr("start", 0), n.attr("end", None)
    dims = x.shape[start:end] if end is not None else x.shape[start:]
    if None in dims:
        full = shp.shape_of(x)
        if start == 0 and end is None:
            return full
        from cgvm.ops import indexing as I

        return I.slice(full, starts=(start,), stops=(end,), steps=(1,), axes=(0,))
    return np.asarray(dims, dtype=np.int64)


@rule("Size")
def _size(n):
    return np.asarray(int(np.prod(n.shape(0), dtype=np.int64)), dtype=np.int64)


@rule("Expand")
def _expand(n):
    x = n.input(0)
    target = ints(n.need_static(1, "shape"))
    out = tuple(np.broadcast_shapes(tuple(n.shape(0)), tuple(target)))
    return shp.broadcast_to(x, shape=out) if out != tuple(x.shape) else shp.contiguous(x)


@rule("Tile")
def _tile(n):
    return J.tile(n.input(0), reps=tuple(ints(n.need_static(1, "repeats"))))


@rule("ConstantOfShape")
def _constant_of_shape(n):
    shape = tuple(ints(n.need_static(0, "shape")))
    value = n.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    return np.full(shape, value[0], dtype=value.dtype)


@rule("Range")
def _range(n):
    start, limit, delta = (np.asarray(n.need_static(i, w)).reshape(-1)[0]
                           for i, w in enumerate(("start", "limit", "delta")))
    count = max(int(np.ceil((limit - start) / delta)), 0)
    return (start + np.arange(count, dtype=start.dtype) * delta).astype(start.dtype)


@rule("EyeLike")
def _eyelike(n):
    r, c = n.shape(0)
    from ..translate import np_dtype

    dtype = np_dtype(n.attr("dtype")) if n.attr("dtype") is not None else n.input(0).dtype.np
    return np.eye(r, c, k=n.attr("k", 0), dtype=dtype)


@rule("DepthToSpace")
def _depth_to_space(n):
    x = n.input(0)
    b, c, h, w = n.shape(0)
    s = n.attr("blocksize")
    if n.attr("mode", "DCR") == "DCR":
        y = shp.transpose(shp.reshape(x, shape=(b, s, s, c // (s * s), h, w)), perm=(0, 3, 4, 1, 5, 2))
    else:
        y = shp.transpose(shp.reshape(x, shape=(b, c // (s * s), s, s, h, w)), perm=(0, 1, 4, 2, 5, 3))
    return shp.reshape(y, shape=(b, c // (s * s), h * s, w * s))


@rule("SpaceToDepth")
def _space_to_depth(n):
    x = n.input(0)
    b, c, h, w = n.shape(0)
    s = n.attr("blocksize")
    # DCR: the block offsets vary slowest in the output channel; CRD: the input channel does
    perm = (0, 1, 3, 5, 2, 4) if n.attr("mode", "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)
    y = shp.transpose(shp.reshape(x, shape=(b, c, h // s, s, w // s, s)), perm=perm)
    return shp.reshape(y, shape=(b, c * s * s, h // s, w // s))


@rule("Trilu")
def _trilu(n):
    x = n.input(0)
    shape = n.shape(0)
    k = int(np.asarray(n.need_static(1, "k")).reshape(-1)[0]) if n.has_input(1) else 0
    rows, cols = shape[-2], shape[-1]
    keep = np.tri(rows, cols, k=k - 1 if n.attr("upper", 1) else k, dtype=bool)
    keep = ~keep if n.attr("upper", 1) else keep
    return E.where(const_value(keep), x, shp.zeros_like(x))
