"""Winograd minimal filtering F(m x m, 3 x 3) for stride-1, dilation-1, one-group 2-D convolutions (NCHW).

Each m x m output tile is ``A^T [(G g G^T) * (B^T d B)] A`` for the (m+2) x (m+2) input tile d that
covers it and a 3 x 3 filter g: per (output channel, input channel) pair it multiplies (m+2)^2
numbers instead of 9 m^2, i.e. 2.25x fewer for m = 2 and 4x fewer for m = 4. The products are
summed over input channels first, so the work becomes a^2 GEMMs ``M[ab] (O, T) = U[ab] (O, C) @
V[ab] (C, T)`` over the T tiles (a = m + 2), plus the transforms.

The transforms are GEMMs too, over the array module ``xp`` (NumPy or CuPy): in NumPy a small GEMM
on cache-resident operands cost less per output (0.2-0.25 ns) than one ufunc pass (0.35-0.6 ns),
and it runs on the BLAS pool.

* weights: U (a^2, O, C) = kron(G, G) (a^2, 9) @ w (9, O*C), once per call;
* input, per chunk of samples: an NHWC copy with the columns split by phase (column mod m), so that
  every tile's a rows of one column tap are a contiguous slab; the row transform is one small GEMM
  per (sample, tile row, column tap), the column transform one GEMM per row tap, giving V (a^2, T, C);
* output: the pass over tile rows is one GEMM per column tap, the pass over tile columns a GEMM
  with the transposed operand so that the m output columns of a tile land next to each other, and
  one copy per output row phase writes whole rows into the NCHW output.

The batch is processed in bands of tile rows (and chunks of samples) sized by BAND_BUDGET_BYTES,
so the transforms run on cache-resident operands (3-4x faster per output than from memory).
Scratch memory per call (``scratch_layout``, planned by conv's scratch rule): U (2.25x or 4x the
weights: 16 MiB for 512x512 channels at m = 2), the padded input of one chunk of samples and two
band buffers of about BAND_BUDGET_BYTES in all.
Ragged edges (output size not a multiple of m) are computed on zero padding and cropped.

The transform matrices come from interpolation points (Cook-Toom, as in Lavin and Gray's
construction) and are checked against a direct convolution in the tests. For m = 4 the points 0,
1, -1, 2, -1/2 (and infinity) were measured to give float32 errors of about 3e-6 of the output's
largest value (2e-6 RMS) at 64-512 input channels, 2-3x less than 0, +-1, +-2 or 0, +-1, +-1/2;
m = 2 (points 0, +-1) stays near float32 rounding (3e-7 to 7e-7).
"""
from __future__ import annotations

import functools
from fractions import Fraction
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from .scratch import take

#: interpolation points (infinity is implied) for each supported output tile size
TILE_POINTS = {
    2: (Fraction(0), Fraction(1), Fraction(-1)),
    4: (Fraction(0), Fraction(1), Fraction(-1), Fraction(2), Fraction(-1, 2)),
}

#: bytes of the two band buffers (input tiles, then the products and the output stages in the
#: same memory): bands of 1-12 MiB ran within noise of each other, 64 MiB 1.4x slower at 64
#: channels (the transforms then stream from memory)
BAND_BUDGET_BYTES = 4 << 20
#: but a band holds at least this many tiles, so that the channel GEMMs are not too skinny
MIN_BAND_TILES = 128

KERNEL = 3

# Which convolutions go here (conv.conv_forward asks ``choose_tile``). Measured on the project's
# 2-core machine, one BLAS thread, against the im2col kernel, batch 16 unless noted: F(4x4) took
# 0.55-0.75x the time for ResNet-18's 3x3 layers at 64-256 channels (56x56 to 14x14), F(2x2) 0.7x
# at 512 channels 7x7; F(4x4) 0.7x at 32 channels 56x56, 0.55-0.7x for 32-64 input channels and
# 16 output channels, 0.7x for one 64-channel 56x56 sample. With 16 input channels it ranged from
# 0.75x to 1.3x (the input transform weighs more), with 3 input channels it took 3.5x. It lost by
# up to 1.15x when only 16 tiles of 4x4 share the weights it transforms (256 channels at 4x4, one
# 256-channel 14x14 sample), and won from 32 tiles on (8 samples at 7x7, 2 at 14x14).
#: input channels at least this
MIN_IN_CHANNELS = 32
#: output channels at least this
MIN_OUT_CHANNELS = 16
#: and at least this many 4x4 output tiles in the batch
MIN_TILES = 32
#: the weight transform took as long as the channel GEMMs of about this many tiles while the
#: transformed weights fit in WEIGHT_CACHE_BYTES (128-256 channels), and twice as many beyond
#: (512 channels): with these, ``choose_tile`` picked the faster of F(2x2) and F(4x4) in all 8
#: measured cases (128-512 channels, 6x6 to 14x14, batch 4-32)
WEIGHT_TRANSFORM_TILES = 50
WEIGHT_CACHE_BYTES = 16 << 20


def _poly_mul(p: Sequence[Fraction], q: Sequence[Fraction]) -> list:
    out = [Fraction(0)] * (len(p) + len(q) - 1)
    for i, a in enumerate(p):
        for j, b in enumerate(q):
            out[i + j] += a * b
    return out


@functools.lru_cache(maxsize=None)
def winograd_matrices(tile: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(A^T (m, a), G (a, 3), B^T (a, a)) in float64 for F(m, 3), built exactly from TILE_POINTS[m].

    With finite points p_j and the point at infinity last: A^T[i, j] = p_j^i (the infinity column
    selects the top coefficient); G[j] = (1, p_j, p_j^2) / prod_{l != j} (p_j - p_l); row j of B^T
    holds the coefficients of prod_{l != j} (x - p_l), and its last row those of prod_l (x - p_l).
    Then y = A^T [(G g) * (B^T d)] is the correlation y_i = sum_k g_k d_{i+k}.
    """
    points = TILE_POINTS[tile]
    alpha = tile + KERNEL - 1
    finite = len(points)
    at = [[Fraction(0)] * alpha for _ in range(tile)]
    g = [[Fraction(0)] * KERNEL for _ in range(alpha)]
    bt = [[Fraction(0)] * alpha for _ in range(alpha)]
    for j, p in enumerate(points):
        for i in range(tile):
            at[i][j] = p ** i
        others = [q for q in points if q != p]
        scale = Fraction(1)
        poly = [Fraction(1)]
        for q in others:
            scale *= p - q
            poly = _poly_mul(poly, [-q, Fraction(1)])
        for k in range(KERNEL):
            g[j][k] = p ** k / scale
        # d's coefficient on x^k in the residue at p_j (Chinese remainder step of Toom-Cook)
        for k, c in enumerate(poly):
            bt[j][k] = c
    at[tile - 1][finite] = Fraction(1)
    g[finite][KERNEL - 1] = Fraction(1)
    full = [Fraction(1)]
    for q in points:
        full = _poly_mul(full, [-q, Fraction(1)])
    for k, c in enumerate(full):
        bt[finite][k] = c
    return tuple(np.array([[float(v) for v in row] for row in m]) for m in (at, g, bt))


def choose_tile(n: int, in_channels: int, out_channels: int, out_h: int, out_w: int,
                itemsize: int = 4) -> Optional[int]:
    """The output tile side (2 or 4) for a 3x3 stride-1 convolution of this size, or None for im2col.

    Winograd when there are at least MIN_IN_CHANNELS input and MIN_OUT_CHANNELS output channels
    and the batch has at least MIN_TILES 4x4 tiles; then the side m with the least estimated work,
    the channel GEMMs' (m+2)^2 x (tiles + the weight transform's cost in tiles, see
    WEIGHT_TRANSFORM_TILES).
    """
    if (in_channels < MIN_IN_CHANNELS or out_channels < MIN_OUT_CHANNELS
            or n * -(-out_h // 4) * -(-out_w // 4) < MIN_TILES):
        return None

    def work(tile: int) -> int:
        positions = tile_alpha(tile) ** 2
        weights = WEIGHT_TRANSFORM_TILES
        if positions * in_channels * out_channels * itemsize > WEIGHT_CACHE_BYTES:
            weights *= 2
        return positions * (n * -(-out_h // tile) * -(-out_w // tile) + weights)
    return min((4, 2), key=work)


def tile_alpha(tile: int) -> int:
    """Input tile side a = m + 2 for output tiles of side m."""
    return tile + KERNEL - 1


def transform_weights(xp: Any, w: Any, tile: int, out: Optional[Any] = None) -> Any:
    """U (a^2, O, C): G g G^T for every (output, input) channel pair of w (O, C, 3, 3), as one GEMM
    (written into ``out`` when given).

    One GEMM with all a^2 rows: splitting it (to hold less of U at a time) re-reads w per piece
    and was measured 1.4-2.3x slower at 512 channels.
    """
    _, g, _ = winograd_matrices(tile)
    o, c = w.shape[:2]
    kron = xp.asarray(np.kron(g, g), dtype=w.dtype)      # (a^2, 9): U_ab = sum_ij G_ai G_bj g_ij
    flat = None if out is None else out.reshape(-1, o * c)
    return xp.matmul(kron, w.reshape(o * c, KERNEL * KERNEL).T, out=flat).reshape(-1, o, c)


def _ones_column(at: np.ndarray) -> int:
    """The transform position whose output coefficients are all 1 (the point 1): a bias added there
    reaches every output of the tile."""
    for j in range(at.shape[1]):
        if np.all(at[:, j] == 1):
            return j
    raise ValueError("the interpolation points must include 1")


class _Plan:
    """Sizes of one call: tiles, phase-split input layout, chunk of samples and band of tile rows."""

    def __init__(self, x_shape: Sequence[int], out_channels: int, pads: Tuple[Tuple[int, int], Tuple[int, int]],
                 tile: int, itemsize: int):
        n, c, h, w = x_shape
        self.tile, self.alpha = tile, tile_alpha(tile)
        self.out_h = h + pads[0][0] + pads[0][1] - KERNEL + 1
        self.out_w = w + pads[1][0] + pads[1][1] - KERNEL + 1
        self.tiles_h = -(-self.out_h // tile)
        self.tiles_w = -(-self.out_w // tile)
        self.rows = self.tiles_h * tile + KERNEL - 1                    # padded input rows the tiles read
        self.cols_per_phase = self.tiles_w + -(-(KERNEL - 1) // tile)   # padded columns per phase
        # two band buffers of a^2 x max(C, O) floats per tile: (D, then M, then Y) and (V, then Z)
        self.tile_floats = self.alpha * self.alpha * max(c, out_channels)
        tiles = max(MIN_BAND_TILES, BAND_BUDGET_BYTES // (2 * self.tile_floats * itemsize))
        per_sample = self.tiles_h * self.tiles_w
        if tiles >= per_sample:   # whole samples per band
            self.samples = min(n, tiles // per_sample)
            self.band_rows = self.tiles_h
        else:                     # one sample, a band of tile rows
            self.samples = 1
            self.band_rows = max(1, min(self.tiles_h, tiles // self.tiles_w))
        self.band_tiles = self.samples * self.band_rows * self.tiles_w


def _phase_copies(x_width: int, pad_left: int, tile: int) -> List[Tuple[int, int, int, int]]:
    """(phase p, first input column, first column in the phase, count) for the phase-split copy."""
    copies = []
    for p in range(tile):
        first = (p - pad_left) % tile
        count = len(range(first, x_width, tile))
        if count:
            copies.append((p, first, (first + pad_left) // tile, count))
    return copies


def scratch_layout(x_shape: Sequence[int], out_channels: int, pads: Tuple[Tuple[int, int], Tuple[int, int]],
                   tile: int, dtype: Any) -> list:
    """The temporaries of winograd_conv2d (cgvm.ops.kernels.scratch): the transformed weights U, the
    phase-split input of one chunk of samples and the two band buffers."""
    plan = _Plan(x_shape, out_channels, pads, tile, np.dtype(dtype).itemsize)
    c = x_shape[1]
    band = plan.band_tiles * plan.tile_floats
    return [("u", (plan.alpha ** 2, out_channels, c), dtype),
            ("xt", (plan.samples, plan.rows, tile, plan.cols_per_phase, c), dtype),
            ("first", (band,), dtype), ("second", (band,), dtype)]


def winograd_conv2d(xp: Any, x: Any, w: Any, b: Optional[Any], pads: Tuple[Tuple[int, int], Tuple[int, int]],
                    out: Any, tile: int, temps: Optional[dict] = None) -> Any:
    """Write conv(x, w) + b into out (N, O, H', W'), C-contiguous; x (N, C, H, W), w (O, C, 3, 3), stride 1.

    ``temps`` holds the arrays of scratch_layout (allocated here when not given)."""
    at_np, _, bt_np = winograd_matrices(tile)
    dtype = x.dtype
    n, c, height = x.shape[:3]
    o = w.shape[0]
    if temps is None:
        temps = take(xp, None, scratch_layout(x.shape, o, pads, tile, dtype))
    plan = _Plan(x.shape, o, pads, tile, dtype.itemsize)
    m, alpha = tile, plan.alpha
    a2 = alpha * alpha
    tw, qw = plan.tiles_w, plan.cols_per_phase
    u = transform_weights(xp, w, tile, out=temps["u"])
    bias_slot = _ones_column(at_np) * (alpha + 1)
    bt = xp.asarray(bt_np, dtype=dtype)
    at = xp.asarray(at_np, dtype=dtype)
    # matmul runs a broadcast (stride-0) operand through NumPy's slow non-BLAS loop: stack copies
    bt_stack = xp.ascontiguousarray(xp.broadcast_to(bt, (max(alpha, plan.samples * plan.band_rows), alpha, alpha)))
    at_stack = xp.ascontiguousarray(xp.broadcast_to(at, (alpha, m, alpha)))
    at_t_stack = xp.ascontiguousarray(xp.broadcast_to(at.T, (m, alpha, m)))

    # phase-split NHWC input: xt[s, row, p, q, ch] = padded x[s, ch, row, q*m + p]; borders stay zero
    (pad_top, _), (pad_left, _) = pads
    xt = temps["xt"]
    xt[...] = 0
    copies = _phase_copies(x.shape[3], pad_left, m)
    first_buf, second_buf = temps["first"], temps["second"]
    item = dtype.itemsize
    row_stride = m * qw * c * item
    sample_stride = plan.rows * row_stride

    for start in range(0, n, plan.samples):
        stop = min(n, start + plan.samples)
        ns = stop - start
        chunk = xt[:ns]
        for p, first, q0, count in copies:
            chunk[:, pad_top:pad_top + height, p, q0:q0 + count] = x[start:stop, :, :, first::m].transpose(0, 2, 3, 1)
        for t0 in range(0, plan.tiles_h, plan.band_rows):
            nb = min(plan.band_rows, plan.tiles_h - t0)
            tiles = ns * nb * tw
            # row transform, one column tap k at a time: D[a, k, s, t, u, ch]
            d = first_buf[:a2 * tiles * c].reshape(alpha, alpha, ns, nb, tw * c)
            for k in range(alpha):
                src = xp.lib.stride_tricks.as_strided(chunk[:, t0 * m:, k % m, k // m:], shape=(ns, nb, alpha, tw * c),
                                                      strides=(sample_stride, m * row_stride, row_stride, item))
                xp.matmul(bt_stack[:ns * nb].reshape(ns, nb, alpha, alpha), src, out=d[:, k].transpose(1, 2, 0, 3))
            # column transform: V[a, b] = sum_k BT[b, k] D[a, k]
            v = second_buf[:a2 * tiles * c].reshape(alpha, alpha, tiles * c)
            xp.matmul(bt_stack[:alpha], d.reshape(alpha, alpha, tiles * c), out=v)
            # channel GEMMs: M[ab] (O, T) = U[ab] (O, C) @ V[ab]^T
            prod = first_buf[:a2 * o * tiles].reshape(a2, o, tiles)
            xp.matmul(u, v.reshape(a2, tiles, c).transpose(0, 2, 1), out=prod)
            if b is not None:
                prod[bias_slot] += b.reshape(o, 1)
            # output transform over tile rows, Z[i, b] = sum_a AT[i, a] M[a, b] (one GEMM per b: a
            # single one with 6x the columns ran 2x slower), then over tile columns with the m
            # columns of a tile innermost
            z = second_buf[:m * alpha * o * tiles].reshape(m, alpha, o * tiles)
            xp.matmul(at_stack, prod.reshape(alpha, alpha, o * tiles).transpose(1, 0, 2), out=z.transpose(1, 0, 2))
            y = first_buf[:m * m * o * tiles].reshape(m, o * tiles, m)
            xp.matmul(z.transpose(0, 2, 1), at_t_stack, out=y)
            result_rows = y.reshape(m, o, ns, nb, tw * m)
            for i in range(m):
                first_row = t0 * m + i
                count = len(range(first_row, min(plan.out_h, (t0 + nb) * m), m))
                if count:
                    out[start:stop, :, first_row:first_row + (count - 1) * m + 1:m] = \
                        result_rows[i, :, :, :count, :plan.out_w].transpose(1, 0, 2, 3)
    return out
