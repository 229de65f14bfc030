"""2-D convolution kernels in a batch-last layout, for small images in large batches.

The im2col kernels in conv.py work sample by sample: each strided copy (im2col) or strided add
(col2im) runs along one output row, OW elements at a time. With LeNet-sized images (OW = 8 to
24) NumPy spends most of its time starting those short inner loops. Here the input is first
copied once to (C, H, W, N): then a window offset is a view whose contiguous runs are OW·N
elements long (N with strides), every copy and add streams, and each GEMM covers the whole
batch: (O, C·kh·kw) x (C·kh·kw, rows·OW·N) forward; the weight gradient as its transpose,
columns times G laid out (rows·OW·N, O), so that BLAS reads neither operand transposed. The
output rows are processed in chunks so that the columns stay within COLUMN_BUDGET_BYTES.

conv.py sends 2-D convolutions here when ``batch_last_pays``; groups, stride, dilation and
padding are all handled.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ..conv_geometry import dims_product
from .native import native
from .scratch import take

#: columns kept per chunk of output rows (bytes): as conv.py's im2col, about what a core's L2
#: holds; measured 1.3-1.8x faster than 4 MiB chunks for LeNet's conv2
COLUMN_BUDGET_BYTES = 1 << 20


def batch_last_pays(x_shape: Sequence[int], out_sizes: Sequence[int], kind: str) -> bool:
    """Whether the batch-last kernels beat the per-sample ones for a 2-D convolution.

    ``kind`` is "forward", "input" (dx) or "weight" (dw). Measured on the project's machine at
    one BLAS thread (per-sample -> batch-last): dx and dw gain wherever output rows are at most 16
    long (LeNet conv2 dx 11.9 -> 6.7 ms, 7x7x512 dx 53 -> 40 ms, dw 53 -> 35 ms; 13x13 and 14x14
    5-10%); the forward gains at rows of 8 or less (LeNet conv2 6.4 -> 4.4 ms) and breaks even at
    16 in a batch of 64, but loses 2x on LeNet's 24-wide conv1.
    """
    if len(x_shape) != 4 or x_shape[0] < 4 or not out_sizes or out_sizes[-1] < 1:
        return False
    n, row = x_shape[0], out_sizes[-1]
    if kind in ("input", "weight"):
        return row <= 16
    return row <= 8 or (row <= 16 and n >= 32)


def _padded_batch_last(xp: Any, x: Any, pads: Sequence[Tuple[int, int]], into: Optional[Any] = None) -> Any:
    """x (N, C, H, W) as a zero-padded (C, H + pads, W + pads, N) array (written into ``into`` when
    given): one copy does both."""
    n, c, h, w = x.shape
    (top, bottom), (left, right) = pads
    if into is None:
        if not (top or bottom or left or right):
            return xp.ascontiguousarray(x.transpose(1, 2, 3, 0))
        into = xp.empty((c, h + top + bottom, w + left + right, n), dtype=x.dtype)
    # zero the border only: the interior is overwritten
    into[:, :top] = 0
    into[:, top + h:] = 0
    into[:, top:top + h, :left] = 0
    into[:, top:top + h, left + w:] = 0
    into[:, top:top + h, left:left + w, :] = x.transpose(1, 2, 3, 0)
    return into


#: store_nchw goes a channel at a time when one channel's block has at least this many elements
PER_CHANNEL_STORE_ELEMENTS = 4096


def store_nchw(xp: Any, out: Any, src: Any, bias: Optional[Any] = None) -> None:
    """out (N, C, H, W) = src (C, H, W, N) (+ bias (C,), added in the same pass).

    NumPy runs the one 4-D transposed copy with the batch axis innermost, each write C·H·W elements
    from the last; a channel at a time the writes stay within one channel's planes. Measured on the
    project's machine (C x H x W x N): 16 x 13 x 13 x 64 0.22 -> 0.13 ms, 32 x 11 x 11 x 64 0.35 ->
    0.22 ms, 64 x 14 x 14 x 64 4.1 -> 0.8 ms; but with small blocks the loop loses (128 x 7 x 7 x 32:
    0.20 -> 0.21-0.30 ms, 512 x 7 x 7 x 16: 0.47 -> 0.84 ms), hence PER_CHANNEL_STORE_ELEMENTS."""
    if src[0].size < PER_CHANNEL_STORE_ELEMENTS:
        if bias is None:
            out[...] = src.transpose(3, 0, 1, 2)
        else:
            xp.add(src.transpose(3, 0, 1, 2), bias.reshape(1, -1, 1, 1), out=out)
        return
    for c in range(src.shape[0]):
        if bias is None:
            out[:, c] = src[c].transpose(2, 0, 1)
        else:
            xp.add(src[c].transpose(2, 0, 1), bias[c], out=out[:, c])


def _row_chunks(rows: int, bytes_per_row: int) -> List[Tuple[int, int]]:
    size = max(1, COLUMN_BUDGET_BYTES // max(bytes_per_row, 1))
    return [(r, min(r + size, rows)) for r in range(0, rows, size)]


def _window(buf: Any, ki: int, kj: int, r0: int, r1: int, ow: int, geo: Any) -> Any:
    """The (C, r1 - r0, ow, N) view of ``buf`` that kernel offset (ki, kj) reads for output rows r0..r1."""
    (sh, sw), (dh, dw) = geo.stride, geo.dilation
    top = ki * dh + r0 * sh
    left = kj * dw
    return buf[:, top:top + (r1 - r0 - 1) * sh + 1:sh, left:left + (ow - 1) * sw + 1:sw, :]


def _columns(xp: Any, xt: Any, ksize: Tuple[int, int], r0: int, r1: int, ow: int, geo: Any,
             flat: Optional[Any] = None) -> Any:
    """im2col of output rows r0..r1 from the batch-last input: (C, kh, kw, rows, OW, N), in the
    front of ``flat`` (1-D) when given."""
    kh, kw = ksize
    shape = (xt.shape[0], kh, kw, r1 - r0, ow, xt.shape[-1])
    cols = xp.empty(shape, dtype=xt.dtype) if flat is None else flat[:dims_product(shape)].reshape(shape)
    for ki in range(kh):
        for kj in range(kw):
            cols[:, ki, kj] = _window(xt, ki, kj, r0, r1, ow, geo)
    return cols


def forward_layout(x_shape: Sequence[int], w_shape: Sequence[int], geo: Any, out_sizes: Sequence[int],
                   dtype: Any) -> list:
    """The temporaries of ``forward`` (cgvm.ops.kernels.scratch): the padded batch-last input, and the
    columns and products of the largest chunk of output rows."""
    n, c, h, wd = x_shape
    o, _, kh, kw = w_shape
    oh, ow = out_sizes
    (top, bottom), (left, right) = geo.pads
    r0, r1 = _row_chunks(oh, c * kh * kw * ow * n * np.dtype(dtype).itemsize)[0]
    return [("xt", (c, h + top + bottom, wd + left + right, n), dtype),
            ("cols", (c * kh * kw * (r1 - r0) * ow * n,), dtype), ("y", (o, oh, ow * n), dtype)]


def forward(xp: Any, x: Any, w: Any, b: Optional[Any], geo: Any, out_sizes: Sequence[int], out: Any,
            temps: Optional[dict] = None) -> Any:
    """y = conv(x, w) + b written into ``out`` (N, O, OH, OW); ``temps`` holds the arrays of
    forward_layout (allocated here when not given).

    Each chunk's product goes into its rows of one batch-last result, stored to NCHW with the bias
    in one pass at the end: per chunk, the bias add and the transposed store ran 2x slower (0.20
    against 0.09 ms of LeNet's conv2, 0.84 -> 0.73 ms in all)."""
    n, c = x.shape[:2]
    o, cg, kh, kw = w.shape
    groups, og = geo.groups, o // geo.groups
    oh, ow = out_sizes
    if temps is None:
        temps = take(xp, None, forward_layout(x.shape, w.shape, geo, out_sizes, x.dtype))
    xt = _padded_batch_last(xp, x, geo.pads, temps["xt"])
    kc = cg * kh * kw
    wmat = w.reshape(groups, og, kc)
    for r0, r1 in _row_chunks(oh, c * kh * kw * ow * n * x.dtype.itemsize):
        rows = r1 - r0
        cols = _columns(xp, xt, (kh, kw), r0, r1, ow, geo, temps["cols"]).reshape(groups, kc, rows * ow * n)
        xp.matmul(wmat, cols, out=temps["y"][:, r0:r1].reshape(groups, og, rows * ow * n))
    store_nchw(xp, out, temps["y"].reshape(o, oh, ow, n), b)
    return out


@native
def _col2im_rows(cols, acc, r0, sh, sw, dh, dw):
    """acc (groups, C/g, Hp, Wp, N) += the columns (groups, kh, kw, C/g, rows, OW, N) of output rows
    r0.. at their windows: the strided adds of backward_input's NumPy loop as one pass, each
    destination row added to while it is in cache (LeNet's conv2 input gradient 0.87 -> 0.67 ms)."""
    groups, kh, kw, cg, rows, ow, n_ = cols.shape
    # each destination element gets its terms in the NumPy loop's order (kernel offset by offset),
    # so the two forms agree to the bit; a channel's accumulator stays in cache meanwhile
    for gi in range(groups):
        for c in range(cg):
            for ki in range(kh):
                for r in range(rows):
                    h = (r0 + r) * sh + ki * dh
                    for kj in range(kw):
                        for j in range(ow):
                            dst = acc[gi, c, h, j * sw + kj * dw]
                            src = cols[gi, ki, kj, c, r, j]
                            for m in range(n_):
                                dst[m] += src[m]


def backward_input(xp: Any, g: Any, w: Any, in_sizes: Sequence[int], geo: Any, out: Any) -> Any:
    """dx (N, C, H, W) into ``out``: per chunk of output rows, Wᵀ G then strided adds (col2im,
    compiled when it may be: cgvm.ops.kernels.native)."""
    n, o, oh, ow = g.shape
    _, cg, kh, kw = w.shape
    groups, og = geo.groups, o // geo.groups
    h, wd = in_sizes
    (top, bottom), (left, right) = geo.pads
    c = cg * groups
    acc = xp.zeros((c, h + top + bottom, wd + left + right, n), dtype=g.dtype)
    gt = xp.ascontiguousarray(g.transpose(1, 2, 3, 0)).reshape(groups, og, oh, ow * n)
    # (groups, kh·kw·C/g, O/g): rows ordered by kernel offset so each offset's block is contiguous
    wt = w.reshape(groups, og, cg, kh * kw).transpose(0, 3, 2, 1).reshape(groups, kh * kw * cg, og)
    grouped = acc.reshape(groups, cg, acc.shape[1], acc.shape[2], n)
    for r0, r1 in _row_chunks(oh, kh * kw * cg * groups * ow * n * g.dtype.itemsize):
        rows = r1 - r0
        gmat = gt[:, :, r0:r1].reshape(groups, og, rows * ow * n)
        cols = xp.matmul(wt, gmat).reshape(groups, kh * kw, cg, rows, ow, n)
        if _col2im_rows.run(xp, cols.reshape(groups, kh, kw, cg, rows, ow, n), grouped, r0, *geo.stride,
                            *geo.dilation):
            continue
        for ki in range(kh):
            for kj in range(kw):
                for gi in range(groups):
                    view = _window(grouped[gi], ki, kj, r0, r1, ow, geo)
                    view += cols[gi, ki * kw + kj]
    store_nchw(xp, out, acc[:, top:top + h, left:left + wd, :])
    return out


def backward_weight(xp: Any, x: Any, g: Any, ksize: Sequence[int], geo: Any, out: Any) -> Any:
    """dw (O, C/g, kh, kw) into ``out``: per group, dwᵀ = columns of x (C/g·kh·kw, rows·OW·N) times
    G laid out (rows·OW·N, O/g), summed over row chunks.

    That orientation, both operands as BLAS reads them untransposed, ran 1.4-2x faster in OpenBLAS
    than dw = G · columnsᵀ (LeNet's conv2, 32 x 144 over 7744 positions: 0.74-0.98 against 1.4-1.8 ms)."""
    n, c = x.shape[:2]
    _, o, oh, ow = g.shape
    kh, kw = ksize
    groups, og = geo.groups, o // geo.groups
    cg = c // groups
    kc = cg * kh * kw
    xt = _padded_batch_last(xp, x, geo.pads)
    gt = xp.ascontiguousarray(g.transpose(2, 3, 0, 1)).reshape(oh, ow * n, groups, og)
    acc = xp.empty((groups, kc, og), dtype=out.dtype)
    part = xp.empty((kc, og), dtype=out.dtype)
    for index, (r0, r1) in enumerate(_row_chunks(oh, c * kh * kw * ow * n * x.dtype.itemsize)):
        rows = r1 - r0
        cols = _columns(xp, xt, (kh, kw), r0, r1, ow, geo).reshape(groups, kc, rows * ow * n)
        gmat = gt[r0:r1].reshape(rows * ow * n, groups, og)
        for gi in range(groups):
            if index == 0:
                xp.matmul(cols[gi], gmat[:, gi], out=acc[gi])
            else:
                acc[gi] += xp.matmul(cols[gi], gmat[:, gi], out=part)
    out.reshape(groups, og, kc)[...] = acc.transpose(0, 2, 1)
    return out
