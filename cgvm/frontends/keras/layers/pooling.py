"""Pooling layers: Max/AveragePooling 1D/2D/3D and the global poolings (channels_last by default).

"same" pads TensorFlow's way (odd pixel at the end); max pooling ignores the padding and average
pooling leaves padded cells out of the mean, as Keras does.
"""
from __future__ import annotations

from typing import Any, Optional

from ....ir.graph import Value
from ....ops import pool as pool_ops
from ....ops import elementwise as ew
from ....ops import reduce as red
from ....ops import shape as shp
from ..backend import to_value
from .base import Layer, registry
from .conv import same_pads, to_channels_first, to_channels_last, tuple_arg


class _Pooling(Layer):
    rank = 2
    kind = "max"

    def __init__(self, pool_size: Any = 2, strides: Any = None, padding: str = "valid",
                 data_format: Optional[str] = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.pool_size = tuple_arg(pool_size, self.rank, "pool_size")
        self.strides = self.pool_size if strides is None else tuple_arg(strides, self.rank, "strides")
        self.padding = padding.lower()
        self.data_format = data_format or "channels_last"

    def call(self, inputs):
        x = to_value(inputs)
        cf = to_channels_first(x) if self.data_format == "channels_last" else x
        if self.padding == "same":
            begins, ends = same_pads(cf.shape[2:], self.pool_size, self.strides, (1,) * self.rank, self.name)
            pads = begins + ends
        else:
            pads = [0] * (2 * self.rank)
        if self.kind == "max":
            y = pool_ops.max_pool(cf, kernel=self.pool_size, stride=self.strides, pad=pads)
        else:
            y = pool_ops.avg_pool(cf, kernel=self.pool_size, stride=self.strides, pad=pads, count_include_pad=False)
        return to_channels_last(y) if self.data_format == "channels_last" else y

    def get_config(self):
        return {**super().get_config(), "pool_size": list(self.pool_size), "strides": list(self.strides),
                "padding": self.padding, "data_format": self.data_format}


@registry.register()
class MaxPooling1D(_Pooling):
    rank, kind = 1, "max"


@registry.register()
class MaxPooling2D(_Pooling):
    rank, kind = 2, "max"


@registry.register()
class MaxPooling3D(_Pooling):
    rank, kind = 3, "max"


@registry.register()
class AveragePooling1D(_Pooling):
    rank, kind = 1, "avg"


@registry.register()
class AveragePooling2D(_Pooling):
    rank, kind = 2, "avg"


@registry.register()
class AveragePooling3D(_Pooling):
    rank, kind = 3, "avg"


class _GlobalPooling(Layer):
    kind = "avg"

    def __init__(self, data_format: Optional[str] = None, keepdims: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.data_format = data_format or "channels_last"
        self.keepdims = keepdims

    def call(self, inputs):
        x: Value = to_value(inputs)
        axes = list(range(1, x.ndim - 1)) if self.data_format == "channels_last" else list(range(2, x.ndim))
        fn = red.mean if self.kind == "avg" else red.max
        return fn(x, axis=axes, keepdims=self.keepdims)

    def get_config(self):
        return {**super().get_config(), "data_format": self.data_format, "keepdims": self.keepdims}


class _MaskedGlobalAveragePooling1D(_GlobalPooling):
    """The mean over time of the unmasked steps only (Keras 3); the output carries no mask.
    (GlobalMaxPooling1D ignores masks in Keras 3, and so does it here.)"""

    kind = "avg"
    supports_masking = True

    def call(self, inputs, mask=None):
        if mask is None:
            return super().call(inputs)
        x: Value = to_value(inputs)
        keep = to_value(mask)
        keep = keep if keep.dtype.name == "bool" else ew.gt(keep, 0.5)
        steps_axis = 1 if self.data_format == "channels_last" else 2
        keep = shp.expand_dims(keep, axis=[2 if self.data_format == "channels_last" else 1])
        total = red.sum(ew.where(keep, x, 0.0), axis=[steps_axis], keepdims=self.keepdims)
        return ew.div(total, red.sum(ew.cast(keep, dtype=x.dtype), axis=[steps_axis], keepdims=self.keepdims))

    def compute_mask(self, inputs, mask=None):
        return None


globals()["GlobalAveragePooling1D"] = registry.register()(
    type("GlobalAveragePooling1D", (_MaskedGlobalAveragePooling1D,), {"__module__": __name__}))
for _name, _kind in (("GlobalAveragePooling2D", "avg"),
                     ("GlobalAveragePooling3D", "avg"), ("GlobalMaxPooling1D", "max"),
                     ("GlobalMaxPooling2D", "max"), ("GlobalMaxPooling3D", "max")):
    globals()[_name] = registry.register()(type(_name, (_GlobalPooling,), {"kind": _kind, "__module__": __name__}))

GlobalAveragePooling1D = globals()["GlobalAveragePooling1D"]
GlobalAveragePooling2D = globals()["GlobalAveragePooling2D"]
GlobalAveragePooling3D = globals()["GlobalAveragePooling3D"]
GlobalMaxPooling1D = globals()["GlobalMaxPooling1D"]
GlobalMaxPooling2D = globals()["GlobalMaxPooling2D"]
GlobalMaxPooling3D = globals()["GlobalMaxPooling3D"]
GlobalAvgPool2D = GlobalAveragePooling2D
MaxPool2D = MaxPooling2D
AvgPool2D = AveragePooling2D
