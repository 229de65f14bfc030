"""Recurrent layers on cgvm's ``scan``: SimpleRNN, LSTM and GRU with Keras' weight layouts and gate orders.

The input projection ``x @ kernel + bias`` is one matmul over the whole sequence outside the loop;
the scan body only does the recurrent part, with the recurrent kernel (and GRU's recurrent bias)
passed in as non-sequences so that BPTT gives their gradients. Gate blocks are Keras': LSTM
``i, f, c, o``; GRU ``z, r, h`` with ``h = z * h_prev + (1 - z) * candidate``.

Outputs follow Keras: the last output (or, with ``return_sequences``, all of them, reversed in
time when ``go_backwards``), then with ``return_state`` the final states (``h`` and for LSTM ``c``).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from ....errors import GraphBuildError
from ....ir.graph import Graph, Value, input_value
from ....ir.types import TensorType
from ....ops import control
from ....ops import elementwise as ew
from ....ops import indexing
from ....ops import linalg
from ....ops import shape as shp
from .. import activations
from .. import initializers as initializers_mod
from ..backend import to_value
from .base import Layer, registry
from .core import make_weight, weight_args, weight_config


def gate(v: Value, k: int, units: int) -> Value:
    """Column block ``k`` of width ``units`` of a (batch, n*units) value."""
    return indexing.slice(v, starts=[k * units], stops=[(k + 1) * units], axes=[v.ndim - 1])


class RNNBase(Layer):
    """Shared arguments, weights and the scan plumbing of the three recurrent layers."""

    n_gates = 1
    n_states = 1

    def __init__(self, units: int, activation: Any = "tanh", recurrent_activation: Any = "sigmoid",
                 use_bias: bool = True, kernel_initializer: Any = "glorot_uniform",
                 recurrent_initializer: Any = "orthogonal", bias_initializer: Any = "zeros",
                 kernel_regularizer: Any = None, recurrent_regularizer: Any = None, bias_regularizer: Any = None,
                 kernel_constraint: Any = None, recurrent_constraint: Any = None, bias_constraint: Any = None,
                 dropout: float = 0.0, recurrent_dropout: float = 0.0, return_sequences: bool = False,
                 return_state: bool = False, go_backwards: bool = False, stateful: bool = False,
                 unroll: bool = False, seed: Any = None, **kwargs: Any):
        for k in ("time_major", "implementation", "reset_after", "unit_forget_bias", "use_cudnn", "zero_output_for_mask"):
            kwargs.pop(k, None)
        super().__init__(**kwargs)
        self.units = int(units)
        self.activation = activations.get(activation)
        self.recurrent_activation = activations.get(recurrent_activation)
        self.use_bias = use_bias
        weight_args(self, "kernel", kernel_initializer, kernel_regularizer, kernel_constraint)
        weight_args(self, "recurrent", recurrent_initializer, recurrent_regularizer, recurrent_constraint)
        weight_args(self, "bias", bias_initializer, bias_regularizer, bias_constraint)
        self.dropout, self.recurrent_dropout = float(dropout), float(recurrent_dropout)
        self.return_sequences, self.return_state = return_sequences, return_state
        self.go_backwards, self.stateful, self.unroll, self.seed = go_backwards, stateful, unroll, seed
        if stateful:
            raise GraphBuildError(f"layer {self.name!r}: stateful recurrent layers are not supported")

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
        self.built = True

    # -- per layer: the input bias, the non-sequences and one step
    def input_bias(self) -> Optional[Value]:
        return self.bias.value if self.bias is not None else None

    def non_sequences(self) -> List[Value]:
        return [self.recurrent_kernel.value]

    def step(self, xw: Value, states: List[Value], params: List[Value]) -> List[Value]:
        raise GraphBuildError(f"{type(self).__name__} defines no step")

    def call(self, inputs, initial_state=None, training=False):
        x = to_value(inputs)
        if x.ndim != 3:
            raise GraphBuildError(f"layer {self.name!r} expects (batch, time, features), got {x.shape}")
        xw = linalg.matmul(x, self.kernel.value)
        b = self.input_bias()
        if b is not None:
            xw = ew.add(xw, b)
        xw_tm = shp.transpose(xw, perm=[1, 0, 2])
        if initial_state is not None:
            states = [to_value(s) for s in (initial_state if isinstance(initial_state, (list, tuple))
                                             else [initial_state])]
            if len(states) != self.n_states:
                raise GraphBuildError(f"layer {self.name!r} takes {self.n_states} initial states, got {len(states)}")
        else:
            first = shp.squeeze(indexing.slice(xw_tm, starts=[0], stops=[1], axes=[0]), axis=[0])
            zero = shp.zeros_like(gate(first, 0, self.units))
            states = [zero] * self.n_states
        params = self.non_sequences()
        step_in = input_value(TensorType(xw_tm.shape[1:], xw_tm.dtype), "xw_t")
        state_in = [input_value(TensorType((None, self.units), s.dtype), f"state{i}") for i, s in enumerate(states)]
        param_in = [input_value(p.type, f"param{i}") for i, p in enumerate(params)]
        new_states = self.step(step_in, state_in, param_in)
        body = Graph([step_in] + state_in + param_in, new_states, name=f"{self.name}_step")
        outs = control.scan(xw_tm, *states, *params, body=body, n_seqs=1, n_carry=self.n_states,
                            go_backwards=self.go_backwards)
        finals, stacked = list(outs[:self.n_states]), list(outs[self.n_states:2 * self.n_states])
        output = shp.transpose(stacked[0], perm=[1, 0, 2]) if self.return_sequences else finals[0]
        if self.return_state:
            return [output] + finals
        return output

    def get_config(self):
        return {**super().get_config(), "units": self.units, "activation": activations.serialize(self.activation),
                "recurrent_activation": activations.serialize(self.recurrent_activation),
                "use_bias": self.use_bias, **weight_config(self, "kernel", "recurrent", "bias"),
                "dropout": self.dropout, "recurrent_dropout": self.recurrent_dropout,
                "return_sequences": self.return_sequences, "return_state": self.return_state,
                "go_backwards": self.go_backwards, "stateful": self.stateful, "unroll": self.unroll}


@registry.register()
class SimpleRNN(RNNBase):
    """``h = activation(x @ kernel + h_prev @ recurrent_kernel + bias)``."""

    def __init__(self, units: int, activation: Any = "tanh", **kwargs: Any):
        kwargs.pop("recurrent_activation", None)
        super().__init__(units, activation=activation, **kwargs)

    def step(self, xw, states, params):
        return [self.activation(ew.add(xw, linalg.matmul(states[0], params[0])))]

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

    def step(self, xw, states, params):
        h, c = states
        u = self.units
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

    def step(self, xw, states, params):
        h = states[0]
        u = self.units
        rk = params[0]
        if self.reset_after:
            rec = linalg.matmul(h, rk)
            if len(params) > 1:
                rec = ew.add(rec, params[1])
            z = self.recurrent_activation(ew.add(gate(xw, 0, u), gate(rec, 0, u)))
            r = self.recurrent_activation(ew.add(gate(xw, 1, u), gate(rec, 1, u)))
            hh = self.activation(ew.add(gate(xw, 2, u), ew.mul(r, gate(rec, 2, u))))
        else:
            rec_zr = linalg.matmul(h, indexing.slice(rk, starts=[0], stops=[2 * u], axes=[1]))
            z = self.recurrent_activation(ew.add(gate(xw, 0, u), gate(rec_zr, 0, u)))
            r = self.recurrent_activation(ew.add(gate(xw, 1, u), gate(rec_zr, 1, u)))
            rk_h = indexing.slice(rk, starts=[2 * u], stops=[3 * u], axes=[1])
            hh = self.activation(ew.add(gate(xw, 2, u), linalg.matmul(ew.mul(r, h), rk_h)))
        # h = z * h_prev + (1 - z) * hh
        return [ew.add(ew.mul(z, h), ew.mul(ew.sub(1.0, z), hh))]

    def get_config(self):
        return {**super().get_config(), "reset_after": self.reset_after}
