"""Convolution layers (channels_last by default): Conv1D, Conv2D, Conv3D, Conv2DTranspose, DepthwiseConv2D,
SeparableConv2D, and ZeroPadding1D/2D.

cgvm's conv ops are NCHW with (O, I, k...) weights; these layers keep Keras' kernel layouts
(``(k..., in/groups, out)``; Conv2DTranspose ``(k..., out, in)``; depthwise ``(k..., in, mult)``) in the
Workspace so files load unchanged, and transpose the kernel and, for channels_last, the
activations around each op. "same" padding is TensorFlow's: the odd pixel goes at the end.
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

from ....errors import GraphBuildError
from ....ir.graph import Value
from ....ops import conv as conv_ops
from ....ops import indexing
from ....ops import shape as shp
from .. import activations
from ..backend import to_value
from .base import Layer, registry
from .core import make_weight, weight_args, weight_config


def tuple_arg(value: Any, n: int, what: str) -> Tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * n
    out = tuple(int(v) for v in value)
    if len(out) != n:
        raise GraphBuildError(f"{what} needs {n} values, got {value!r}")
    return out


def same_pads(sizes: Sequence[Optional[int]], kernel: Sequence[int], strides: Sequence[int],
              dilation: Sequence[int], layer: str) -> Tuple[List[int], List[int]]:
    """TensorFlow's "same": total = max((ceil(n/s)-1)*s + (k-1)*d + 1 - n, 0), extra pixel at the end."""
    begins, ends = [], []
    for n, k, s, d in zip(sizes, kernel, strides, dilation):
        if n is None:
            if s != 1:
                raise GraphBuildError(f"layer {layer!r}: padding='same' with stride {s} needs known spatial sizes")
            total = (k - 1) * d
        else:
            total = max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
        begins.append(total // 2)
        ends.append(total - total // 2)
    return begins, ends


def to_channels_first(x: Value) -> Value:
    return shp.transpose(x, perm=[0, x.ndim - 1] + list(range(1, x.ndim - 1)))


def to_channels_last(x: Value) -> Value:
    return shp.transpose(x, perm=[0] + list(range(2, x.ndim)) + [1])


class BaseConv(Layer):
    """Shared argument handling and the NCHW round trip of the convolution layers."""

    rank = 2

    def __init__(self, filters: int, kernel_size: Any, strides: Any = 1, padding: str = "valid",
                 data_format: Optional[str] = None, dilation_rate: Any = 1, groups: int = 1, activation: Any = None,
                 use_bias: bool = True, kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 kernel_regularizer: Any = None, bias_regularizer: Any = None, kernel_constraint: Any = None,
                 bias_constraint: Any = None, **kwargs: Any):
        kwargs.pop("lora_rank", None)
        kwargs.pop("lora_alpha", None)
        super().__init__(**kwargs)
        self.filters = None if filters is None else int(filters)
        self.kernel_size = tuple_arg(kernel_size, self.rank, "kernel_size")
        self.strides = tuple_arg(strides, self.rank, "strides")
        self.padding = padding.lower()
        if self.padding not in ("valid", "same", "causal"):
            raise GraphBuildError(f"layer {self.name!r}: padding must be 'valid', 'same' or 'causal', got {padding!r}")
        self.data_format = data_format or "channels_last"
        self.dilation_rate = tuple_arg(dilation_rate, self.rank, "dilation_rate")
        self.groups = int(groups)
        self.activation = activations.get(activation)
        self.use_bias = use_bias
        weight_args(self, "kernel", kernel_initializer, kernel_regularizer, kernel_constraint)
        weight_args(self, "bias", bias_initializer, bias_regularizer, bias_constraint)

    def channels(self, input_shape: Sequence[Optional[int]]) -> int:
        c = input_shape[-1] if self.data_format == "channels_last" else input_shape[1]
        if c is None:
            raise GraphBuildError(f"layer {self.name!r}: the channel axis of its input {tuple(input_shape)} "
                                  "must be known")
        return int(c)

    def build(self, input_shape):
        c = self.channels(input_shape)
        if c % self.groups or self.filters % self.groups:
            raise GraphBuildError(f"layer {self.name!r}: {c} input channels and {self.filters} filters must both "
                                  f"divide by groups={self.groups}")
        self.kernel = make_weight(self, "kernel", self.kernel_size + (c // self.groups, self.filters), "kernel")
        self.bias = make_weight(self, "bias", (self.filters,), "bias") if self.use_bias else None
        self.built = True

    def pads(self, x_cf: Value) -> List[int]:
        """cgvm pad attribute (begins..., ends...) for an NC... input."""
        sizes = x_cf.shape[2:]
        if self.padding == "valid":
            return [0] * (2 * self.rank)
        if self.padding == "causal":
            return [(k - 1) * d for k, d in zip(self.kernel_size, self.dilation_rate)] + [0] * self.rank
        begins, ends = same_pads(sizes, self.kernel_size, self.strides, self.dilation_rate, self.name)
        return begins + ends

    def oihw_kernel(self) -> Value:
        k = self.kernel.value
        return shp.transpose(k, perm=[self.rank + 1, self.rank] + list(range(self.rank)))

    def call(self, inputs):
        x = to_value(inputs)
        cf = to_channels_first(x) if self.data_format == "channels_last" else x
        args = [cf, self.oihw_kernel()] + ([self.bias.value] if self.bias is not None else [])
        y = conv_ops.conv(*args, stride=self.strides, pad=self.pads(cf), dilation=self.dilation_rate,
                          groups=self.groups)
        if self.data_format == "channels_last":
            y = to_channels_last(y)
        return self.activation(y)

    def get_config(self):
        return {**super().get_config(), "filters": self.filters, "kernel_size": list(self.kernel_size),
                "strides": list(self.strides), "padding": self.padding, "data_format": self.data_format,
                "dilation_rate": list(self.dilation_rate), "groups": self.groups,
                "activation": activations.serialize(self.activation), "use_bias": self.use_bias,
                **weight_config(self, "kernel", "bias")}


@registry.register()
class Conv1D(BaseConv):
    rank = 1


@registry.register()
class Conv2D(BaseConv):
    rank = 2


@registry.register()
class Conv3D(BaseConv):
    rank = 3


@registry.register()
class Conv2DTranspose(BaseConv):
    """Transposed convolution; kernel (kh, kw, filters, in), output_padding as in Keras."""

    def __init__(self, filters: int, kernel_size: Any, strides: Any = 1, padding: str = "valid",
                 output_padding: Any = None, **kwargs: Any):
        super().__init__(filters, kernel_size, strides=strides, padding=padding, **kwargs)
        self.output_padding = None if output_padding is None else tuple_arg(output_padding, 2, "output_padding")

    def build(self, input_shape):
        c = self.channels(input_shape)
        self.kernel = make_weight(self, "kernel", self.kernel_size + (self.filters, c), "kernel")
        self.bias = make_weight(self, "bias", (self.filters,), "bias") if self.use_bias else None
        self.built = True

    def call(self, inputs):
        x = to_value(inputs)
        cf = to_channels_first(x) if self.data_format == "channels_last" else x
        weight = shp.transpose(self.kernel.value, perm=[3, 2, 0, 1])  # (in, out, kh, kw)
        begins, ends, extra = [], [], []
        for i, (k, s, d) in enumerate(zip(self.kernel_size, self.strides, self.dilation_rate)):
            keff = (k - 1) * d + 1
            if self.output_padding is not None:
                pad = 0 if self.padding == "valid" else keff // 2
                begins.append(pad), ends.append(pad), extra.append(self.output_padding[i])
            elif self.padding == "valid":
                begins.append(0), ends.append(0), extra.append(max(s - keff, 0))
            else:
                # the adjoint of a "same" convolution from n*s down to n: TensorFlow's pads, extra at the end
                total = max(keff - s, 0)
                begins.append(total // 2), ends.append(total - total // 2), extra.append(max(s - keff, 0))
        args = [cf, weight] + ([self.bias.value] if self.bias is not None else [])
        y = conv_ops.conv_transpose(*args, stride=self.strides, pad=begins + ends, dilation=self.dilation_rate,
                                    output_padding=extra)
        if self.data_format == "channels_last":
            y = to_channels_last(y)
        return self.activation(y)

    def get_config(self):
        config = super().get_config()
        config.pop("groups", None)
        config["output_padding"] = None if self.output_padding is None else list(self.output_padding)
        return config


@registry.register()
class DepthwiseConv2D(BaseConv):
    """One filter bank per input channel; kernel (kh, kw, in, depth_multiplier)."""

    def __init__(self, kernel_size: Any, strides: Any = 1, padding: str = "valid", depth_multiplier: int = 1,
                 depthwise_initializer: Any = "glorot_uniform", depthwise_regularizer: Any = None,
                 depthwise_constraint: Any = None, **kwargs: Any):
        kwargs.pop("filters", None)
        for k in ("kernel_initializer", "kernel_regularizer", "kernel_constraint"):
            kwargs.pop(k, None)
        super().__init__(None, kernel_size, strides=strides, padding=padding, **kwargs)
        self.depth_multiplier = int(depth_multiplier)
        weight_args(self, "depthwise", depthwise_initializer, depthwise_regularizer, depthwise_constraint)

    def build(self, input_shape):
        c = self.channels(input_shape)
        self.in_channels = c
        self.kernel = make_weight(self, "kernel", self.kernel_size + (c, self.depth_multiplier), "depthwise")
        self.bias = (make_weight(self, "bias", (c * self.depth_multiplier,), "bias") if self.use_bias else None)
        self.groups = c
        self.built = True

    def oihw_kernel(self) -> Value:
        # (kh, kw, in, mult) -> (in*mult, 1, kh, kw): output channel c*mult + m, as Keras orders them
        kh, kw = self.kernel_size
        k = shp.reshape(self.kernel.value, shape=(kh, kw, 1, self.in_channels * self.depth_multiplier))
        return shp.transpose(k, perm=[3, 2, 0, 1])

    def get_config(self):
        config = super().get_config()
        for k in ("filters", "groups", "kernel_initializer", "kernel_regularizer", "kernel_constraint"):
            config.pop(k, None)
        config["depth_multiplier"] = self.depth_multiplier
        config.update(weight_config(self, "depthwise"))
        return config


@registry.register()
class SeparableConv2D(BaseConv):
    """Depthwise then pointwise convolution; weights depthwise_kernel, pointwise_kernel, bias."""

    def __init__(self, filters: int, kernel_size: Any, strides: Any = 1, padding: str = "valid",
                 depth_multiplier: int = 1, depthwise_initializer: Any = "glorot_uniform",
                 pointwise_initializer: Any = "glorot_uniform", depthwise_regularizer: Any = None,
                 pointwise_regularizer: Any = None, depthwise_constraint: Any = None,
                 pointwise_constraint: Any = None, **kwargs: Any):
        super().__init__(filters, kernel_size, strides=strides, padding=padding, **kwargs)
        self.depth_multiplier = int(depth_multiplier)
        weight_args(self, "depthwise", depthwise_initializer, depthwise_regularizer, depthwise_constraint)
        weight_args(self, "pointwise", pointwise_initializer, pointwise_regularizer, pointwise_constraint)

    def build(self, input_shape):
        c = self.channels(input_shape)
        m = self.depth_multiplier
        self.in_channels = c
        self.depthwise_kernel = make_weight(self, "depthwise_kernel", self.kernel_size + (c, m), "depthwise")
        self.pointwise_kernel = make_weight(self, "pointwise_kernel", (1, 1, c * m, self.filters), "pointwise")
        self.bias = make_weight(self, "bias", (self.filters,), "bias") if self.use_bias else None
        self.built = True

    def call(self, inputs):
        x = to_value(inputs)
        cf = to_channels_first(x) if self.data_format == "channels_last" else x
        kh, kw = self.kernel_size
        dw = shp.transpose(shp.reshape(self.depthwise_kernel.value, shape=(kh, kw, 1, -1)), perm=[3, 2, 0, 1])
        y = conv_ops.conv(cf, dw, stride=self.strides, pad=self.pads(cf), dilation=self.dilation_rate,
                          groups=self.in_channels)
        pw = shp.transpose(self.pointwise_kernel.value, perm=[3, 2, 0, 1])
        args = [y, pw] + ([self.bias.value] if self.bias is not None else [])
        y = conv_ops.conv(*args)
        if self.data_format == "channels_last":
            y = to_channels_last(y)
        return self.activation(y)

    def get_config(self):
        config = super().get_config()
        for k in ("groups", "kernel_initializer", "kernel_regularizer", "kernel_constraint"):
            config.pop(k, None)
        config["depth_multiplier"] = self.depth_multiplier
        config.update(weight_config(self, "depthwise", "pointwise"))
        return config


class _ZeroPadding(Layer):
    rank = 2

    def __init__(self, padding: Any = 1, data_format: Optional[str] = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.data_format = data_format or "channels_last"
        if isinstance(padding, int):
            pairs = [(padding, padding)] * self.rank
        else:
            pairs = [(p, p) if isinstance(p, int) else tuple(p) for p in padding]
            if self.rank == 1 and len(pairs) == 2 and all(isinstance(p, int) for p in padding):
                pairs = [tuple(padding)]
        self.padding = tuple(tuple(int(v) for v in p) for p in pairs)

    def call(self, inputs):
        x = to_value(inputs)
        spatial = list(range(1, 1 + self.rank)) if self.data_format == "channels_last" else \
            list(range(2, 2 + self.rank))
        pads = [[0, 0] for _ in range(x.ndim)]
        for axis, (b, e) in zip(spatial, self.padding):
            pads[axis] = [b, e]
        return indexing.pad(x, pads=[p for pair in pads for p in pair])

    def get_config(self):
        return {**super().get_config(), "padding": [list(p) for p in self.padding], "data_format": self.data_format}


@registry.register()
class ZeroPadding1D(_ZeroPadding):
    rank = 1

    def get_config(self):
        config = super().get_config()
        config["padding"] = list(self.padding[0])
        return config


@registry.register()
class ZeroPadding2D(_ZeroPadding):
    rank = 2
