"""BatchNormalization (moving statistics updated as part of the training step) and LayerNormalization."""
from __future__ import annotations

from typing import Any

from ....ops import elementwise as ew
from ....ops import elementwise_math as em
from ....ops import nn
from ....ops import reduce as red
from ....ops import shape as shp
from .. import initializers as initializers_mod
from ..backend import current_scope, to_value
from .base import Layer, registry
from .core import make_weight, weight_args, weight_config


@registry.register()
class BatchNormalization(Layer):
    """Weights gamma, beta, moving_mean, moving_variance (C,). Training normalizes with the batch's
    statistics and moves the moving ones: ``moving = moving * momentum + batch * (1 - momentum)``."""

    supports_masking = True  # the mask passes through unchanged

    def __init__(self, axis: Any = -1, momentum: float = 0.99, epsilon: float = 1e-3, center: bool = True,
                 scale: bool = True, beta_initializer: Any = "zeros", gamma_initializer: Any = "ones",
                 moving_mean_initializer: Any = "zeros", moving_variance_initializer: Any = "ones",
                 beta_regularizer: Any = None, gamma_regularizer: Any = None, beta_constraint: Any = None,
                 gamma_constraint: Any = None, synchronized: bool = False, **kwargs: Any):
        kwargs.pop("renorm", None), kwargs.pop("renorm_clipping", None), kwargs.pop("renorm_momentum", None)
        kwargs.pop("fused", None), kwargs.pop("virtual_batch_size", None), kwargs.pop("adjustment", None)
        super().__init__(**kwargs)
        self.axis = axis[0] if isinstance(axis, (list, tuple)) else int(axis)
        self.momentum, self.epsilon, self.center, self.scale = float(momentum), float(epsilon), center, scale
        weight_args(self, "beta", beta_initializer, beta_regularizer, beta_constraint)
        weight_args(self, "gamma", gamma_initializer, gamma_regularizer, gamma_constraint)
        weight_args(self, "moving_mean", moving_mean_initializer, None, None)
        weight_args(self, "moving_variance", moving_variance_initializer, None, None)

    def build(self, input_shape):
        c = input_shape[self.axis]
        self.gamma = make_weight(self, "gamma", (c,), "gamma") if self.scale else None
        self.beta = make_weight(self, "beta", (c,), "beta") if self.center else None
        self.moving_mean = make_weight(self, "moving_mean", (c,), "moving_mean", trainable=False)
        self.moving_variance = make_weight(self, "moving_variance", (c,), "moving_variance", trainable=False)
        self.built = True

    def _affine(self, c_like):
        scale = self.gamma.value if self.gamma is not None else None
        bias = self.beta.value if self.beta is not None else None
        if bias is not None and scale is None:
            scale = shp.ones_like(bias)
        return [v for v in (scale, bias) if v is not None]

    def call(self, inputs, training=False, mask=None):
        x = to_value(inputs)
        mm, mv = self.moving_mean.value, self.moving_variance.value
        affine = self._affine(mm)
        if mask is not None and to_value(mask).ndim != x.ndim - 1:
            raise ValueError("The mask provided should be one dimension less than the inputs. Received: "
                             f"mask.shape={tuple(to_value(mask).shape)}, inputs.shape={tuple(x.shape)}")
        if not (training and self.trainable):
            return nn.batch_norm(x, mm, mv, *affine, eps=self.epsilon, axis=self.axis)
        if mask is not None:
            y, mean, var = self._masked_batch_norm(x, to_value(mask), affine)
        else:
            y, mean, var = nn.batch_norm(x, mm, mv, *affine, eps=self.epsilon, axis=self.axis, training=True)
        m = self.momentum
        scope = current_scope()
        # a layer called more than once in one step (shared, or per step inside TimeDistributed) moves
        # its averages once per call, in order, as Keras' successive assigns do
        mm_now = scope.updates[self.moving_mean.path][1] if self.moving_mean.path in scope.updates else mm
        mv_now = scope.updates[self.moving_variance.path][1] if self.moving_variance.path in scope.updates else mv
        scope.updates[self.moving_mean.path] = (mm, ew.add(ew.mul(mm_now, m), ew.mul(mean, 1.0 - m)))
        scope.updates[self.moving_variance.path] = (mv, ew.add(ew.mul(mv_now, m), ew.mul(var, 1.0 - m)))
        return y

    def _masked_batch_norm(self, x, mask, affine):
        """Training-mode normalization with statistics over the unmasked steps only, as Keras 3:
        mean = sum(m x) / (sum m + 1e-7), var = sum(m (x - mean)^2) / (sum m + 1e-7), where the
        mask m (one axis fewer than x) is broadcast along the last axis."""
        axis = self.axis % x.ndim
        axes = tuple(a for a in range(x.ndim) if a != axis)
        weights = ew.mul(shp.expand_dims(ew.cast(mask, dtype=x.dtype), axis=(x.ndim - 1,)), shp.ones_like(x))
        denominator = ew.add(red.sum(weights, axis=axes, keepdims=True), 1e-7)
        mean = ew.div(red.sum(ew.mul(x, weights), axis=axes, keepdims=True), denominator)
        centred = ew.sub(x, mean)
        var = ew.div(red.sum(ew.mul(ew.square(centred), weights), axis=axes, keepdims=True), denominator)
        y = ew.div(centred, em.sqrt(ew.add(var, self.epsilon)))
        channel_shape = tuple(int(x.shape[axis]) if a == axis else 1 for a in range(x.ndim))
        if affine:
            y = ew.mul(y, shp.reshape(affine[0], shape=channel_shape))
        if len(affine) > 1:
            y = ew.add(y, shp.reshape(affine[1], shape=channel_shape))
        return y, shp.reshape(mean, shape=(int(x.shape[axis]),)), shp.reshape(var, shape=(int(x.shape[axis]),))

    def get_config(self):
        return {**super().get_config(), "axis": self.axis, "momentum": self.momentum, "epsilon": self.epsilon,
                "center": self.center, "scale": self.scale,
                **weight_config(self, "beta", "gamma"),
                "moving_mean_initializer": initializers_mod.serialize(self.moving_mean_initializer),
                "moving_variance_initializer": initializers_mod.serialize(self.moving_variance_initializer)}


@registry.register()
class LayerNormalization(Layer):
    """Normalizes over ``axis`` (default the last) per sample; weights gamma, beta."""

    supports_masking = True  # the mask passes through unchanged

    def __init__(self, axis: Any = -1, epsilon: float = 1e-3, center: bool = True, scale: bool = True,
                 rms_scaling: bool = False, beta_initializer: Any = "zeros", gamma_initializer: Any = "ones",
                 beta_regularizer: Any = None, gamma_regularizer: Any = None, beta_constraint: Any = None,
                 gamma_constraint: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.axis = list(axis) if isinstance(axis, (list, tuple)) else [int(axis)]
        self.epsilon, self.center, self.scale, self.rms_scaling = float(epsilon), center, scale, rms_scaling
        weight_args(self, "beta", beta_initializer, beta_regularizer, beta_constraint)
        weight_args(self, "gamma", gamma_initializer, gamma_regularizer, gamma_constraint)

    def build(self, input_shape):
        ndim = len(input_shape)
        self._axes = sorted(a % ndim for a in self.axis)
        shape = tuple(input_shape[a] for a in self._axes)
        self.gamma = make_weight(self, "gamma", shape, "gamma") if self.scale else None
        self.beta = make_weight(self, "beta", shape, "beta") if self.center and not self.rms_scaling else None
        self.built = True

    def _broadcast(self, w, ndim: int):
        missing = [i for i in range(ndim) if i not in self._axes]
        return shp.expand_dims(w, axis=missing)

    def call(self, inputs):
        x = to_value(inputs)
        if self.rms_scaling:
            ms = red.mean(ew.square(x), axis=self._axes, keepdims=True)
            y = ew.mul(x, em.rsqrt(ew.add(ms, self.epsilon)))
        else:
            mean = red.mean(x, axis=self._axes, keepdims=True)
            centred = ew.sub(x, mean)
            var = red.mean(ew.square(centred), axis=self._axes, keepdims=True)
            y = ew.mul(centred, em.rsqrt(ew.add(var, self.epsilon)))
        if self.gamma is not None:
            y = ew.mul(y, self._broadcast(self.gamma.value, x.ndim))
        if self.beta is not None:
            y = ew.add(y, self._broadcast(self.beta.value, x.ndim))
        return y

    def get_config(self):
        return {**super().get_config(), "axis": self.axis if len(self.axis) > 1 else self.axis[0],
                "epsilon": self.epsilon, "center": self.center, "scale": self.scale,
                "rms_scaling": self.rms_scaling, **weight_config(self, "beta", "gamma")}
