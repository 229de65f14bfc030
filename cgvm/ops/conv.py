"""Convolution family, NCHW with any number of spatial axes: conv, conv_transpose and their gradient ops.

``conv`` is cross-correlation as in Caffe and PyTorch: weight (C_out, C_in/groups, k...).
``conv_transpose`` is Caffe's Deconvolution / PyTorch's conv_transpose: weight (C_in, C_out/groups, k...).

Attributes shared by the family (each may be one value for all spatial axes or one per axis):
``stride`` (1), ``dilation`` (1), ``pad`` (0): one value, one per axis (symmetric), or 2·n values
``(begin_0, ..., begin_n-1, end_0, ..., end_n-1)`` as in ONNX for asymmetric padding; ``groups`` (1).
Output size per axis: ``floor((in + pad_begin + pad_end - (dilation·(k-1)+1)) / stride) + 1``.

Kernels: im2col is an ``as_strided`` view of the zero-padded input copied, a chunk of samples
at a time, into a contiguous (chunk, groups, C/g·Πk, L) block, then GEMMs over (samples,
groups). The forward's temporaries are declared as scratch (cgvm.ops.scratch), so the memory
plan holds them. col2im is a loop over kernel offsets adding strided slices
(no scatter), which is what the transposed ops use.

Gradients are three ops closed under differentiation (conv is bilinear in x and w):
``conv_grad_input(g, w, x_like)`` (= conv_transpose with the output shape of x) and
``conv_grad_weight(x, g, w_like)`` (correlation of x with g); the ``*_like`` inputs only give
shapes, which the floor in the size rule makes unrecoverable from g alone.
"""
from __future__ import annotations

import itertools
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DTypeError, ShapeError
from ..ir.attrs import Int, Ints
from ..ir.types import TensorType
from . import conv_batchlast as batch_last
from . import conv_winograd as winograd
from . import reduce as red
from .registry import OPAQUE, defop
from .rules import Dim, require_float
from .scratch import Layout, layout_bytes, take

PadPairs = Tuple[Tuple[int, int], ...]


# --------------------------------------------------------------------------- geometry helpers

def spatial_values(values: Sequence[int], nsp: int, what: str, minimum: int = 1) -> Tuple[int, ...]:
    """``values`` expanded to one entry per spatial axis (a single value applies to all axes)."""
    if len(values) == 1:
        values = tuple(values) * nsp
    elif len(values) != nsp:
        raise ShapeError(f"{what} has {len(values)} values; give 1 or {nsp} (one per spatial axis)")
    for v in values:
        if v < minimum:
            raise ShapeError(f"{what} must be at least {minimum}, got {tuple(values)}")
    return tuple(values)


def pad_pairs(pad: Sequence[int], nsp: int) -> PadPairs:
    """(begin, end) padding per spatial axis from 1, n (symmetric) or 2·n (begins then ends) values."""
    pad = tuple(pad)
    if any(p < 0 for p in pad):
        raise ShapeError(f"pad must not be negative, got {pad}")
    if len(pad) == 1:
        return ((pad[0], pad[0]),) * nsp
    if len(pad) == nsp:
        return tuple((p, p) for p in pad)
    if len(pad) == 2 * nsp:
        return tuple(zip(pad[:nsp], pad[nsp:]))
    raise ShapeError(f"pad has {len(pad)} values; give 1, {nsp} (symmetric per axis) or {2 * nsp} "
                     f"(begins then ends)")


def conv_out_size(n: Dim, k: Dim, stride: int, dilation: int, pads: Tuple[int, int]) -> Dim:
    """Convolution output length on one axis (floor rule); None when unknown."""
    if n is None or k is None:
        return None
    span = n + pads[0] + pads[1] - (dilation * (k - 1) + 1)
    if span < 0:
        raise ShapeError(f"kernel {k} (dilation {dilation}) is larger than the padded input {n}+{pads[0]}+{pads[1]}")
    return span // stride + 1


def _prod(values: Sequence[int]) -> int:
    n = 1
    for v in values:
        n *= v
    return n


class ConvGeometry:
    """Attributes normalised for a given number of spatial axes."""

    __slots__ = ("nsp", "stride", "dilation", "pads", "groups")

    def __init__(self, nsp: int, stride: Sequence[int], pad: Sequence[int], dilation: Sequence[int], groups: int):
        self.nsp = nsp
        self.stride = spatial_values(stride, nsp, "stride")
        self.dilation = spatial_values(dilation, nsp, "dilation")
        self.pads = pad_pairs(pad, nsp)
        if groups < 1:
            raise ShapeError(f"groups must be at least 1, got {groups}")
        self.groups = groups

    def out_sizes(self, in_sizes: Sequence[Dim], ksize: Sequence[Dim]) -> Tuple[Dim, ...]:
        return tuple(conv_out_size(n, k, s, d, p) for n, k, s, d, p in
                     zip(in_sizes, ksize, self.stride, self.dilation, self.pads))

    def offset_slices(self, ksize: Sequence[int], out_sizes: Sequence[int]) -> List[Tuple[Tuple[int, ...], tuple]]:
        """For each kernel offset (row-major), the strided slice of the padded input it reads."""
        result = []
        for kk in itertools.product(*[range(k) for k in ksize]):
            sl = tuple(slice(k * d, k * d + (o - 1) * s + 1, s)
                       for k, d, o, s in zip(kk, self.dilation, out_sizes, self.stride))
            result.append((kk, (slice(None), slice(None)) + sl))
        return result


def crop_padding(acc: Any, pads: PadPairs, in_sizes: Sequence[int]) -> Any:
    """The unpadded interior of a padded buffer (a view)."""
    return acc[(slice(None), slice(None)) + tuple(slice(b, b + n) for n, (b, _) in zip(in_sizes, pads))]


def _windows(xp: Any, xpad: Any, ksize: Sequence[int], out_sizes: Sequence[int], geo: ConvGeometry) -> Any:
    """Strided view (N, C, k..., out...) of the padded input: element [n, c, k, p] = xpad[n, c, p·s + k·d]."""
    sp = xpad.strides[2:]
    shape = tuple(xpad.shape[:2]) + tuple(ksize) + tuple(out_sizes)
    strides = tuple(xpad.strides[:2]) + tuple(st * d for st, d in zip(sp, geo.dilation)) + \
        tuple(st * s for st, s in zip(sp, geo.stride))
    return xp.lib.stride_tricks.as_strided(xpad, shape=shape, strides=strides)


def _is_pointwise(ksize: Sequence[int], geo: ConvGeometry) -> bool:
    return all(k == 1 for k in ksize) and all(s == 1 for s in geo.stride) and not any(b or e for b, e in geo.pads)


def _store(xp: Any, result: Any, out: Optional[Any]) -> Any:
    if out is None:
        return result
    out[...] = result
    return out


def _bias_shape(nsp: int, channels: int) -> Tuple[int, ...]:
    return (1, channels) + (1,) * nsp


def _grouped_matmul(xp: Any, a: Any, b: Any, out: Optional[Any] = None) -> Any:
    """a (G, M, K) @ b (N, G, K, L) -> (N, G, M, L), one GEMM per (sample, group).

    NumPy's matmul sends an operand broadcast along the batch (stride 0) through its non-BLAS
    loop, 20-50x slower than GEMM; a loop of GEMMs needs no broadcast copy of the weights.
    """
    if out is None:
        out = xp.empty((b.shape[0], a.shape[0], a.shape[1], b.shape[3]), dtype=xp.result_type(a, b))
    for i in range(b.shape[0]):
        for j in range(a.shape[0]):
            xp.matmul(a[j], b[i, j], out=out[i, j])
    return out


# --------------------------------------------------------------------------- kernels (array-module generic)

# im2col columns are built for a chunk of samples at a time, about this many bytes: the block stays
# in a core's L2 cache, and a small buffer reused across chunks avoids the page faults that a
# fresh batch-sized buffer costs on every call (they dominated the run time when measured).
COLUMN_BUDGET_BYTES = 1 << 20


def sample_chunks(n: int, bytes_per_sample: int) -> List[Tuple[int, int]]:
    """[start, stop) ranges over the batch, each holding about COLUMN_BUDGET_BYTES of columns."""
    size = max(1, COLUMN_BUDGET_BYTES // max(bytes_per_sample, 1))
    return [(i, min(i + size, n)) for i in range(0, n, size)]


def forward_methods(x_shape: Sequence[int], w_shape: Sequence[int], dtype: Any, geo: ConvGeometry
                    ) -> List[Tuple[str, int]]:
    """The methods conv_forward can use for this convolution, fastest first: ("winograd", tile side)
    for 3x3 stride-1 2-D convolutions in float32/64 with one group where conv_winograd.choose_tile
    says it pays, then one of ("batch_last" | "pointwise" | "im2col", 0)."""
    ksize = tuple(w_shape[2:])
    out_sizes = geo.out_sizes(x_shape[2:], ksize)
    dtype = np.dtype(dtype)
    methods: List[Tuple[str, int]] = []
    if (geo.nsp == 2 and ksize == (3, 3) and geo.groups == 1 and geo.stride == (1, 1) and geo.dilation == (1, 1)
            and dtype.kind == "f" and dtype.itemsize in (4, 8)):
        tile = winograd.choose_tile(x_shape[0], x_shape[1], w_shape[0], out_sizes[0], out_sizes[1], dtype.itemsize)
        if tile:
            methods.append(("winograd", tile))
    if _is_pointwise(ksize, geo):
        methods.append(("pointwise", 0))
    elif batch_last.batch_last_pays(x_shape, out_sizes, "forward"):
        methods.append(("batch_last", 0))
    else:
        methods.append(("im2col", 0))
    return methods


def forward_layout(x_shape: Sequence[int], w_shape: Sequence[int], has_bias: bool, dtype: Any,
                   geo: ConvGeometry, method: Tuple[str, int]) -> Layout:
    """The temporaries conv_forward takes (cgvm.ops.scratch) for these operands by ``method``."""
    kind, tile = method
    out_sizes = geo.out_sizes(x_shape[2:], w_shape[2:])
    if kind == "winograd":
        return winograd.scratch_layout(x_shape, w_shape[0], geo.pads, tile, dtype)
    if kind == "batch_last":
        return batch_last.forward_layout(x_shape, w_shape, geo, out_sizes, dtype)
    if kind == "pointwise":
        return []
    # im2col: the columns and the padded input of one chunk of samples
    n, c = x_shape[:2]
    cg = w_shape[1]
    g = geo.groups
    length = _prod(out_sizes)
    chunk = sample_chunks(n, g * cg * _prod(w_shape[2:]) * length * np.dtype(dtype).itemsize)[0][1]
    layout: Layout = [("cols", (chunk, g, cg * _prod(w_shape[2:]), length), dtype)]
    if any(b or e for b, e in geo.pads):
        layout.append(("padded", (chunk, c) + tuple(s + b + e for s, (b, e) in zip(x_shape[2:], geo.pads)), dtype))
    return layout


def conv_forward(xp: Any, x: Any, w: Any, b: Optional[Any], geo: ConvGeometry, out: Optional[Any] = None,
                 scratch: Optional[Any] = None) -> Any:
    """y = conv(x, w) + b. Runs the first of forward_methods whose temporaries fit in ``scratch``
    (a planned uint8 block, see cgvm.ops.scratch), or the first, allocating, without one.

    im2col copies the windows of a chunk of samples (zero-padded one chunk at a time) into
    columns, then GEMMs over (samples, groups) and adds the bias to the chunk's output while it
    is in cache (a row of ones in the columns would need a bias-augmented copy of the weights)."""
    n = x.shape[0]
    o, cg = w.shape[:2]
    ksize = tuple(w.shape[2:])
    g = geo.groups
    og = o // g
    out_sizes = geo.out_sizes(x.shape[2:], ksize)
    length = _prod(out_sizes)
    target = out if out is not None and out.flags.c_contiguous else xp.empty((n, o) + out_sizes, dtype=x.dtype)
    methods = forward_methods(x.shape, w.shape, x.dtype, geo)
    layouts = [forward_layout(x.shape, w.shape, b is not None, x.dtype, geo, m) for m in methods]
    pick = 0 if scratch is None else next((i for i, lay in enumerate(layouts) if layout_bytes(lay) <= scratch.nbytes), 0)
    (kind, tile), temps = methods[pick], take(xp, scratch, layouts[pick])
    results = target.reshape(n, g, og, length)
    wmat = w.reshape(g, og, -1)
    if kind == "winograd":
        winograd.winograd_conv2d(xp, x, w, b, geo.pads, target, tile, temps)
    elif kind == "batch_last":
        batch_last.forward(xp, x, w, b, geo, out_sizes, target, temps)
    elif kind == "pointwise":
        _grouped_matmul(xp, wmat, x.reshape(n, g, cg, length), out=results)
        if b is not None:
            target += b.reshape(_bias_shape(geo.nsp, o))
    else:
        cols, padded = temps["cols"], temps.get("padded")
        if padded is not None:
            padded[...] = 0      # the borders stay zero; each chunk overwrites the interior
            interior = crop_padding(padded, geo.pads, x.shape[2:])
        block = (g, cg) + ksize + out_sizes
        for start, stop in sample_chunks(n, cols[0].size * x.dtype.itemsize):
            m = stop - start
            source = x[start:stop]
            if padded is not None:
                interior[:m] = source
                source = padded[:m]
            view = _windows(xp, source, ksize, out_sizes, geo)
            cols[:m].reshape((m,) + block)[...] = view.reshape((m,) + block)
            _grouped_matmul(xp, wmat, cols[:m], out=results[start:stop])
            if b is not None:    # while the chunk's output is in cache
                results[start:stop] += b.reshape(1, g, og, 1)
    return target if out is None or target is out else _store(xp, target, out)


def conv_forward_scratch(types: Sequence[TensorType], stride: Sequence[int], pad: Sequence[int],
                         dilation: Sequence[int], groups: int) -> Tuple[int, ...]:
    """Scratch bytes of each of conv_forward's methods for input types (x, w[, b]), fastest first."""
    x, w = types[0], types[1]
    geo = ConvGeometry(x.ndim - 2, stride, pad, dilation, groups)
    return tuple(layout_bytes(forward_layout(x.shape, w.shape, len(types) == 3, x.dtype.np, geo, m))
                 for m in forward_methods(x.shape, w.shape, x.dtype.np, geo))


def _padded_sizes(sizes: Sequence[int], geo: ConvGeometry) -> Tuple[int, ...]:
    return tuple(n + b + e for n, (b, e) in zip(sizes, geo.pads))


def _has_padding(geo: ConvGeometry) -> bool:
    return any(b or e for b, e in geo.pads)


def backward_input_layout(g_shape: Sequence[int], w_shape: Sequence[int], in_sizes: Sequence[int], dtype: Any,
                          geo: ConvGeometry) -> Layout:
    """The temporaries of conv_backward_input's im2col path (none for the others): the columns and
    the padded accumulator of one chunk of samples."""
    n, o = g_shape[:2]
    cg, ksize, out_sizes = w_shape[1], tuple(w_shape[2:]), tuple(g_shape[2:])
    if (batch_last.batch_last_pays((n, cg * geo.groups) + tuple(in_sizes), out_sizes, "input")
            or (_is_pointwise(ksize, geo) and tuple(in_sizes) == out_sizes)):
        return []
    rows = geo.groups * _prod(ksize) * cg
    chunk = sample_chunks(n, rows * _prod(out_sizes) * np.dtype(dtype).itemsize)[0][1]
    layout: Layout = [("cols", (chunk * rows * _prod(out_sizes),), dtype)]
    if _has_padding(geo):
        layout.append(("acc", (chunk, cg * geo.groups) + _padded_sizes(in_sizes, geo), dtype))
    return layout


def conv_backward_input(xp: Any, g: Any, w: Any, in_sizes: Sequence[int], geo: ConvGeometry,
                        out: Optional[Any] = None, scratch: Optional[Any] = None) -> Any:
    """dx for y = conv(x, w): per chunk of samples, GEMM to columns, then col2im as strided slice
    additions into the chunk's (padded) accumulator; temporaries from ``scratch`` when given."""
    n, o = g.shape[:2]
    in_sizes = tuple(in_sizes)
    shape = (n, w.shape[1] * geo.groups) + in_sizes
    target = out if out is not None and out.flags.c_contiguous else xp.empty(shape, dtype=g.dtype)
    out_sizes = tuple(g.shape[2:])
    cg = w.shape[1]
    ksize = tuple(w.shape[2:])
    groups = geo.groups
    og = o // groups
    length = _prod(out_sizes)
    if batch_last.batch_last_pays(shape, out_sizes, "input"):
        batch_last.backward_input(xp, g, w, in_sizes, geo, target)
    elif _is_pointwise(ksize, geo) and in_sizes == out_sizes:
        gmat = xp.ascontiguousarray(g).reshape(n, groups, og, length)
        xp.matmul(w.reshape(groups, og, cg).transpose(0, 2, 1), gmat, out=target.reshape(n, groups, cg, length))
    else:
        temps = take(xp, scratch, backward_input_layout(g.shape, w.shape, in_sizes, g.dtype, geo))
        gmat = xp.ascontiguousarray(g).reshape(n, groups, og, length)
        kcount = _prod(ksize)
        # columns ordered (sample, group, kernel offset, C/g, L): each offset's block is contiguous for col2im
        wmat_t = w.reshape(groups, og, cg, kcount).transpose(0, 3, 2, 1).reshape(groups, kcount * cg, og)
        offsets = geo.offset_slices(ksize, out_sizes)
        padded = _has_padding(geo)
        for start, stop in sample_chunks(n, groups * kcount * cg * length * g.dtype.itemsize):
            m = stop - start
            cols = temps["cols"][:m * groups * kcount * cg * length].reshape(m, groups, kcount * cg, length)
            if og == 1:  # depthwise-like: an outer product, which a GEMM with inner size 1 does slowly
                xp.multiply(wmat_t, gmat[start:stop], out=cols)
            else:
                _grouped_matmul(xp, wmat_t, gmat[start:stop], out=cols)
            cols = cols.reshape((m, groups, kcount, cg) + out_sizes)
            acc = temps["acc"][:m] if padded else target[start:stop]
            acc[...] = 0
            grouped = acc.reshape((m, groups, cg) + acc.shape[2:])
            for i, (_, sl) in enumerate(offsets):
                view = grouped[(slice(None),) + sl]
                xp.add(view, cols[:, :, i], out=view)
            if padded:
                target[start:stop] = crop_padding(acc, geo.pads, in_sizes)
    return target if out is None or target is out else _store(xp, target, out)


def backward_weight_layout(x_shape: Sequence[int], g_shape: Sequence[int], ksize: Sequence[int], dtype: Any,
                           geo: ConvGeometry) -> Layout:
    """The temporaries of conv_backward_weight's im2col path (none for batch-last): the padded
    input, columns and gradient rows of one chunk of samples, and a partial product."""
    out_sizes = tuple(g_shape[2:])
    if batch_last.batch_last_pays(x_shape, out_sizes, "weight"):
        return []
    n, c = x_shape[:2]
    o = g_shape[1]
    length, kc = _prod(out_sizes), (c // geo.groups) * _prod(ksize)
    chunk = sample_chunks(n, c * _prod(ksize) * length * np.dtype(dtype).itemsize)[0][1]
    layout: Layout = [("cols", (geo.groups * kc * chunk * length,), dtype), ("gmat", (o * chunk * length,), dtype),
                      ("partial", (geo.groups, o // geo.groups, kc), dtype)]
    if _has_padding(geo):
        layout.append(("padded", (chunk, c) + _padded_sizes(x_shape[2:], geo), dtype))
    return layout


def conv_backward_weight(xp: Any, x: Any, g: Any, ksize: Sequence[int], geo: ConvGeometry,
                         out: Optional[Any] = None, scratch: Optional[Any] = None) -> Any:
    """dw for y = conv(x, w): per group and chunk of samples, g (O/g, m·L) times x's columns (m·L, C/g·Πk),
    summed over the chunks; temporaries from ``scratch`` when given."""
    n, c = x.shape[:2]
    o = g.shape[1]
    groups = geo.groups
    og = o // groups
    ksize = tuple(ksize)
    target = out if out is not None and out.flags.c_contiguous else \
        xp.empty((o, c // groups) + ksize, dtype=x.dtype)
    if batch_last.batch_last_pays(x.shape, g.shape[2:], "weight"):
        batch_last.backward_weight(xp, x, g, ksize, geo, target)
        return target if out is None or target is out else _store(xp, target, out)
    temps = take(xp, scratch, backward_weight_layout(x.shape, g.shape, ksize, x.dtype, geo))
    out_sizes = tuple(g.shape[2:])
    nsp = geo.nsp
    length = _prod(out_sizes)
    kc = (c // groups) * _prod(ksize)
    padded = temps.get("padded")
    if padded is not None:
        padded[...] = 0      # the borders stay zero; each chunk overwrites the interior
        interior = crop_padding(padded, geo.pads, x.shape[2:])
    # (C, k..., m, out...) so that each group's columns are one contiguous (C/g·Πk, m·L) matrix
    order = (1,) + tuple(range(2, 2 + nsp)) + (0,) + tuple(range(2 + nsp, 2 + 2 * nsp))
    result = target.reshape(groups, og, kc)
    for index, (start, stop) in enumerate(sample_chunks(n, c * _prod(ksize) * length * x.dtype.itemsize)):
        m = stop - start
        source = x[start:stop]
        if padded is not None:
            interior[:m] = source
            source = padded[:m]
        view = _windows(xp, source, ksize, out_sizes, geo)
        cols = temps["cols"][:groups * kc * m * length]
        cols.reshape((c,) + ksize + (m,) + out_sizes)[...] = view.transpose(order)
        gmat = temps["gmat"][:o * m * length]
        gmat.reshape(o, m, *out_sizes)[...] = xp.moveaxis(g[start:stop], 1, 0)
        cols, gmat = cols.reshape(groups, kc, m * length), gmat.reshape(groups, og, m * length)
        if index == 0:
            xp.matmul(gmat, cols.transpose(0, 2, 1), out=result)
        else:
            result += xp.matmul(gmat, cols.transpose(0, 2, 1), out=temps["partial"])
    return target if out is None or target is out else _store(xp, target, out)


def conv_grad_scratch(which: str, types: Sequence[TensorType], stride: Sequence[int], pad: Sequence[int],
                      dilation: Sequence[int], groups: int) -> int:
    """Scratch bytes of conv_grad_input (types g, w, x_like) or conv_grad_weight (x, g, w_like)."""
    a, b, like = types
    geo = ConvGeometry(a.ndim - 2, stride, pad, dilation, groups)
    if which == "input":
        return layout_bytes(backward_input_layout(a.shape, b.shape, like.shape[2:], a.dtype.np, geo))
    return layout_bytes(backward_weight_layout(a.shape, b.shape, like.shape[2:], a.dtype.np, geo))


# --------------------------------------------------------------------------- type rules

_CONV_ATTRS = {"stride": Ints((1,)), "pad": Ints((0,)), "dilation": Ints((1,)), "groups": Int(1)}


def _check_operands(types: Sequence[TensorType], names: Sequence[str]) -> None:
    for t, name in zip(types, names):
        require_float(t, name)
    first = types[0].dtype
    for t, name in zip(types[1:], names[1:]):
        if t.dtype is not first:
            raise DTypeError(f"{name} has dtype {t.dtype}, but the input is {first}; cast one of them")
    x = types[0]
    if x.ndim < 2:
        raise ShapeError(f"input must be (N, C, spatial...), got rank {x.ndim}")
    if types[1].ndim != x.ndim:
        raise ShapeError(f"weight must have rank {x.ndim} (out, in/groups, kernel...) like the input, "
                         f"got rank {types[1].ndim}")


def _check_groups(channels: Dim, groups: int, what: str) -> None:
    if channels is not None and channels % groups:
        raise ShapeError(f"{what} ({channels}) is not divisible by groups={groups}")


def _check_bias(types: Sequence[TensorType], out_channels: Dim) -> None:
    if len(types) < 3:
        return
    b = types[2]
    if b.ndim != 1 or (b.shape[0] is not None and out_channels is not None and b.shape[0] != out_channels):
        raise ShapeError(f"bias must have shape ({out_channels},), got {b.shape}")


def _conv_infer(types, stride, pad, dilation, groups):
    _check_operands(types, ["conv input", "conv weight", "conv bias"])
    x, w = types[0], types[1]
    geo = ConvGeometry(x.ndim - 2, stride, pad, dilation, groups)
    c, o, cg = x.shape[1], w.shape[0], w.shape[1]
    _check_groups(c, groups, "input channels")
    _check_groups(o, groups, "output channels")
    if c is not None and cg is not None and c != cg * groups:
        raise ShapeError(f"weight {w.shape} expects {cg * groups} input channels (C_in/groups={cg}, "
                         f"groups={groups}), but the input has {c}")
    _check_bias(types, o)
    return TensorType((x.shape[0], o) + geo.out_sizes(x.shape[2:], w.shape[2:]), x.dtype)


def _transpose_out_size(n: Dim, k: Dim, s: int, d: int, pads: Tuple[int, int], extra: int) -> Dim:
    if n is None or k is None:
        return None
    size = (n - 1) * s + d * (k - 1) + 1 - pads[0] - pads[1] + extra
    if size < 1:
        raise ShapeError(f"output size {size} is not positive (input {n}, kernel {k}, stride {s}, pads {pads})")
    return size


def _conv_transpose_infer(types, stride, pad, dilation, groups, output_padding):
    _check_operands(types, ["conv_transpose input", "conv_transpose weight", "conv_transpose bias"])
    x, w = types[0], types[1]
    geo = ConvGeometry(x.ndim - 2, stride, pad, dilation, groups)
    extra = spatial_values(output_padding, geo.nsp, "output_padding", minimum=0)
    for e, s in zip(extra, geo.stride):
        if e >= s:
            raise ShapeError(f"output_padding {extra} must be smaller than the stride {geo.stride}")
    c, cw = x.shape[1], w.shape[0]
    _check_groups(c, groups, "input channels")
    if c is not None and cw is not None and c != cw:
        raise ShapeError(f"weight {w.shape} expects {cw} input channels (weight layout is "
                         f"(C_in, C_out/groups, k...)), but the input has {c}")
    o = None if w.shape[1] is None else w.shape[1] * groups
    _check_bias(types, o)
    sizes = tuple(_transpose_out_size(n, k, s, d, p, e) for n, k, s, d, p, e in
                  zip(x.shape[2:], w.shape[2:], geo.stride, geo.dilation, geo.pads, extra))
    return TensorType((x.shape[0], o) + sizes, x.dtype)


def _grad_input_infer(types, stride, pad, dilation, groups):
    """(g, w, x_like) -> x_like's shape; g must be what conv(x_like, w) produces."""
    g, w, x_like = types
    _check_operands(types[:2], ["gradient", "weight"])
    geo = ConvGeometry(g.ndim - 2, stride, pad, dilation, groups)
    _check_spatial(g.shape[2:], geo.out_sizes(x_like.shape[2:], w.shape[2:]), "gradient")
    return x_like.with_dtype(g.dtype)


def _grad_weight_infer(types, stride, pad, dilation, groups):
    """(x, g, w_like) -> w_like's shape; g must be what conv(x, w_like) produces."""
    x, g, w_like = types
    _check_operands(types[:2], ["input", "gradient"])
    geo = ConvGeometry(x.ndim - 2, stride, pad, dilation, groups)
    _check_spatial(g.shape[2:], geo.out_sizes(x.shape[2:], w_like.shape[2:]), "gradient")
    return w_like.with_dtype(x.dtype)


def _check_spatial(have: Sequence[Dim], want: Sequence[Dim], what: str) -> None:
    if any(a is not None and b is not None and a != b for a, b in zip(have, want)):
        raise ShapeError(f"{what} has spatial shape {tuple(have)}, but the convolution produces {tuple(want)}")


# --------------------------------------------------------------------------- ops

conv = defop("conv", num_inputs=(2, 3), pattern=OPAQUE, attrs=dict(_CONV_ATTRS), infer=_conv_infer,
             doc="N-d cross-correlation (Caffe Convolution): x (N, C, s...), w (O, C/groups, k...), optional b (O,).")


@conv.kernel
def _(xp, x, w, b=None, *, stride, pad, dilation, groups, out=None, scratch=None):
    return conv_forward(xp, x, w, b, ConvGeometry(x.ndim - 2, stride, pad, dilation, groups), out, scratch)


conv.scratch(conv_forward_scratch)


def _bias_grad(g, nsp: int):
    return red.sum(g, axis=(0,) + tuple(range(2, 2 + nsp)))


@conv.grad
def _(node, g):
    x, w = node.inputs[:2]
    attrs = dict(node.attrs)
    grads = [conv_grad_input(g, w, x, **attrs), conv_grad_weight(x, g, w, **attrs)]
    if len(node.inputs) == 3:
        grads.append(_bias_grad(g, x.ndim - 2))
    return grads


conv_grad_input = defop("conv_grad_input", num_inputs=3, pattern=OPAQUE, attrs=dict(_CONV_ATTRS),
                        infer=_grad_input_infer,
                        doc="Gradient of conv wrt its input: (g, w, x_like) -> dx of x_like's shape.")


@conv_grad_input.kernel
def _(xp, g, w, x_like, *, stride, pad, dilation, groups, out=None, scratch=None):
    geo = ConvGeometry(g.ndim - 2, stride, pad, dilation, groups)
    return conv_backward_input(xp, g, w, x_like.shape[2:], geo, out, scratch)


@conv_grad_input.scratch
def _(types, **attrs):
    return conv_grad_scratch("input", types, **attrs)


@conv_grad_input.grad
def _(node, gg):
    g, w, x_like = node.inputs
    attrs = dict(node.attrs)
    # <gg, B_x^T(g; w)> = <B(gg, w), g>: linear in g through conv, in w through conv_grad_weight
    return [conv(gg, w, **attrs), conv_grad_weight(gg, g, w, **attrs), None]


conv_grad_weight = defop("conv_grad_weight", num_inputs=3, pattern=OPAQUE, attrs=dict(_CONV_ATTRS),
                         infer=_grad_weight_infer,
                         doc="Gradient of conv wrt its weight: (x, g, w_like) -> dw of w_like's shape.")


@conv_grad_weight.kernel
def _(xp, x, g, w_like, *, stride, pad, dilation, groups, out=None, scratch=None):
    geo = ConvGeometry(x.ndim - 2, stride, pad, dilation, groups)
    return conv_backward_weight(xp, x, g, w_like.shape[2:], geo, out, scratch)


@conv_grad_weight.scratch
def _(types, **attrs):
    return conv_grad_scratch("weight", types, **attrs)


@conv_grad_weight.grad
def _(node, gg):
    x, g, w_like = node.inputs
    attrs = dict(node.attrs)
    # <gg, B_w^T(x; g)> = <B(x, gg), g>
    return [conv_grad_input(g, gg, x, **attrs), conv(x, gg, **attrs), None]


conv_transpose = defop("conv_transpose", num_inputs=(2, 3), pattern=OPAQUE,
                       attrs=dict(_CONV_ATTRS, output_padding=Ints((0,))), infer=_conv_transpose_infer,
                       doc="Transposed convolution (Caffe Deconvolution): x (N, C_in, s...), "
                           "w (C_in, C_out/groups, k...), optional b (C_out,).")


@conv_transpose.kernel
def _(xp, x, w, b=None, *, stride, pad, dilation, groups, output_padding, out=None):
    geo = ConvGeometry(x.ndim - 2, stride, pad, dilation, groups)
    extra = spatial_values(output_padding, geo.nsp, "output_padding", minimum=0)
    sizes = tuple(_transpose_out_size(n, k, s, d, p, e) for n, k, s, d, p, e in
                  zip(x.shape[2:], w.shape[2:], geo.stride, geo.dilation, geo.pads, extra))
    y = conv_backward_input(xp, x, w, sizes, geo, out)
    if b is not None:
        y += b.reshape(_bias_shape(geo.nsp, b.shape[0]))
    return y


@conv_transpose.grad
def _(node, g):
    x, w = node.inputs[:2]
    attrs = {k: v for k, v in node.attrs.items() if k != "output_padding"}
    # conv_transpose(x; w) = B_x^T(x; w) for the conv B that maps g's shape back to x's shape
    grads = [conv(g, w, **attrs), conv_grad_weight(g, x, w, **attrs)]
    if len(node.inputs) == 3:
        grads.append(_bias_grad(g, x.ndim - 2))
    return grads
