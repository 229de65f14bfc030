"""Convolution family, NCHW with any number of spatial axes: conv, conv_transpose and their gradient ops.

``conv`` is cross-correlation as in Caffe and PyTorch: weight (C_out, C_in/groups, k...).
``conv_transpose`` is Caffe's Deconvolution / PyTorch's conv_transpose: weight (C_in, C_out/groups, k...).

Attributes shared by the family (each may be one value for all spatial axes or one per axis):
``stride`` (1), ``dilation`` (1), ``pad`` (0): one value, one per axis (symmetric), or 2·n values
``(begin_0, ..., begin_n-1, end_0, ..., end_n-1)`` as in ONNX for asymmetric padding; ``groups`` (1).
Output size per axis: ``floor((in + pad_begin + pad_end - (dilation·(k-1)+1)) / stride) + 1``.

Kernels: cgvm.ops.kernels.conv_im2col picks the method (Winograd, batch-last, im2col) and declares
each method's temporaries as scratch, so the memory plan holds them; the geometry is in
cgvm.ops.conv_geometry.

Gradients are three ops closed under differentiation (conv is bilinear in x and w):
``conv_grad_input(g, w, x_like)`` (= conv_transpose with the output shape of x) and
``conv_grad_weight(x, g, w_like)`` (correlation of x with g); the ``*_like`` inputs only give
shapes, which the floor in the size rule makes unrecoverable from g alone.
"""
from __future__ import annotations

from typing import Sequence, Tuple

from ..errors import DTypeError, ShapeError
from ..ir.attrs import Int, Ints
from ..ir.types import TensorType
from . import reduce as red
from .conv_geometry import ConvGeometry, bias_shape, spatial_values
from .kernels.conv_im2col import conv_backward_input, conv_backward_weight, conv_forward, conv_forward_scratch, conv_grad_scratch
from .registry import OPAQUE, defop
from .rules import Dim, require_float


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
        y += b.reshape(bias_shape(geo.nsp, b.shape[0]))
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
