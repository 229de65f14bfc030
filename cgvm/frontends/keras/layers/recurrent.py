"""Recurrent layers on cgvm's ``scan``: SimpleRNN, LSTM and GRU with Keras' weight layouts and gate orders.

The input projection ``x @ kernel + bias`` is one matmul over the whole sequence outside the loop;
the scan body only does the recurrent part, with the recurrent kernel (and GRU's recurrent bias)
passed in as non-sequences so that BPTT gives their gradients. Gate blocks are Keras': LSTM
``i, f, c, o``; GRU ``z, r, h`` with ``h = z * h_prev + (1 - z) * candidate``.

Outputs follow Keras: the last output (or, with ``return_sequences``, all of them, reversed in
time when ``go_backwards``), then with ``return_state`` the final states (``h`` and for LSTM ``c``).

Masks (Keras 3, verified against it): the (batch, time) mask is a second scan sequence; at a masked
step every state keeps its previous value and the step's output repeats the previous output (zeros
before the first valid step), or is zero with ``zero_output_for_mask`` (what Bidirectional sets when
it returns sequences). The output carries the mask on with ``return_sequences`` only.

Stateful (``stateful=True``, Keras 3): the batch size must be static; the layer keeps its final
states in workspace entries (not weights) that every call, in training, evaluation and prediction,
starts from and writes back; ``reset_state()`` / ``reset_states()`` zero them.

Dropout (training only): ``dropout`` multiplies the inputs and ``recurrent_dropout`` the previous
state by masks drawn once per call (one per sequence of the batch) and reused at every step, scaled
by 1/(1-rate). As in Keras, with ``recurrent_dropout`` LSTM and GRU draw a separate pair of masks
per gate; with ``dropout`` alone one input mask serves all gates.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from ....errors import GraphBuildError
from ....ir.graph import Graph, Value, input_value
from ....ir.types import TensorType
from ....ops import control
from ....ops import elementwise as ew
from ....ops import indexing
from ....ops import linalg
from ....ops import nn
from ....ops import join
from ....ops import shape as shp
from .. import activations
from .. import initializers as initializers_mod
from ..backend import Variable, current_scope, to_value
from .base import Layer, registry
from .core import make_weight, weight_args, weight_config


def gate(v: Value, k: int, units: int) -> Value:
    """Column block ``k`` of width ``units`` of a (batch, n*units) value."""
    return indexing.slice(v, starts=[k * units], stops=[(k + 1) * units], axes=[v.ndim - 1])


class RNNBase(Layer):
    """Shared arguments, weights and the scan plumbing of the three recurrent layers."""

    n_gates = 1
    n_states = 1
    supports_masking = True

    def __init__(self, units: int, activation: Any = "tanh", recurrent_activation: Any = "sigmoid",
                 use_bias: bool = True, kernel_initializer: Any = "glorot_uniform",
                 recurrent_initializer: Any = "orthogonal", bias_initializer: Any = "zeros",
                 kernel_regularizer: Any = None, recurrent_regularizer: Any = None, bias_regularizer: Any = None,
                 kernel_constraint: Any = None, recurrent_constraint: Any = None, bias_constraint: Any = None,
                 dropout: float = 0.0, recurrent_dropout: float = 0.0, return_sequences: bool = False,
                 return_state: bool = False, go_backwards: bool = False, stateful: bool = False,
                 unroll: bool = False, seed: Any = None, **kwargs: Any):
        zero_output_for_mask = bool(kwargs.pop("zero_output_for_mask", False))
        for k in ("time_major", "implementation", "reset_after", "unit_forget_bias", "use_cudnn"):
            kwargs.pop(k, None)
        super().__init__(**kwargs)
        self.units = int(units)
        self.activation = activations.get(activation)
        self.recurrent_activation = activations.get(recurrent_activation)
        self.use_bias = use_bias
        weight_args(self, "kernel", kernel_initializer, kernel_regularizer, kernel_constraint)
        weight_args(self, "recurrent", recurrent_initializer, recurrent_regularizer, recurrent_constraint)
        weight_args(self, "bias", bias_initializer, bias_regularizer, bias_constraint)
        # Keras clips the rates into [0, 1]
        self.dropout = min(1.0, max(0.0, float(dropout)))
        self.recurrent_dropout = min(1.0, max(0.0, float(recurrent_dropout)))
        self.zero_output_for_mask = zero_output_for_mask
        self.return_sequences, self.return_state = return_sequences, return_state
        self.go_backwards, self.stateful, self.unroll, self.seed = go_backwards, stateful, unroll, seed
        self.states: Optional[List[Variable]] = None   # stateful: the states carried from call to call

    def bias_shape(self) -> Tuple[int, ...]:
        return (self.n_gates * self.units,)

    def build(self, input_shape):
        if isinstance(input_shape, list):
            input_shape = input_shape[0]
        features = input_shape[-1]
        if features is None:
            raise GraphBuildError(f"layer {self.name!r}: the feature axis of its input must be known")
        g = self.n_gates * self.units
        self.kernel = make_weight(self, "kernel", (features, g), "kernel")
        self.recurrent_kernel = make_weight(self, "recurrent_kernel", (self.units, g), "recurrent")
        self.bias = make_weight(self, "bias", self.bias_shape(), "bias") if self.use_bias else None
        if self.stateful:
            self._build_states(input_shape[0])
        self.built = True

    # -- stateful (Keras 3): the final states of a call are the initial states of the next one
    def _build_states(self, batch_size: Optional[int]) -> None:
        if self.states is not None:
            self.reset_state()
            return
        if batch_size is None:
            raise ValueError(f"When using `stateful=True` in a RNN, the batch size must be static (layer "
                             f"{self.name!r}): give the model's Input a batch_size or batch_shape")
        # not weights (Keras keeps them out of get_weights too): workspace entries the programs read and update
        self.states = [Variable(np.zeros((int(batch_size), self.units), np.float32), name="rnn_state",
                                path=f"keras/{self.name}/rnn_state_{i}", trainable=False)
                       for i in range(self.n_states)]

    def reset_state(self) -> None:
        """Zero the carried states (a stateful layer starts its next call from zeros)."""
        for state in self.states or ():
            state.assign(np.zeros(state.shape, np.float32))

    def reset_states(self) -> None:
        """Keras' compatibility alias of ``reset_state``."""
        self.reset_state()

    # -- per layer: the input bias, the non-sequences and one step
    def input_bias(self) -> Optional[Value]:
        return self.bias.value if self.bias is not None else None

    def non_sequences(self) -> List[Value]:
        return [self.recurrent_kernel.value]

    def step(self, xw: Value, states: List[Value], params: List[Value],
             rec_masks: Optional[List[Value]] = None) -> List[Value]:
        """One time step: new states from the projected input ``xw`` and the previous states;
        ``rec_masks`` (training with recurrent dropout) multiply the previous output per gate."""
        raise GraphBuildError(f"{type(self).__name__} defines no step")

    def compute_mask(self, inputs, mask=None):
        """Keras: the input mask with ``return_sequences``, else none; no masks on returned states."""
        if isinstance(mask, (list, tuple)):
            mask = mask[0] if mask else None
        out_mask = mask if self.return_sequences else None
        if self.return_state:
            return [out_mask] + [None] * self.n_states
        return out_mask

    # -- dropout masks: one draw per call, reused at every step
    def _mask_count(self) -> int:
        """Input masks drawn: one per gate when recurrent dropout is on (Keras' implementation 1)."""
        return self.n_gates if self.recurrent_dropout > 0.0 else 1

    def _draw_masks(self, like: Value, rate: float, count: int) -> List[Value]:
        ones = shp.ones_like(like)
        masks = []
        for _ in range(count):
            seed = current_scope().next_seed()
            if seed is None:
                raise GraphBuildError(f"layer {self.name!r} uses dropout in training mode without a seed input; "
                                      "build training graphs through Model.fit / train_on_batch")
            masks.append(nn.dropout(ones, seed, ratio=rate))
        return masks

    def _project_inputs(self, x: Value, input_masks: Optional[List[Value]]) -> Value:
        """``x @ kernel + bias`` over the whole sequence, the inputs dropped out per gate if asked."""
        if not input_masks:
            xw = linalg.matmul(x, self.kernel.value)
        elif len(input_masks) == 1:
            xw = linalg.matmul(ew.mul(x, shp.expand_dims(input_masks[0], axis=[1])), self.kernel.value)
        else:
            xw = join.concat(*[linalg.matmul(ew.mul(x, shp.expand_dims(m, axis=[1])), gate(self.kernel.value, k,
                                                                                           self.units))
                              for k, m in enumerate(input_masks)], axis=-1)
        b = self.input_bias()
        return ew.add(xw, b) if b is not None else xw

    def call(self, inputs, initial_state=None, mask=None, training=False):
        x = to_value(inputs)
        if x.ndim != 3:
            raise GraphBuildError(f"layer {self.name!r} expects (batch, time, features), got {x.shape}")
        first_x = shp.squeeze(indexing.slice(x, starts=[0], stops=[1], axes=[1]), axis=[1])
        input_masks = rec_masks = None
        if training and 0.0 < self.dropout < 1.0:
            input_masks = self._draw_masks(first_x, self.dropout, self._mask_count())
        xw_tm = shp.transpose(self._project_inputs(x, input_masks), perm=[1, 0, 2])
        if initial_state is None and self.stateful and self.states is not None:
            batch = x.shape[0]
            if batch is not None and batch != self.states[0].shape[0]:
                raise ValueError(f"If an RNN is stateful, the batch size of the input sequences must be the same as "
                                 f"the batch size of the initial state (layer {self.name!r}): expected "
                                 f"{self.states[0].shape[0]}, received {batch}")
            initial_state = [state.value for state in self.states]
        if initial_state is not None:
            states = [to_value(s) for s in (initial_state if isinstance(initial_state, (list, tuple))
                                             else [initial_state])]
            if len(states) != self.n_states:
                raise GraphBuildError(f"layer {self.name!r} takes {self.n_states} initial states, got {len(states)}")
        else:
            first = shp.squeeze(indexing.slice(xw_tm, starts=[0], stops=[1], axes=[0]), axis=[0])
            zero = shp.zeros_like(gate(first, 0, self.units))
            states = [zero] * self.n_states
        if training and 0.0 < self.recurrent_dropout < 1.0:
            rec_masks = self._draw_masks(states[0], self.recurrent_dropout, self.n_gates
                                         if self.n_gates > 1 else 1)
        seqs = [xw_tm]
        carries = list(states)
        if mask is not None:
            m = to_value(mask)
            m = m if m.dtype.name == "bool" else ew.gt(m, 0.5)
            seqs.append(shp.transpose(m, perm=[1, 0]))
            carries.append(shp.zeros_like(states[0]))  # the previous output, zeros before the first step
        params = self.non_sequences() + list(rec_masks or [])
        body = self._step_graph(xw_tm, seqs, carries, params, len(rec_masks or []))
        outs = control.scan(*seqs, *carries, *params, body=body, n_seqs=len(seqs), n_carry=len(carries),
                            go_backwards=self.go_backwards)
        n = len(carries)
        finals, stacked = list(outs[:n]), list(outs[n:2 * n])
        if self.stateful and self.states is not None:
            for state, final in zip(self.states, finals[:self.n_states]):
                current_scope().state_updates[state.path] = (state.value, final)
        out_index = self.n_states if mask is not None else 0
        output = shp.transpose(stacked[out_index], perm=[1, 0, 2]) if self.return_sequences else finals[out_index]
        if self.return_state:
            return [output] + finals[:self.n_states]
        return output

    def _step_graph(self, xw_tm: Value, seqs: List[Value], carries: List[Value], params: List[Value],
                    n_rec_masks: int) -> Graph:
        """The scan body: ``(xw_t, [mask_t], states..., [prev_output], params...) -> (states..., [output])``."""
        step_in = input_value(TensorType(xw_tm.shape[1:], xw_tm.dtype), "xw_t")
        masked = len(seqs) > 1
        mask_in = [input_value(TensorType(seqs[1].shape[1:], seqs[1].dtype), "mask_t")] if masked else []
        carry_in = [input_value(TensorType((None, self.units), c.dtype), f"state{i}") for i, c in enumerate(carries)]
        param_in = [input_value(p.type, f"param{i}") for i, p in enumerate(params)]
        own = param_in[:len(param_in) - n_rec_masks]
        rec = param_in[len(param_in) - n_rec_masks:] if n_rec_masks else None
        state_in = carry_in[:self.n_states]
        new_states = self.step(step_in, state_in, own, rec)
        if masked:
            keep = shp.expand_dims(mask_in[0], axis=[1])
            prev_out = carry_in[self.n_states]
            masked_out = shp.zeros_like(prev_out) if self.zero_output_for_mask else prev_out
            output = ew.where(keep, new_states[0], masked_out)
            new_states = [ew.where(keep, n, s) for n, s in zip(new_states, state_in)] + [output]
        return Graph([step_in] + mask_in + carry_in + param_in, new_states, name=f"{self.name}_step")

    def get_config(self):
        return {**super().get_config(), "units": self.units, "activation": activations.serialize(self.activation),
                "recurrent_activation": activations.serialize(self.recurrent_activation),
                "use_bias": self.use_bias, **weight_config(self, "kernel", "recurrent", "bias"),
                "dropout": self.dropout, "recurrent_dropout": self.recurrent_dropout,
                "return_sequences": self.return_sequences, "return_state": self.return_state,
                "go_backwards": self.go_backwards, "stateful": self.stateful, "unroll": self.unroll,
                "zero_output_for_mask": self.zero_output_for_mask}


@registry.register()
class SimpleRNN(RNNBase):
    """``h = activation(x @ kernel + h_prev @ recurrent_kernel + bias)``."""

    def __init__(self, units: int, activation: Any = "tanh", **kwargs: Any):
        kwargs.pop("recurrent_activation", None)
        super().__init__(units, activation=activation, **kwargs)

    def step(self, xw, states, params, rec_masks=None):
        h = states[0] if not rec_masks else ew.mul(states[0], rec_masks[0])
        return [self.activation(ew.add(xw, linalg.matmul(h, params[0])))]

    def get_config(self):
        config = super().get_config()
        config.pop("recurrent_activation")
        return config


@registry.register()
class LSTM(RNNBase):
    """Gates i, f, c, o; ``unit_forget_bias`` starts the forget-gate bias at one."""

    n_gates = 4
    n_states = 2

    def __init__(self, units: int, unit_forget_bias: bool = True, **kwargs: Any):
        super().__init__(units, **kwargs)
        self.unit_forget_bias = unit_forget_bias

    def build(self, input_shape):
        if self.unit_forget_bias and self.use_bias:
            base, u = self.bias_initializer, self.units

            class ForgetBias(initializers_mod.Initializer):
                def draw(self, shape):
                    import numpy as np

                    b = np.asarray(base(shape))
                    b[u:2 * u] = 1.0
                    return b
            saved, self.bias_initializer = self.bias_initializer, ForgetBias()
            super().build(input_shape)
            self.bias_initializer = saved
        else:
            super().build(input_shape)

    def step(self, xw, states, params, rec_masks=None):
        h, c = states
        u = self.units
        if rec_masks:  # each gate sees the previous output through its own dropout mask
            z = join.concat(*[linalg.matmul(ew.mul(h, m), gate(params[0], k, u)) for k, m in enumerate(rec_masks)],
                           axis=-1)
            z = ew.add(xw, z)
        else:
            z = ew.add(xw, linalg.matmul(h, params[0]))
        i = self.recurrent_activation(gate(z, 0, u))
        f = self.recurrent_activation(gate(z, 1, u))
        c_new = ew.add(ew.mul(f, c), ew.mul(i, self.activation(gate(z, 2, u))))
        o = self.recurrent_activation(gate(z, 3, u))
        return [ew.mul(o, self.activation(c_new)), c_new]

    def get_config(self):
        return {**super().get_config(), "unit_forget_bias": self.unit_forget_bias}


@registry.register()
class GRU(RNNBase):
    """Gates z, r, h. ``reset_after`` (default, as cuDNN) applies the reset gate after the recurrent
    matmul and keeps two bias rows (input, recurrent)."""

    n_gates = 3
    n_states = 1

    def __init__(self, units: int, reset_after: bool = True, **kwargs: Any):
        super().__init__(units, **kwargs)
        self.reset_after = reset_after

    def bias_shape(self):
        return (2, 3 * self.units) if self.reset_after else (3 * self.units,)

    def _bias_row(self, row: int) -> Value:
        return shp.squeeze(indexing.slice(self.bias.value, starts=[row], stops=[row + 1], axes=[0]), axis=[0])

    def input_bias(self):
        if self.bias is None:
            return None
        return self._bias_row(0) if self.reset_after else self.bias.value

    def non_sequences(self):
        params = [self.recurrent_kernel.value]
        if self.reset_after and self.bias is not None:
            params.append(self._bias_row(1))
        return params

    def step(self, xw, states, params, rec_masks=None):
        h = states[0]
        u = self.units
        rk = params[0]
        # the previous output as gate k sees it (its own recurrent dropout mask, if any)
        h_for = [ew.mul(h, m) for m in rec_masks] if rec_masks else [h, h, h]
        if self.reset_after and rec_masks:
            rec = join.concat(*[linalg.matmul(h_for[k], gate(rk, k, u)) for k in range(3)], axis=-1)
            if len(params) > 1:
                rec = ew.add(rec, params[1])
            z = self.recurrent_activation(ew.add(gate(xw, 0, u), gate(rec, 0, u)))
            r = self.recurrent_activation(ew.add(gate(xw, 1, u), gate(rec, 1, u)))
            hh = self.activation(ew.add(gate(xw, 2, u), ew.mul(r, gate(rec, 2, u))))
        elif self.reset_after:
            rec = linalg.matmul(h, rk)
            if len(params) > 1:
                rec = ew.add(rec, params[1])
            z = self.recurrent_activation(ew.add(gate(xw, 0, u), gate(rec, 0, u)))
            r = self.recurrent_activation(ew.add(gate(xw, 1, u), gate(rec, 1, u)))
            hh = self.activation(ew.add(gate(xw, 2, u), ew.mul(r, gate(rec, 2, u))))
        else:
            if rec_masks:
                rec_z, rec_r = linalg.matmul(h_for[0], gate(rk, 0, u)), linalg.matmul(h_for[1], gate(rk, 1, u))
            else:
                rec_zr = linalg.matmul(h, indexing.slice(rk, starts=[0], stops=[2 * u], axes=[1]))
                rec_z, rec_r = gate(rec_zr, 0, u), gate(rec_zr, 1, u)
            z = self.recurrent_activation(ew.add(gate(xw, 0, u), rec_z))
            r = self.recurrent_activation(ew.add(gate(xw, 1, u), rec_r))
            hh = self.activation(ew.add(gate(xw, 2, u), linalg.matmul(ew.mul(r, h_for[2]), gate(rk, 2, u))))
        # h = z * h_prev + (1 - z) * hh
        return [ew.add(ew.mul(z, h), ew.mul(ew.sub(1.0, z), hh))]

    def get_config(self):
        return {**super().get_config(), "reset_after": self.reset_after}
