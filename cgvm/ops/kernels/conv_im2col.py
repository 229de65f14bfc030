"""Convolution kernels over any array module: the choice of method and the im2col kernels.

Forward: ``forward_methods`` lists what can compute a convolution, fastest first (Winograd for
3x3 stride-1 layers where it pays, then batch-last for small images, a GEMM per sample for 1x1,
else im2col); ``conv_forward`` runs the first whose temporaries fit in the scratch block it is
given (cgvm.ops.kernels.scratch). im2col copies the windows of a chunk of samples (zero-padded one chunk
at a time) into a contiguous (chunk, groups, C/g·Πk, L) block, then GEMMs over (samples,
groups); a sample whose columns alone exceed the budget goes a band of output rows at a time
(ResNet's 7x7 stem on 224x224 images: 7.4 MB of columns a sample, 1.5 MiB of scratch in bands,
at the same speed within the machine's noise). col2im (the input gradient, and the transposed
convolution) is a loop over kernel offsets adding strided slices, no scatter. The weight
gradient multiplies a chunk's gradient rows by its columns, as one product or, for a small dw
over many positions, one per sample (per_sample_weight_products). Each kernel's temporaries are
a Layout, so the ops declare them as scratch and the memory plan holds them.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ...backend import cudnn
from ...ir.types import TensorType
from . import conv_batchlast as batch_last
from . import conv_winograd as winograd
from ..conv_geometry import ConvGeometry, bias_shape, crop_padding, dims_product, is_pointwise, store, windows
from .scratch import Layout, layout_bytes, take


def on_device(xp: Any) -> bool:
    """Whether ``xp`` is a device array module (CuPy): the kernels then take the device's methods
    (module doc), else the CPU's cache-sized ones."""
    return getattr(xp, "__name__", "numpy") != "numpy"


def _grouped_matmul(xp: Any, a: Any, b: Any, out: Optional[Any] = None) -> Any:
    """a (G, M, K) @ b (N, G, K, L) -> (N, G, M, L), one GEMM per (sample, group).

    NumPy's matmul sends an operand broadcast along the batch (stride 0) through its non-BLAS
    loop, 20-50x slower than GEMM; a loop of GEMMs needs no broadcast copy of the weights. On a
    device the broadcast product is one batched GEMM (cuBLAS), where a loop would launch N·G.
    """
    if out is None:
        out = xp.empty((b.shape[0], a.shape[0], a.shape[1], b.shape[3]), dtype=xp.result_type(a, b))
    if on_device(xp):
        return xp.matmul(a, b, out=out)
    for i in range(b.shape[0]):
        for j in range(a.shape[0]):
            xp.matmul(a[j], b[i, j], out=out[i, j])
    return out


#: a bias rides in the im2col GEMM (a row of ones, and a copy of the weights with a bias column)
#: when the columns have fewer rows than this; else it is added to each chunk's output. The conv2d
#: benchmark row (3 -> 32 channels, 27 rows) ran 20% faster with it (2.2 against 2.8 ms, one run).
BIAS_ROW_BELOW = 128

# im2col columns are built for a chunk of samples at a time, about this many bytes: the block stays
# in a core's L2 cache, and a small buffer reused across chunks avoids the page faults that a
# fresh batch-sized buffer costs on every call (they dominated the run time when measured).
COLUMN_BUDGET_BYTES = 1 << 20
#: on a device there is no cache to fit and each launch costs microseconds: columns of many samples
#: at once, from the memory pool (the plan's CPU-sized scratch is then too small and not used); 64 MiB
#: keeps ResNet-50's largest columns to a few chunks a batch without raising the memory peak much
DEVICE_COLUMN_BUDGET_BYTES = 64 << 20


def _budget(device: bool) -> int:
    return DEVICE_COLUMN_BUDGET_BYTES if device else COLUMN_BUDGET_BYTES


def sample_chunks(n: int, bytes_per_sample: int, device: bool = False) -> List[Tuple[int, int]]:
    """[start, stop) ranges over the batch, each holding about COLUMN_BUDGET_BYTES of columns
    (DEVICE_COLUMN_BUDGET_BYTES on a device)."""
    size = max(1, _budget(device) // max(bytes_per_sample, 1))
    return [(i, min(i + size, n)) for i in range(0, n, size)]


def _band_rows(out_sizes: Sequence[int], per_sample_bytes: int, device: bool = False) -> int:
    """Output rows (along the first spatial axis) whose im2col columns are built and multiplied at
    a time: all of a sample's, unless its columns exceed COLUMN_BUDGET_BYTES (ResNet's 7x7 stem on
    224x224 images: 7.4 MB a sample), then a band of rows whose columns stay in cache."""
    budget = _budget(device)
    if not out_sizes or per_sample_bytes <= budget:
        return out_sizes[0] if out_sizes else 1
    per_row = per_sample_bytes // out_sizes[0]
    return max(1, min(out_sizes[0], budget // max(per_row, 1)))


def _chunk_windows(xp: Any, x: Any, padded: Optional[Any], ksize: Sequence[int], out_sizes: Sequence[int],
                   geo: ConvGeometry, elements_per_sample: int, device: bool = False):
    """``(start, stop, windows)`` for each chunk of samples (sample_chunks of that many column
    elements per sample): the strided window view of the chunk, copied first into the interior of
    ``padded`` (a chunk-sized buffer whose borders are zeroed once) when the convolution pads."""
    if padded is not None:
        padded[...] = 0
        interior = crop_padding(padded, geo.pads, x.shape[2:])
    for start, stop in sample_chunks(x.shape[0], elements_per_sample * x.dtype.itemsize, device):
        source = x[start:stop]
        if padded is not None:
            interior[:stop - start] = source
            source = padded[:stop - start]
        yield start, stop, windows(xp, source, ksize, out_sizes, geo)


def forward_methods(x_shape: Sequence[int], w_shape: Sequence[int], dtype: Any, geo: ConvGeometry,
                    device: bool = False) -> List[Tuple[str, int]]:
    """The methods conv_forward can use for this convolution, fastest first: ("winograd", tile side)
    for 3x3 stride-1 2-D convolutions in float32/64 with one group where conv_winograd.choose_tile
    says it pays, then one of ("batch_last" | "pointwise" | "im2col", 0). On a device (without
    cuDNN): pointwise or im2col only, whose batched GEMMs suit it (the others' choices are the CPU's)."""
    ksize = tuple(w_shape[2:])
    out_sizes = geo.out_sizes(x_shape[2:], ksize)
    dtype = np.dtype(dtype)
    if device:
        return [("pointwise", 0)] if is_pointwise(ksize, geo) else [("im2col", 0)]
    methods: List[Tuple[str, int]] = []
    if (geo.nsp == 2 and ksize == (3, 3) and geo.groups == 1 and geo.stride == (1, 1) and geo.dilation == (1, 1)
            and dtype.kind == "f" and dtype.itemsize in (4, 8)):
        tile = winograd.choose_tile(x_shape[0], x_shape[1], w_shape[0], out_sizes[0], out_sizes[1], dtype.itemsize)
        if tile:
            methods.append(("winograd", tile))
    if is_pointwise(ksize, geo):
        methods.append(("pointwise", 0))
    elif batch_last.batch_last_pays(x_shape, out_sizes, "forward"):
        methods.append(("batch_last", 0))
    else:
        methods.append(("im2col", 0))
    return methods


def forward_layout(x_shape: Sequence[int], w_shape: Sequence[int], has_bias: bool, dtype: Any,
                   geo: ConvGeometry, method: Tuple[str, int], device: bool = False) -> Layout:
    """The temporaries conv_forward takes (cgvm.ops.kernels.scratch) for these operands by ``method``."""
    kind, tile = method
    out_sizes = geo.out_sizes(x_shape[2:], w_shape[2:])
    if kind == "winograd":
        return winograd.scratch_layout(x_shape, w_shape[0], geo.pads, tile, dtype)
    if kind == "batch_last":
        return batch_last.forward_layout(x_shape, w_shape, geo, out_sizes, dtype)
    if kind == "pointwise":
        return []
    # im2col: the columns and the padded input of one chunk of samples (and, with a bias riding in
    # the GEMM, the bias-augmented weights)
    n, c = x_shape[:2]
    o, cg = w_shape[:2]
    g = geo.groups
    length = dims_product(out_sizes)
    rows = cg * dims_product(w_shape[2:])
    bias_row = has_bias and rows < BIAS_ROW_BELOW
    rows += bias_row
    per_sample = g * rows * length * np.dtype(dtype).itemsize
    chunk = sample_chunks(n, per_sample, device)[0][1]
    span = _band_rows(out_sizes, per_sample, device) * dims_product(out_sizes[1:])   # columns per GEMM
    layout: Layout = [("cols", (chunk, g, rows, span), dtype)]
    if any(b or e for b, e in geo.pads):
        layout.append(("padded", (chunk, c) + tuple(s + b + e for s, (b, e) in zip(x_shape[2:], geo.pads)), dtype))
    if bias_row:
        layout.append(("wmat", (g, o // g, rows), dtype))
    return layout


def conv_forward(xp: Any, x: Any, w: Any, b: Optional[Any], geo: ConvGeometry, out: Optional[Any] = None,
                 scratch: Optional[Any] = None) -> Any:
    """y = conv(x, w) + b. Runs the first of forward_methods whose temporaries fit in ``scratch``
    (a planned uint8 block, see cgvm.ops.kernels.scratch), or the first, allocating, without one.

    im2col copies the windows of a chunk of samples (zero-padded one chunk at a time) into
    columns, then GEMMs over (samples, groups) and adds the bias to the chunk's output while it
    is in cache (a row of ones in the columns would need a bias-augmented copy of the weights)."""
    n = x.shape[0]
    o, cg = w.shape[:2]
    ksize = tuple(w.shape[2:])
    g = geo.groups
    og = o // g
    out_sizes = geo.out_sizes(x.shape[2:], ksize)
    if cudnn.choose(xp, x.dtype, geo.nsp, geo.pads).path == "cudnn":
        return cudnn.forward(xp, x, w, b, (n, o) + out_sizes, geo.nsp, geo.pads, geo.stride, geo.dilation, g, out)
    length = dims_product(out_sizes)
    target = out if out is not None and out.flags.c_contiguous else xp.empty((n, o) + out_sizes, dtype=x.dtype)
    device = on_device(xp)
    methods = forward_methods(x.shape, w.shape, x.dtype, geo, device)
    layouts = [forward_layout(x.shape, w.shape, b is not None, x.dtype, geo, m, device) for m in methods]
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
            target += b.reshape(bias_shape(geo.nsp, o))
    else:
        cols, padded = temps["cols"], temps.get("padded")
        kc = cg * dims_product(ksize)
        rows = cols.shape[2]
        inner = dims_product(out_sizes[1:])
        band = cols.shape[3] // inner     # output rows per GEMM (fewer than all: see _band_rows)
        if "wmat" in temps:
            # few rows: the bias rides in the GEMM as a row of ones in the columns (for ~1/kc more
            # work), where a pass over the output would cost about as much as the GEMM
            wb = temps["wmat"]
            wb[:, :, :kc] = wmat
            wb[:, :, kc] = b.reshape(g, og)
            wmat, b = wb, None
        flat = cols.reshape(-1)
        for start, stop, view in _chunk_windows(xp, x, padded, ksize, out_sizes, geo, g * rows * length, device):
            m = stop - start
            for r0 in range(0, out_sizes[0], band):
                r1 = min(out_sizes[0], r0 + band)
                span = (r1 - r0) * inner
                part = flat[:m * g * rows * span].reshape(m, g, rows, span)
                if rows > kc:
                    part[:, :, kc:] = 1
                part[:, :, :kc].reshape((m, g, cg) + ksize + (r1 - r0,) + out_sizes[1:])[...] = \
                    view[(slice(None),) * (2 + geo.nsp) + (slice(r0, r1),)].reshape(
                        (m, g, cg) + ksize + (r1 - r0,) + out_sizes[1:])
                result = results[start:stop, :, :, r0 * inner:r1 * inner]
                _grouped_matmul(xp, wmat, part, out=result)
                if b is not None:    # while the chunk's output is in cache
                    result += b.reshape(1, g, og, 1)
    return target if out is None or target is out else store(xp, target, out)


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
                          geo: ConvGeometry, device: bool = False) -> Layout:
    """The temporaries of conv_backward_input's im2col path (none for the others): the columns and
    the padded accumulator of one chunk of samples."""
    n, o = g_shape[:2]
    cg, ksize, out_sizes = w_shape[1], tuple(w_shape[2:]), tuple(g_shape[2:])
    if ((not device and batch_last.batch_last_pays((n, cg * geo.groups) + tuple(in_sizes), out_sizes, "input"))
            or (is_pointwise(ksize, geo) and tuple(in_sizes) == out_sizes)):
        return []
    rows = geo.groups * dims_product(ksize) * cg
    chunk = sample_chunks(n, rows * dims_product(out_sizes) * np.dtype(dtype).itemsize, device)[0][1]
    layout: Layout = [("cols", (chunk * rows * dims_product(out_sizes),), dtype)]
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
    if cudnn.choose(xp, g.dtype, geo.nsp, geo.pads).path == "cudnn":
        return cudnn.backward_data(xp, g, w, shape, geo.nsp, geo.pads, geo.stride, geo.dilation, geo.groups, out)
    target = out if out is not None and out.flags.c_contiguous else xp.empty(shape, dtype=g.dtype)
    out_sizes = tuple(g.shape[2:])
    cg = w.shape[1]
    ksize = tuple(w.shape[2:])
    groups = geo.groups
    og = o // groups
    length = dims_product(out_sizes)
    device = on_device(xp)
    if not device and batch_last.batch_last_pays(shape, out_sizes, "input"):
        batch_last.backward_input(xp, g, w, in_sizes, geo, target)
    elif is_pointwise(ksize, geo) and in_sizes == out_sizes:
        gmat = xp.ascontiguousarray(g).reshape(n, groups, og, length)
        xp.matmul(w.reshape(groups, og, cg).transpose(0, 2, 1), gmat, out=target.reshape(n, groups, cg, length))
    else:
        temps = take(xp, scratch, backward_input_layout(g.shape, w.shape, in_sizes, g.dtype, geo, device))
        gmat = xp.ascontiguousarray(g).reshape(n, groups, og, length)
        kcount = dims_product(ksize)
        # columns ordered (sample, group, kernel offset, C/g, L): each offset's block is contiguous for col2im
        wmat_t = w.reshape(groups, og, cg, kcount).transpose(0, 3, 2, 1).reshape(groups, kcount * cg, og)
        offsets = geo.offset_slices(ksize, out_sizes)
        padded = _has_padding(geo)
        for start, stop in sample_chunks(n, groups * kcount * cg * length * g.dtype.itemsize, device):
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
    return target if out is None or target is out else store(xp, target, out)


def per_sample_weight_products(og: int, kc: int, length: int) -> bool:
    """Whether dw's products go one per sample, summed after, rather than one per chunk of samples.

    When dw is small and a chunk's inner dimension long, OpenBLAS runs the one product several
    times slower than the same work as per-sample products (its small-matrix path). Measured on
    the project's machine at one and two threads: LeNet's conv1 (20 x 25 outputs, 576 positions
    a sample) 0.31 -> 0.14 ms a chunk; a 16 x 9 dw over 196-676 positions 0.33-0.41x; 32 x 27
    over 1024 positions 0.57x. Per sample, larger dw ran slower (48 x 48: 1.05x, 32 x 144:
    1.07-1.23x, 512 x 4608: 1.55x), and so did few positions a sample (16 x 9 over 49: 1.5x)."""
    return og * kc <= 1024 and length >= 128


def backward_weight_layout(x_shape: Sequence[int], g_shape: Sequence[int], ksize: Sequence[int], dtype: Any,
                           geo: ConvGeometry, device: bool = False) -> Layout:
    """The temporaries of conv_backward_weight's im2col path (none for batch-last): the padded
    input and columns of one chunk of samples, then either the chunk's gradient rows and a
    partial product or, with per_sample_weight_products, a partial product per sample."""
    out_sizes = tuple(g_shape[2:])
    if not device and batch_last.batch_last_pays(x_shape, out_sizes, "weight"):
        return []
    n, c = x_shape[:2]
    o = g_shape[1]
    og = o // geo.groups
    length, kc = dims_product(out_sizes), (c // geo.groups) * dims_product(ksize)
    chunk = sample_chunks(n, c * dims_product(ksize) * length * np.dtype(dtype).itemsize, device)[0][1]
    layout: Layout = [("cols", (geo.groups * kc * chunk * length,), dtype)]
    if per_sample_weight_products(og, kc, length):
        layout.append(("partial", (chunk, geo.groups, og, kc), dtype))
    else:
        layout += [("gmat", (o * chunk * length,), dtype), ("partial", (geo.groups, og, kc), dtype)]
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
    if cudnn.choose(xp, x.dtype, geo.nsp, geo.pads).path == "cudnn":
        return cudnn.backward_filter(xp, x, g, (o, c // groups) + ksize, geo.nsp, geo.pads, geo.stride,
                                     geo.dilation, groups, out)
    target = out if out is not None and out.flags.c_contiguous else \
        xp.empty((o, c // groups) + ksize, dtype=x.dtype)
    device = on_device(xp)
    if not device and batch_last.batch_last_pays(x.shape, g.shape[2:], "weight"):
        batch_last.backward_weight(xp, x, g, ksize, geo, target)
        return target if out is None or target is out else store(xp, target, out)
    temps = take(xp, scratch, backward_weight_layout(x.shape, g.shape, ksize, x.dtype, geo, device))
    out_sizes = tuple(g.shape[2:])
    nsp = geo.nsp
    length = dims_product(out_sizes)
    kc = (c // groups) * dims_product(ksize)
    # (C, k..., m, out...) so that each group's columns are one contiguous (C/g·Πk, m·L) matrix
    order = (1,) + tuple(range(2, 2 + nsp)) + (0,) + tuple(range(2 + nsp, 2 + 2 * nsp))
    result = target.reshape(groups, og, kc)
    chunks = _chunk_windows(xp, x, temps.get("padded"), ksize, out_sizes, geo, c * dims_product(ksize) * length,
                            device)
    if per_sample_weight_products(og, kc, length):
        # columns in the forward's order (sample, group, C/g·Πk, L): g's rows need no copy
        grows = g.reshape(n, groups, og, length)
        for index, (start, stop, view) in enumerate(chunks):
            m = stop - start
            cols = temps["cols"][:m * groups * kc * length]
            cols.reshape((m, c) + ksize + out_sizes)[...] = view
            cols = cols.reshape(m, groups, kc, length)
            partial = xp.matmul(grows[start:stop], cols.transpose(0, 1, 3, 2), out=temps["partial"][:m])
            if index == 0:
                xp.sum(partial, axis=0, out=result)
            else:
                result += partial.sum(axis=0)
        return target if out is None or target is out else store(xp, target, out)
    for index, (start, stop, view) in enumerate(chunks):
        m = stop - start
        cols = temps["cols"][:groups * kc * m * length]
        cols.reshape((c,) + ksize + (m,) + out_sizes)[...] = view.transpose(order)
        gmat = temps["gmat"][:o * m * length]
        gmat.reshape(o, m, *out_sizes)[...] = xp.moveaxis(g[start:stop], 1, 0)
        cols, gmat = cols.reshape(groups, kc, m * length), gmat.reshape(groups, og, m * length)
        if index == 0:
            xp.matmul(gmat, cols.transpose(0, 2, 1), out=result)
        else:
            result += xp.matmul(gmat, cols.transpose(0, 2, 1), out=temps["partial"])
    return target if out is None or target is out else store(xp, target, out)


def conv_grad_scratch(which: str, types: Sequence[TensorType], stride: Sequence[int], pad: Sequence[int],
                      dilation: Sequence[int], groups: int) -> int:
    """Scratch bytes of conv_grad_input (types g, w, x_like) or conv_grad_weight (x, g, w_like)."""
    a, b, like = types
    geo = ConvGeometry(a.ndim - 2, stride, pad, dilation, groups)
    if which == "input":
        return layout_bytes(backward_input_layout(a.shape, b.shape, like.shape[2:], a.dtype.np, geo))
    return layout_bytes(backward_weight_layout(a.shape, b.shape, like.shape[2:], a.dtype.np, geo))
