"""Recurrent and selection layers: LSTM, RNN, LSTMUnit and Filter, with BVLC Caffe's semantics.

Caffe builds LSTM and RNN by unrolling an internal net over T time steps. Here each becomes one
``scan`` over the time axis, so backpropagation through time comes from scan's gradient rule.
As in Caffe's unrolled net, the input projection ``W x_t + b`` of every step (and the static
input's projection, shared by all steps) is one matrix product outside the loop.

Bottoms: x (T, N, ...), cont (T, N) with 0 where a sequence starts (the carried state is
multiplied by cont_t, so it is reset there), optional x_static (N, ...), and with
``expose_hidden`` the initial states (RNN: h_0; LSTM: h_0, c_0, each (1, N, num_output)), which
then also come out as extra tops (h_T [, c_T]). ``cont`` receives no gradient (Caffe refuses to
backpropagate to sequence indicators).

Without ``expose_hidden`` the states are carried between forwards, as Caffe's RecurrentLayer
does: each forward starts from the final states of the previous forward of the layer (zeros after
setup and whenever the batch size changes), so with cont = 1 at t = 0 a batch continues the
previous one (truncated backpropagation through time across batches), and cont = 0 starts afresh.
The net keeps them as workspace entries (``LayerContext.carried_state``) in TRAIN and TEST alike;
backward differentiates from the initial states the forward used, and no gradient crosses
batches.

LSTM gate order in the 4H pre-activations is Caffe's: i, f, o, g.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.layers.base import LayerContext, count, need_bottoms, register
from cgvm.ir import Graph, TensorType, Value, input_value
from cgvm.ops import control, linalg
from cgvm.ops import elementwise as ew
from cgvm.ops import elementwise_math as em
from cgvm.ops import grad_control
from cgvm.ops import indexing as ix
from cgvm.ops import selection
from cgvm.ops import shape as shp


def _filler(param, field: str) -> Optional[caffe_pb2.FillerParameter]:
    return getattr(param, field) if param.HasField(field) else None


def _known(shape: Sequence, what: str, ctx: LayerContext) -> Tuple[int, ...]:
    if any(d is None for d in shape):
        raise ctx.error(f"{what} must have a known shape, got {tuple(shape)}")
    return tuple(int(d) for d in shape)


def _gate(gates: Value, k: int, hidden: int) -> Value:
    """Gate k (0 = i, 1 = f, 2 = o, 3 = g in Caffe's order) of (..., 4H) pre-activations."""
    return ix.slice(gates, starts=[k * hidden], stops=[(k + 1) * hidden], axes=[gates.ndim - 1])


def lstm_unit(c_prev: Value, gates: Value, cont: Value, hidden: int) -> Tuple[Value, Value]:
    """Caffe's LSTMUnit: (c_t, h_t) from c_{t-1}, the 4H gate pre-activations and cont (broadcast).

    i, o = sigmoid; f = cont * sigmoid (0 where cont is 0, so the cell state resets); g = tanh;
    c_t = f * c_{t-1} + i * g; h_t = o * tanh(c_t).
    """
    i = em.sigmoid(_gate(gates, 0, hidden))
    f = ew.mul(cont, em.sigmoid(_gate(gates, 1, hidden)))
    o = em.sigmoid(_gate(gates, 2, hidden))
    g = em.tanh(_gate(gates, 3, hidden))
    c = ew.add(ew.mul(f, c_prev), ew.mul(i, g))
    return c, ew.mul(o, em.tanh(c))


class _Recurrent:
    """What LSTM and RNN share: bottoms checked and split, the input projection, the initial states."""

    def __init__(self, layer: caffe_pb2.LayerParameter, bottoms: List[Value], ctx: LayerContext,
                 n_states: int, gates: int):
        param = layer.recurrent_param
        if param.num_output <= 0:
            raise ctx.error("recurrent_param.num_output must be given and positive")
        self.ctx, self.param = ctx, param
        self.hidden = int(param.num_output)
        self.expose = bool(param.expose_hidden)
        exposed = n_states if self.expose else 0
        need_bottoms(bottoms, (2 + exposed, 3 + exposed), ctx)
        self.static = len(bottoms) == 3 + exposed
        x, cont = bottoms[0], bottoms[1]
        if x.ndim < 2:
            raise ctx.error(f"bottom[0] (x) must be T x N x ..., got shape {tuple(x.shape)}")
        x_shape = _known(x.shape, "bottom[0] (x)", ctx)
        self.steps, self.batch = x_shape[0], x_shape[1]
        if tuple(cont.shape) != (self.steps, self.batch):
            raise ctx.error(f"bottom[1] (cont) must be T x N = {(self.steps, self.batch)}, got {tuple(cont.shape)}")
        self.x, self.dtype = x, x.dtype
        self.features = count(x_shape, 2)
        # cont gates the state but is an indicator: no gradient reaches it (Caffe's AllowForceBackward)
        self.cont = shp.reshape(grad_control.stop_gradient(cont), shape=(self.steps, self.batch, 1))
        self.x_static: Optional[Value] = None
        if self.static:
            xs = bottoms[2]
            xs_shape = _known(xs.shape, "bottom[2] (x_static)", ctx)
            if not xs_shape or xs_shape[0] != self.batch:
                raise ctx.error(f"bottom[2] (x_static) must be N x ... with N = {self.batch}, got {xs_shape}")
            self.x_static = shp.reshape(xs, shape=(self.batch, count(xs_shape, 1)))
        self.initial_bottoms = bottoms[3 if self.static else 2:]
        self.carried_finals: List[Value] = []   # where the final states go without expose_hidden
        self.width = gates * self.hidden

    def state_shape(self) -> Tuple[int, int, int]:
        return (1, self.batch, self.hidden)

    def projected_input(self, weight: Value, bias: Value, static_weight: Optional[Value]) -> Value:
        """W x_t + b (+ W_static x_static) for every step at once: (T, N, width)."""
        flat = shp.reshape(self.x, shape=(self.steps * self.batch, self.features))
        projected = shp.reshape(linalg.gemm(flat, weight, bias, trans_b=True),
                                shape=(self.steps, self.batch, self.width))
        if static_weight is not None:
            projected = ew.add(projected, linalg.gemm(self.x_static, static_weight, trans_b=True))
        return projected

    def weights(self) -> Tuple[Value, Value, Optional[Value], int]:
        """The input weight (width, I), its bias, the static weight if any, and the next blob index."""
        weight = self.ctx.param(0, (self.width, self.features), _filler(self.param, "weight_filler"))
        bias = self.ctx.param(1, (self.width,), _filler(self.param, "bias_filler"))
        static = None
        if self.x_static is not None:
            static = self.ctx.param(2, (self.width, int(self.x_static.shape[1])),
                                    _filler(self.param, "weight_filler"))
        return weight, bias, static, 3 if static is not None else 2

    def initial_states(self, names: Sequence[str]) -> List[Value]:
        """The (N, H) states at t = 0 of the states ``names`` ("h", "c"): the exposed bottoms, else
        the final states of this layer's previous forward."""
        if not self.expose:
            states = []
            for name in names:
                initial, final = self.ctx.carried_state(name, (self.batch, self.hidden), self.dtype)
                self.carried_finals.append(final)
                states.append(initial)
            return states
        states = []
        for name, value in zip(names, self.initial_bottoms):
            if tuple(value.shape) != self.state_shape():
                raise self.ctx.error(f"the {name}_0 bottom must have shape {self.state_shape()} (1 x N x "
                                     f"num_output), got {tuple(value.shape)}")
            states.append(shp.reshape(value, shape=(self.batch, self.hidden)))
        return states

    def step_inputs(self, sequences: Sequence[Value], n_states: int, params: Sequence[Value]):
        """Fresh body inputs: one step of each sequence, the states, the loop-invariant params."""
        seq_in = [input_value(TensorType(s.shape[1:], s.dtype), f"seq{k}") for k, s in enumerate(sequences)]
        state_in = [input_value(TensorType((self.batch, self.hidden), self.dtype), f"state{k}")
                    for k in range(n_states)]
        param_in = [input_value(p.type, f"param{k}") for k, p in enumerate(params)]
        return seq_in, state_in, param_in

    def final_tops(self, finals: Sequence[Value]) -> List[Value]:
        """The exposed final states as (1, N, H) tops; without expose_hidden none, and the final
        states are kept for the next forward instead."""
        if self.expose:
            return [shp.reshape(f, shape=self.state_shape()) for f in finals]
        for target, final in zip(self.carried_finals, finals):
            self.ctx.update_state(target, final)
        return []


@register("LSTM")
def lstm(layer, bottoms, ctx):
    """Caffe's LSTM. Blobs: W_xc (4H, I), b_c (4H), [W_xc_static (4H, I_static)], W_hc (4H, H).

    gates_t = W_xc x_t + b_c [+ W_xc_static x_static] + W_hc (cont_t h_{t-1}), then LSTMUnit.
    Tops: h (T, N, H) [, h_T, c_T with expose_hidden].
    """
    rec = _Recurrent(layer, bottoms, ctx, n_states=2, gates=4)
    weight, bias, static, index = rec.weights()
    recurrent_weight = ctx.param(index, (rec.width, rec.hidden), _filler(rec.param, "weight_filler"))
    projected = rec.projected_input(weight, bias, static)
    h0, c0 = rec.initial_states(["h", "c"])

    (gx_t, cont_t), (h_prev, c_prev), (w_hc,) = rec.step_inputs([projected, rec.cont], 2, [recurrent_weight])
    gates = ew.add(gx_t, linalg.gemm(ew.mul(cont_t, h_prev), w_hc, trans_b=True))
    c_t, h_t = lstm_unit(c_prev, gates, cont_t, rec.hidden)
    body = Graph([gx_t, cont_t, h_prev, c_prev, w_hc], [h_t, c_t], name=f"{layer.name or 'lstm'}_step")
    h_final, c_final, h_all, _ = control.scan(projected, rec.cont, h0, c0, recurrent_weight, body=body,
                                              n_seqs=2, n_carry=2)
    return [h_all] + rec.final_tops([h_final, c_final])


@register("RNN")
def rnn(layer, bottoms, ctx):
    """Caffe's simple RNN. Blobs: W_xh (H, I), b_h (H), [W_xh_static], W_hh (H, H), W_ho (H, H), b_o (H).

    h_t = tanh(W_hh (cont_t h_{t-1}) + W_xh x_t + b_h [+ W_xh_static x_static]); o_t = tanh(W_ho h_t + b_o).
    Tops: o (T, N, H) [, h_T with expose_hidden].
    """
    rec = _Recurrent(layer, bottoms, ctx, n_states=1, gates=1)
    weight, bias, static, index = rec.weights()
    filler = _filler(rec.param, "weight_filler")
    w_hh = ctx.param(index, (rec.hidden, rec.hidden), filler)
    w_ho = ctx.param(index + 1, (rec.hidden, rec.hidden), filler)
    b_o = ctx.param(index + 2, (rec.hidden,), _filler(rec.param, "bias_filler"))
    projected = rec.projected_input(weight, bias, static)
    (h0,) = rec.initial_states(["h"])

    (gx_t, cont_t), (h_prev,), (w_hh_in,) = rec.step_inputs([projected, rec.cont], 1, [w_hh])
    h_t = em.tanh(ew.add(gx_t, linalg.gemm(ew.mul(cont_t, h_prev), w_hh_in, trans_b=True)))
    body = Graph([gx_t, cont_t, h_prev, w_hh_in], [h_t], name=f"{layer.name or 'rnn'}_step")
    h_final, h_all = control.scan(projected, rec.cont, h0, w_hh, body=body, n_seqs=2, n_carry=1)
    # the output projection does not feed the recurrence: one product over all steps, outside the loop
    flat = shp.reshape(h_all, shape=(rec.steps * rec.batch, rec.hidden))
    o = em.tanh(linalg.gemm(flat, w_ho, b_o, trans_b=True))
    return [shp.reshape(o, shape=(rec.steps, rec.batch, rec.hidden))] + rec.final_tops([h_final])


@register("LSTMUnit")
def lstm_unit_layer(layer, bottoms, ctx):
    """One LSTM step. Bottoms: c_{t-1} (1, N, H), gate pre-activations (1, N, 4H), cont (1, N).
    Tops: c_t, h_t (1, N, H each). No gradient reaches cont."""
    need_bottoms(bottoms, (3,), ctx)
    c_prev, gates, cont = bottoms
    if c_prev.ndim != 3 or c_prev.shape[0] != 1:
        raise ctx.error(f"bottom[0] (c_prev) must be 1 x N x H, got shape {tuple(c_prev.shape)}")
    _, batch, hidden = _known(c_prev.shape, "bottom[0] (c_prev)", ctx)
    if tuple(gates.shape) != (1, batch, 4 * hidden):
        raise ctx.error(f"bottom[1] (gates) must be 1 x N x 4H = {(1, batch, 4 * hidden)}, got {tuple(gates.shape)}")
    if tuple(cont.shape) != (1, batch):
        raise ctx.error(f"bottom[2] (cont) must be 1 x N = {(1, batch)}, got {tuple(cont.shape)}")
    cont = shp.reshape(grad_control.stop_gradient(cont), shape=(1, batch, 1))
    c, h = lstm_unit(c_prev, gates, cont, hidden)
    return [c, h]


@register("Filter")
def filter_layer(layer, bottoms, ctx):
    """Keep the items (axis 0) of every bottom but the last whose selector (the last bottom) is nonzero.

    The selector is N or N x 1 x ... x 1 and gets no gradient; the tops' first dimension is only
    known at run time.
    """
    if len(bottoms) < 2:
        raise ctx.error(f"Filter takes at least 2 bottoms (data..., selector), got {len(bottoms)}")
    selector = bottoms[-1]
    if selector.ndim < 1 or any(d != 1 for d in selector.shape[1:]):
        raise ctx.error(f"the selector (last bottom) must be N or N x 1 x ... x 1, got {tuple(selector.shape)}")
    rows = selector.shape[0]
    for k, b in enumerate(bottoms[:-1]):
        if b.ndim < 1 or b.shape[0] != rows:
            raise ctx.error(f"bottom[{k}] of shape {tuple(b.shape)} must have the selector's {rows} items on axis 0")
    flat = selector if selector.ndim == 1 else shp.reshape(selector, shape=(rows,))
    return [selection.filter_rows(b, flat) for b in bottoms[:-1]]
