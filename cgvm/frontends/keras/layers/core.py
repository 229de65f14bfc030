"""Core layers: Dense, Activation, Dropout, Flatten, Reshape, Permute, RepeatVector, Embedding, Masking,
Lambda, and the activation layers ReLU, LeakyReLU, Softmax, ELU, PReLU, Rescaling.

Mask producers are Embedding(mask_zero=True) and Masking; the per-element layers here pass a mask
on unchanged (``supports_masking``), the reshaping ones drop it, as in Keras 3."""
from __future__ import annotations

import base64
import marshal
import types
from typing import Any, Dict, Optional, Sequence

from ....errors import GraphBuildError
from ....ir.graph import Value
from ....ops import elementwise as ew
from ....ops import elementwise_math as em
from ....ops import linalg
from ....ops import nn
from ....ops import reduce as red
from ....ops import shape as shp
from .. import activations
from .. import constraints as constraints_mod
from .. import initializers as initializers_mod
from .. import regularizers as regularizers_mod
from ..backend import current_scope, to_value
from ..serialization import KerasConfigError
from .base import Layer, registry


def weight_args(layer: Layer, prefix: str, initializer: Any, regularizer: Any, constraint: Any) -> None:
    """Store ``<prefix>_initializer/_regularizer/_constraint`` resolved, as every Keras layer does."""
    setattr(layer, f"{prefix}_initializer", initializers_mod.get(initializer))
    setattr(layer, f"{prefix}_regularizer", regularizers_mod.get(regularizer))
    setattr(layer, f"{prefix}_constraint", constraints_mod.get(constraint))


def weight_config(layer: Layer, *prefixes: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for p in prefixes:
        out[f"{p}_initializer"] = initializers_mod.serialize(getattr(layer, f"{p}_initializer"))
        out[f"{p}_regularizer"] = regularizers_mod.serialize(getattr(layer, f"{p}_regularizer"))
        out[f"{p}_constraint"] = constraints_mod.serialize(getattr(layer, f"{p}_constraint"))
    return out


def make_weight(layer: Layer, name: str, shape: Sequence[int], prefix: str, trainable: bool = True):
    return layer.add_weight(shape=shape, initializer=getattr(layer, f"{prefix}_initializer"),
                            regularizer=getattr(layer, f"{prefix}_regularizer"),
                            constraint=getattr(layer, f"{prefix}_constraint"), name=name, trainable=trainable)


@registry.register()
class Dense(Layer):
    """``activation(x @ kernel + bias)`` on the last axis; kernel (in, units)."""

    supports_masking = True


    def __init__(self, units: int, activation: Any = None, use_bias: bool = True,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 kernel_regularizer: Any = None, bias_regularizer: Any = None, kernel_constraint: Any = None,
                 bias_constraint: Any = None, lora_rank: Any = None, lora_alpha: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.units = int(units)
        self.activation = activations.get(activation)
        self.use_bias = use_bias
        weight_args(self, "kernel", kernel_initializer, kernel_regularizer, kernel_constraint)
        weight_args(self, "bias", bias_initializer, bias_regularizer, bias_constraint)

    def build(self, input_shape):
        last = input_shape[-1]
        if last is None:
            raise GraphBuildError(f"Dense layer {self.name!r}: the last axis of its input {tuple(input_shape)} "
                                  "must be known")
        self.kernel = make_weight(self, "kernel", (last, self.units), "kernel")
        self.bias = make_weight(self, "bias", (self.units,), "bias") if self.use_bias else None
        self.built = True

    def call(self, inputs):
        y = linalg.matmul(to_value(inputs), self.kernel.value)
        if self.bias is not None:
            y = ew.add(y, self.bias.value)
        return self.activation(y)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "activation": activations.serialize(self.activation),
                "use_bias": self.use_bias, **weight_config(self, "kernel", "bias")}


@registry.register()
class Activation(Layer):
    supports_masking = True

    def __init__(self, activation: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.activation = activations.get(activation)

    def call(self, inputs):
        return self.activation(to_value(inputs))

    def get_config(self):
        return {**super().get_config(), "activation": activations.serialize(self.activation)}


@registry.register()
class ReLU(Layer):
    supports_masking = True

    def __init__(self, max_value: Optional[float] = None, negative_slope: float = 0.0, threshold: float = 0.0,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.max_value, self.negative_slope, self.threshold = max_value, float(negative_slope), float(threshold)

    def call(self, inputs):
        return activations.relu(inputs, self.negative_slope, self.max_value, self.threshold)

    def get_config(self):
        return {**super().get_config(), "max_value": self.max_value, "negative_slope": self.negative_slope,
                "threshold": self.threshold}


@registry.register()
class LeakyReLU(Layer):
    supports_masking = True

    def __init__(self, negative_slope: float = 0.3, **kwargs: Any):
        alpha = kwargs.pop("alpha", None)
        super().__init__(**kwargs)
        self.negative_slope = float(alpha if alpha is not None else negative_slope)

    def call(self, inputs):
        return activations.leaky_relu(inputs, self.negative_slope)

    def get_config(self):
        return {**super().get_config(), "negative_slope": self.negative_slope}


@registry.register()
class ELU(Layer):
    supports_masking = True

    def __init__(self, alpha: float = 1.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.alpha = float(alpha)

    def call(self, inputs):
        return activations.elu(inputs, self.alpha)

    def get_config(self):
        return {**super().get_config(), "alpha": self.alpha}


@registry.register()
class Softmax(Layer):
    supports_masking = True

    def __init__(self, axis: int = -1, **kwargs: Any):
        super().__init__(**kwargs)
        self.axis = axis

    def call(self, inputs, mask=None):
        x = to_value(inputs)
        if mask is None:
            return nn.softmax(x, axis=self.axis)
        # Keras: masked entries take a large negative logit, then read as zero
        keep = _broadcastable_mask(to_value(mask), x, self.name)
        out = nn.softmax(ew.where(keep, x, _large_negative(x)), axis=self.axis)
        return ew.where(keep, out, 0.0)

    def get_config(self):
        return {**super().get_config(), "axis": self.axis}


@registry.register()
class PReLU(Layer):
    """``x`` where positive, ``alpha * x`` elsewhere; alpha has the input's shape without the batch axis."""

    supports_masking = True


    def __init__(self, alpha_initializer: Any = "zeros", alpha_regularizer: Any = None, alpha_constraint: Any = None,
                 shared_axes: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        weight_args(self, "alpha", alpha_initializer, alpha_regularizer, alpha_constraint)
        self.shared_axes = None if shared_axes is None else (
            list(shared_axes) if isinstance(shared_axes, (list, tuple)) else [shared_axes])

    def build(self, input_shape):
        shape = list(input_shape[1:])
        for a in self.shared_axes or ():
            shape[a - 1] = 1
        self.alpha = make_weight(self, "alpha", shape, "alpha")
        self.built = True

    def call(self, inputs):
        x = to_value(inputs)
        return ew.add(em.relu(x), ew.mul(self.alpha.value, ew.sub(x, em.relu(x))))

    def get_config(self):
        return {**super().get_config(), "shared_axes": self.shared_axes, **weight_config(self, "alpha")}


@registry.register()
class Dropout(Layer):
    """Inverted dropout while training (scaled by 1/(1-rate)); the identity at inference."""

    supports_masking = True


    def __init__(self, rate: float, noise_shape: Any = None, seed: Optional[int] = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.rate, self.noise_shape, self.seed = float(rate), noise_shape, seed

    def call(self, inputs, training=False):
        x = to_value(inputs)
        if not training or self.rate == 0.0:
            return x
        seed = current_scope().next_seed()
        if seed is None:
            raise GraphBuildError(f"Dropout layer {self.name!r} runs in training mode without a seed input; "
                                  "build training graphs through Model.fit / train_on_batch")
        return nn.dropout(x, seed, ratio=self.rate)

    def get_config(self):
        return {**super().get_config(), "rate": self.rate, "noise_shape": self.noise_shape, "seed": self.seed}


@registry.register()
class Flatten(Layer):
    """All axes after the batch axis into one (HWC order for channels_last, as Keras)."""

    def __init__(self, data_format: Optional[str] = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.data_format = data_format or "channels_last"

    def call(self, inputs):
        x = to_value(inputs)
        if self.data_format == "channels_first" and x.ndim > 2:
            x = shp.transpose(x, perm=[0] + list(range(2, x.ndim)) + [1])
        if x.ndim == 1:
            return shp.expand_dims(x, axis=[1])
        return shp.flatten(x, axis=1)

    def get_config(self):
        return {**super().get_config(), "data_format": self.data_format}


@registry.register()
class Reshape(Layer):
    def __init__(self, target_shape: Sequence[int], **kwargs: Any):
        super().__init__(**kwargs)
        self.target_shape = tuple(int(d) for d in target_shape)

    def call(self, inputs):
        x = to_value(inputs)
        batch = 0 if x.shape[0] is None else x.shape[0]
        # 0 copies the (possibly unknown) batch dimension
        return shp.reshape(x, shape=(batch,) + self.target_shape)

    def get_config(self):
        return {**super().get_config(), "target_shape": list(self.target_shape)}


@registry.register()
class Permute(Layer):
    def __init__(self, dims: Sequence[int], **kwargs: Any):
        super().__init__(**kwargs)
        self.dims = tuple(int(d) for d in dims)

    def call(self, inputs):
        return shp.transpose(to_value(inputs), perm=(0,) + self.dims)

    def get_config(self):
        return {**super().get_config(), "dims": list(self.dims)}


@registry.register()
class RepeatVector(Layer):
    def __init__(self, n: int, **kwargs: Any):
        super().__init__(**kwargs)
        self.n = int(n)

    def call(self, inputs):
        return shp.tile(shp.expand_dims(to_value(inputs), axis=[1]), reps=(1, self.n, 1))

    def get_config(self):
        return {**super().get_config(), "n": self.n}


@registry.register()
class Rescaling(Layer):
    supports_masking = True

    def __init__(self, scale: float, offset: float = 0.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.scale, self.offset = scale, offset

    def call(self, inputs):
        return ew.add(ew.mul(to_value(inputs), float(self.scale)), float(self.offset))

    def get_config(self):
        return {**super().get_config(), "scale": self.scale, "offset": self.offset}


@registry.register()
class Embedding(Layer):
    """Rows of ``embeddings`` (input_dim, output_dim) picked by integer indices."""

    def __init__(self, input_dim: int, output_dim: int, embeddings_initializer: Any = "uniform",
                 embeddings_regularizer: Any = None, embeddings_constraint: Any = None, mask_zero: bool = False,
                 **kwargs: Any):
        kwargs.pop("input_length", None)
        kwargs.pop("lora_rank", None)
        kwargs.pop("lora_alpha", None)
        super().__init__(**kwargs)
        self.input_dim, self.output_dim, self.mask_zero = int(input_dim), int(output_dim), bool(mask_zero)
        self.supports_masking = self.mask_zero
        init = "random_uniform" if embeddings_initializer == "uniform" else embeddings_initializer
        weight_args(self, "embeddings", init, embeddings_regularizer, embeddings_constraint)

    def build(self, input_shape):
        self.embeddings = make_weight(self, "embeddings", (self.input_dim, self.output_dim), "embeddings")
        self.built = True

    def call(self, inputs):
        x = to_value(inputs)
        if not x.dtype.is_int:
            x = ew.cast(x, dtype="int64")
        return nn.embedding(x, self.embeddings.value)

    def compute_mask(self, inputs, mask=None):
        """``ids != 0`` when ``mask_zero`` (id 0 is padding), else no mask."""
        if not self.mask_zero:
            return None
        return ew.ne(to_value(inputs), 0)

    def get_config(self):
        return {**super().get_config(), "input_dim": self.input_dim, "output_dim": self.output_dim,
                "mask_zero": self.mask_zero, **weight_config(self, "embeddings")}


@registry.register()
class Masking(Layer):
    """Masks time steps whose features all equal ``mask_value``: the mask is
    ``any(x != mask_value, axis=-1)`` and masked steps of the output are zero."""

    supports_masking = True

    def __init__(self, mask_value: float = 0.0, **kwargs: Any):
        super().__init__(**kwargs)
        self.mask_value = float(mask_value)

    def _keep(self, x: Value) -> Value:
        differs = ew.cast(ew.ne(x, self.mask_value), dtype=x.dtype)
        return ew.gt(red.max(differs, axis=[x.ndim - 1]), 0.0)

    def call(self, inputs):
        x = to_value(inputs)
        keep = shp.expand_dims(self._keep(x), axis=[x.ndim - 1])
        return ew.where(keep, x, 0.0)

    def compute_mask(self, inputs, mask=None):
        return self._keep(to_value(inputs))

    def get_config(self):
        return {**super().get_config(), "mask_value": self.mask_value}


def _broadcastable_mask(mask: Value, like: Value, layer_name: str) -> Value:
    """``mask`` as a bool Value that broadcasts against ``like`` (right-aligned, as Keras requires)."""
    if mask.ndim > like.ndim or any(m is not None and i is not None and m not in (1, i)
                                    for m, i in zip(reversed(mask.shape), reversed(like.shape))):
        raise GraphBuildError(f"layer {layer_name!r}: the mask of shape {tuple(mask.shape)} does not broadcast "
                              f"to the input of shape {tuple(like.shape)}")
    return mask if mask.dtype.name == "bool" else ew.gt(mask, 0.5)


def _large_negative(x: Value) -> float:
    """Keras' stand-in for minus infinity in masked softmax (half the dtype's range for float16)."""
    return -3e4 if x.dtype.name == "float16" else -1e9


@registry.register()
class Lambda(Layer):
    """An arbitrary function of the input tensors. From a file it loads only with ``safe_mode=False``."""

    def __init__(self, function: Any, output_shape: Any = None, mask: Any = None, arguments: Any = None,
                 **kwargs: Any):
        super().__init__(**kwargs)
        self.function = function
        self.output_shape_arg = output_shape
        self.arguments = arguments or {}
        self.mask = mask
        self.supports_masking = mask is not None

    def call(self, inputs):
        return self.function(inputs, **self.arguments)

    def compute_mask(self, inputs, mask=None):
        """Keras' ``mask=`` argument: a callable ``(inputs, mask) -> mask`` or a fixed mask."""
        if callable(self.mask):
            return self.mask(inputs, mask)
        return self.mask

    def get_config(self):
        config = {**super().get_config(), "output_shape": self.output_shape_arg, "arguments": self.arguments}
        code = marshal.dumps(self.function.__code__)
        config["function"] = {"class_name": "__lambda__", "config": {
            "code": base64.b64encode(code).decode("ascii"), "defaults": None, "closure": None}}
        return config

    @classmethod
    def from_config(cls, config: Dict[str, Any], safe_mode: bool = True) -> "Lambda":
        config = dict(config)
        fn = config.pop("function")
        if isinstance(fn, dict) and fn.get("class_name") == "__lambda__":
            if safe_mode is not False:
                raise KerasConfigError(
                    f"Lambda layer {config.get('name')!r} holds Python bytecode; loading it runs that code. "
                    "Pass safe_mode=False to load_model if you trust the file")
            fn = _function_from_bytecode(fn["config"]["code"])
        elif isinstance(fn, (list, tuple)):  # tf.keras 2: [code, defaults, closure]
            if safe_mode is not False:
                raise KerasConfigError(f"Lambda layer {config.get('name')!r} holds Python bytecode; pass "
                                       "safe_mode=False to load_model if you trust the file")
            fn = _function_from_bytecode(fn[0])
        config.pop("function_type", None)
        config.pop("module", None)
        config.pop("output_shape_type", None)
        config.pop("output_shape_module", None)
        return cls(fn, **config)


def _function_from_bytecode(code_b64: str):
    """A function from marshalled bytecode (only reached with safe_mode=False, on the user's say-so)."""
    raw = base64.b64decode(code_b64.encode("ascii") if isinstance(code_b64, str) else code_b64)
    try:
        code = marshal.loads(raw)
    except (ValueError, EOFError, TypeError) as exc:
        raise KerasConfigError(f"Lambda bytecode cannot be read by this Python ({exc}); "
                               "rebuild the Lambda layer in code") from None
    from .. import ops as keras_ops

    return types.FunctionType(code, {"__builtins__": __builtins__, "keras": _keras_namespace(), "ops": keras_ops})


def _keras_namespace():
    import cgvm.keras as keras  # the public alias: Lambda code written for keras finds keras.ops there

    return keras
