"""Geometry of the convolution family (NCHW, any number of spatial axes): attributes normalized per
axis, output sizes, and the strided window view the im2col kernels copy from.

Shared by the ops (cgvm.ops.conv), their kernels (conv_im2col, conv_winograd, conv_batchlast)
and pooling.
"""
from __future__ import annotations

import itertools
from typing import Any, List, Optional, Sequence, Tuple

from ..errors import ShapeError
from .rules import Dim

PadPairs = Tuple[Tuple[int, int], ...]


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


def dims_product(values: Sequence[int]) -> int:
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


def windows(xp: Any, xpad: Any, ksize: Sequence[int], out_sizes: Sequence[int], geo: ConvGeometry) -> Any:
    """Strided view (N, C, k..., out...) of the padded input: element [n, c, k, p] = xpad[n, c, p·s + k·d]."""
    sp = xpad.strides[2:]
    shape = tuple(xpad.shape[:2]) + tuple(ksize) + tuple(out_sizes)
    strides = tuple(xpad.strides[:2]) + tuple(st * d for st, d in zip(sp, geo.dilation)) + \
        tuple(st * s for st, s in zip(sp, geo.stride))
    return xp.lib.stride_tricks.as_strided(xpad, shape=shape, strides=strides)


def is_pointwise(ksize: Sequence[int], geo: ConvGeometry) -> bool:
    return all(k == 1 for k in ksize) and all(s == 1 for s in geo.stride) and not any(b or e for b, e in geo.pads)


def store(xp: Any, result: Any, out: Optional[Any]) -> Any:
    if out is None:
        return result
    out[...] = result
    return out


def bias_shape(nsp: int, channels: int) -> Tuple[int, ...]:
    return (1, channels) + (1,) * nsp
