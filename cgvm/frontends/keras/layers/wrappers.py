"""Layer wrappers: Bidirectional (a forward and a go_backwards copy of a recurrent layer) and TimeDistributed.

Both pass masks on as Keras 3 does: Bidirectional hands the mask to both directions (the backward
one reads it reversed, inside its scan) and, when returning sequences, makes both output zeros at
masked steps; TimeDistributed keeps the (batch, time) mask of its input for its output.
"""
from __future__ import annotations

from typing import Any, Optional

from ....errors import GraphBuildError
from ....ops import elementwise as ew
from ....ops import indexing
from ....ops import join
from ....ops import shape as shp
from ..backend import KerasTensor, inside_call, to_value
from .base import Layer, registry


def layer_from_config(config: Any) -> Layer:
    from ..model_config import deserialize_layer

    return config if isinstance(config, Layer) else deserialize_layer(config)


def _copy_layer(layer: Layer, **overrides: Any) -> Layer:
    config = layer.get_config()
    config.update(overrides)
    return type(layer).from_config(config)


@registry.register()
class Bidirectional(Layer):
    """Runs ``layer`` forwards and a copy backwards; outputs merged by ``merge_mode``. Weights: forward, backward."""

    supports_masking = True

    def __init__(self, layer: Any, merge_mode: Optional[str] = "concat", weights: Any = None,
                 backward_layer: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        layer = layer_from_config(layer)
        self.merge_mode = merge_mode
        self.forward_layer = _copy_layer(layer, name="forward_" + layer.name)
        if backward_layer is None:
            self.backward_layer = _copy_layer(layer, name="backward_" + layer.name, go_backwards=not layer.go_backwards)
        else:
            self.backward_layer = layer_from_config(backward_layer)
        self.return_sequences = layer.return_sequences
        self.return_state = layer.return_state
        self._layer_config = layer
        for inner in (self.forward_layer, self.backward_layer):
            if hasattr(inner, "zero_output_for_mask"):  # Keras forces this for masked sequence outputs
                inner.zero_output_for_mask = inner.return_sequences

    def build(self, input_shape):
        for inner in (self.forward_layer, self.backward_layer):
            if not inner.built:
                inner.build(input_shape)
                inner.built = True
        self.built = True

    def compute_mask(self, inputs, mask=None):
        """Keras: the input mask on each sequence output (none otherwise), none on the states."""
        if isinstance(mask, (list, tuple)):
            mask = mask[0] if mask else None
        if self.return_sequences:
            out_mask = [mask, mask] if self.merge_mode is None else mask
        else:
            out_mask = [None, None] if self.merge_mode is None else None
        if self.return_state:
            n_states = 2 * getattr(self.forward_layer, "n_states", 1)
            return (out_mask if isinstance(out_mask, list) else [out_mask]) + [None] * n_states
        return out_mask

    def call(self, inputs, initial_state=None, mask=None, training=False):
        fw_state = bw_state = None
        if initial_state is not None:
            half = len(initial_state) // 2
            fw_state, bw_state = initial_state[:half], initial_state[half:]
        with inside_call():
            fw = self.forward_layer._run((inputs,), {"initial_state": fw_state, "mask": mask, "training": training})
            bw = self.backward_layer._run((inputs,), {"initial_state": bw_state, "mask": mask, "training": training})
        fw_states = bw_states = []
        if self.return_state:
            fw, fw_states = fw[0], fw[1:]
            bw, bw_states = bw[0], bw[1:]
        y_f, y_b = to_value(fw), to_value(bw)
        if self.return_sequences:
            y_b = indexing.slice(y_b, steps=[-1], axes=[1])  # back into forward time order
        if self.merge_mode == "concat":
            out = join.concat(y_f, y_b, axis=-1)
        elif self.merge_mode == "sum":
            out = ew.add(y_f, y_b)
        elif self.merge_mode == "mul":
            out = ew.mul(y_f, y_b)
        elif self.merge_mode == "ave":
            out = ew.mul(ew.add(y_f, y_b), 0.5)
        elif self.merge_mode is None:
            out = [y_f, y_b]
        else:
            raise GraphBuildError(f"Bidirectional {self.name!r}: unknown merge_mode {self.merge_mode!r}")
        if self.return_state:
            outs = out if isinstance(out, list) else [out]
            return outs + list(fw_states) + list(bw_states)
        return out

    def get_config(self):
        from ..model_config import serialize_layer

        inner = self._layer_config
        return {**super().get_config(), "merge_mode": self.merge_mode, "layer": serialize_layer(inner),
                "backward_layer": serialize_layer(self.backward_layer)}


@registry.register()
class TimeDistributed(Layer):
    """Applies ``layer`` to every time step: (batch, time, ...) runs as (batch*time, ...)."""

    supports_masking = True

    def __init__(self, layer: Any, **kwargs: Any):
        super().__init__(**kwargs)
        self.layer = layer_from_config(layer)

    def call(self, inputs, training=False, mask=None):
        x = to_value(inputs)
        steps = x.shape[1]
        if steps is None:
            raise GraphBuildError(f"TimeDistributed {self.name!r} needs a known number of time steps")
        if mask is not None and "mask" in self.layer._call_params():
            return self._per_step(x, to_value(mask), training, steps)
        merged = shp.reshape(x, shape=(-1,) + tuple(x.shape[2:]))
        with inside_call():
            y = to_value(self.layer._run((KerasTensor(merged),), {"training": training}))
        return shp.reshape(y, shape=(-1, steps) + tuple(y.shape[1:]))

    def _per_step(self, x, mask, training, steps):
        """As Keras 3 with a mask: the wrapped layer runs once per step on (batch, ...) with that
        step's mask (batch, ...), and the step outputs are stacked on axis 1."""
        if mask.ndim < 2 or (mask.shape[1] is not None and mask.shape[1] != steps):
            raise ValueError(f"TimeDistributed {self.name!r}: the mask of shape {tuple(mask.shape)} does not have "
                             f"the input's (batch, {steps}) leading axes")
        outputs = []
        for step in range(steps):
            x_t = shp.squeeze(indexing.slice(x, starts=[step], stops=[step + 1], axes=[1]), axis=[1])
            m_t = shp.squeeze(indexing.slice(mask, starts=[step], stops=[step + 1], axes=[1]), axis=[1])
            with inside_call():
                outputs.append(to_value(self.layer._run((KerasTensor(x_t),), {"training": training, "mask": m_t})))
        return join.stack(*outputs, axis=1)

    def get_config(self):
        from ..model_config import serialize_layer

        return {**super().get_config(), "layer": serialize_layer(self.layer)}
