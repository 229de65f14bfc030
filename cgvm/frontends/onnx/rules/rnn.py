"""Recurrent ONNX ops: LSTM, GRU and RNN, unrolled over their (known) sequence length into matmuls
and activations, both directions, peepholes, clip, sequence_lens (forward), layout 0 and 1."""
from __future__ import annotations

import numpy as np

from cgvm.ir.graph import const_value
from cgvm.ops import elementwise as E
from cgvm.ops import indexing as I
from cgvm.ops import join as J
from cgvm.ops import linalg as L
from cgvm.ops import shape as shp

from ..translate import rule
from .common import const

_ACT = {"Sigmoid": E.sigmoid, "Tanh": E.tanh, "Relu": E.relu}


def _act(name, alpha=None, beta=None):
    if name in _ACT:
        return _ACT[name]
    if name == "LeakyRelu":
        return lambda x: E.relu(x, negative_slope=alpha if alpha is not None else 0.01)
    if name == "HardSigmoid":
        a, b = (alpha if alpha is not None else 0.2), (beta if beta is not None else 0.5)
        return lambda x: E.minimum(E.maximum(E.add(E.mul(x, const(a, x)), const(b, x)), const(0, x)), const(1, x))
    if name == "Affine":
        return lambda x: E.add(E.mul(x, const(alpha, x)), const(beta, x))
    if name == "ScaledTanh":
        return lambda x: E.mul(const(alpha, x), E.tanh(E.mul(x, const(beta, x))))
    if name == "Elu":
        return lambda x: E.elu(x, alpha=alpha if alpha is not None else 1.0)
    if name == "Softsign":
        return lambda x: E.div(x, E.add(E.abs(x), const(1, x)))
    if name == "Softplus":
        return E.softplus
    raise ValueError(f"activation {name!r} is not supported")


def _take(v, axis, i):
    return shp.squeeze(I.slice(v, starts=(i,), stops=(i + 1,), steps=(1,), axes=(axis,)), axis=(axis,))


def _rows(v, start, stop):
    return I.slice(v, starts=(start,), stops=(stop,), steps=(1,), axes=(0,))


class _Setup:
    def __init__(self, n, n_gates, default_acts):
        self.n = n
        x = n.input(0)
        self.layout = int(n.attr("layout", 0))
        if self.layout:
            x = shp.transpose(x, perm=(1, 0, 2))
        self.x = x
        self.seq, self.batch = x.shape[0], x.shape[1]
        if self.seq is None or self.batch is None:
            raise n.error("the sequence length and batch size must be known")
        self.hidden = int(n.attr("hidden_size"))
        direction = n.attr("direction", "forward")
        self.dirs = ["reverse"] if direction == "reverse" else (["forward", "reverse"] if direction == "bidirectional"
                                                                 else ["forward"])
        names = n.attr("activations") or default_acts * len(self.dirs)
        alphas = list(n.attr("activation_alpha") or [])
        betas = list(n.attr("activation_beta") or [])
        self.acts = []
        k = 0
        for name in names:
            self.acts.append(_act(name, alphas[k] if k < len(alphas) else None, betas[k] if k < len(betas) else None))
            k += 1
        self.clip = n.attr("clip")
        self.w, self.r = n.input(1), n.input(2)
        self.b = n.inputs[3] if n.has_input(3) else None
        lens = n.static(4) if n.has_input(4) else None
        if n.has_input(4) and lens is None:
            raise n.error("sequence_lens must be known when the model is translated")
        self.lens = None if lens is None or np.all(np.asarray(lens) == self.seq) else np.asarray(lens)
        if self.lens is not None and "reverse" in self.dirs:
            raise n.error("sequence_lens shorter than the sequence with a reverse direction is not supported")
        self.n_gates = n_gates

    def initial(self, i, d):
        n = self.n
        if not n.has_input(i):
            return const_value(np.zeros((self.batch, self.hidden), self.x.dtype.np))
        v = n.input(i)
        if self.layout:
            v = shp.transpose(v, perm=(1, 0, 2))
        return _take(v, 0, d)

    def clipped(self, v):
        if self.clip is None:
            return v
        c = float(self.clip)
        return E.minimum(E.maximum(v, const(-c, v)), const(c, v))

    def mask(self, t):
        if self.lens is None:
            return None
        return const_value((t < self.lens).reshape(-1, 1))

    def step_output(self, t, h_new, h):
        """(Y row, next state) of step ``t``: past a sequence's length, Y is zeros and the state is kept."""
        m = self.mask(t)
        zeros = const_value(np.zeros((self.batch, self.hidden), self.x.dtype.np))
        return _masked(m, h_new, zeros), _masked(m, h_new, h)

    def finish(self, ys_per_dir, finals):
        """Y (seq, dirs, batch, H) and the final states (dirs, batch, H), in the node's layout."""
        per_step = [J.stack(*[ys[t] for ys in ys_per_dir], axis=0) for t in range(self.seq)]
        y = J.stack(*per_step, axis=0)
        outs = [y]
        for f in finals:
            outs.append(J.stack(*f, axis=0))
        if self.layout:
            outs[0] = shp.transpose(outs[0], perm=(2, 0, 1, 3))
            outs[1:] = [shp.transpose(o, perm=(1, 0, 2)) for o in outs[1:]]
        return outs


def _masked(mask, new, old):
    return new if mask is None else E.where(mask, new, old)


@rule("LSTM")
def _lstm(n):
    s = _Setup(n, 4, ["Sigmoid", "Tanh", "Tanh"])
    H = s.hidden
    p = n.inputs[7] if n.has_input(7) else None
    couple = bool(n.attr("input_forget", 0))
    ys_all, hs, cs = [], [], []
    for d, direction in enumerate(s.dirs):
        f_act, g_act, h_act = s.acts[3 * d:3 * d + 3]
        w = shp.transpose(_take(s.w, 0, d), perm=(1, 0))
        r = shp.transpose(_take(s.r, 0, d), perm=(1, 0))
        bias = None
        if s.b is not None:
            bd = _take(s.b, 0, d)
            bias = E.add(_rows(bd, 0, 4 * H), _rows(bd, 4 * H, 8 * H))
        peep = _take(p, 0, d) if p is not None else None
        h, c = s.initial(5, d), s.initial(6, d)
        xw = L.matmul(s.x, w)               # (seq, batch, 4H): the input projection for every step at once
        if bias is not None:
            xw = E.add(xw, bias)
        ys = [None] * s.seq
        order = range(s.seq) if direction == "forward" else range(s.seq - 1, -1, -1)
        for t in order:
            gates = E.add(_take(xw, 0, t), L.matmul(h, r))
            gi, go, gf, gc = (I.slice(gates, starts=(k * H,), stops=((k + 1) * H,), steps=(1,), axes=(1,))
                              for k in range(4))
            if peep is not None:
                gi = E.add(gi, E.mul(_rows(peep, 0, H), c))
                gf = E.add(gf, E.mul(_rows(peep, 2 * H, 3 * H), c))
            i_t = f_act(s.clipped(gi))
            f_t = E.sub(const(1, i_t), i_t) if couple else f_act(s.clipped(gf))
            c_new = E.add(E.mul(f_t, c), E.mul(i_t, g_act(s.clipped(gc))))
            if peep is not None:
                go = E.add(go, E.mul(_rows(peep, H, 2 * H), c_new))
            o_t = f_act(s.clipped(go))
            h_new = E.mul(o_t, h_act(c_new))
            ys[t], h = s.step_output(t, h_new, h)
            c = _masked(s.mask(t), c_new, c)
        ys_all.append(ys)
        hs.append(h)
        cs.append(c)
    return s.finish(ys_all, [hs, cs])[:n.num_outputs]


@rule("GRU")
def _gru(n):
    s = _Setup(n, 3, ["Sigmoid", "Tanh"])
    H = s.hidden
    lbr = bool(n.attr("linear_before_reset", 0))
    ys_all, hs = [], []
    for d, direction in enumerate(s.dirs):
        f_act, g_act = s.acts[2 * d:2 * d + 2]
        w = shp.transpose(_take(s.w, 0, d), perm=(1, 0))
        r = _take(s.r, 0, d)
        rz_r = shp.transpose(_rows(r, 0, 2 * H), perm=(1, 0))
        rh = shp.transpose(_rows(r, 2 * H, 3 * H), perm=(1, 0))
        wb = rb = None
        if s.b is not None:
            bd = _take(s.b, 0, d)
            wb, rb = _rows(bd, 0, 3 * H), _rows(bd, 3 * H, 6 * H)
        h = s.initial(5, d)
        xw = L.matmul(s.x, w)
        if wb is not None:
            xw = E.add(xw, wb)
        ys = [None] * s.seq
        order = range(s.seq) if direction == "forward" else range(s.seq - 1, -1, -1)
        for t in order:
            xt = _take(xw, 0, t)
            x_zr = I.slice(xt, starts=(0,), stops=(2 * H,), steps=(1,), axes=(1,))
            x_h = I.slice(xt, starts=(2 * H,), stops=(3 * H,), steps=(1,), axes=(1,))
            h_zr = L.matmul(h, rz_r)
            if rb is not None:
                h_zr = E.add(h_zr, _rows(rb, 0, 2 * H))
            zr = f_act(s.clipped(E.add(x_zr, h_zr)))
            z = I.slice(zr, starts=(0,), stops=(H,), steps=(1,), axes=(1,))
            rr = I.slice(zr, starts=(H,), stops=(2 * H,), steps=(1,), axes=(1,))
            if lbr:
                hh = L.matmul(h, rh)
                if rb is not None:
                    hh = E.add(hh, _rows(rb, 2 * H, 3 * H))
                cand = E.add(x_h, E.mul(rr, hh))
            else:
                cand = E.add(x_h, L.matmul(E.mul(rr, h), rh))
                if rb is not None:
                    cand = E.add(cand, _rows(rb, 2 * H, 3 * H))
            ht = g_act(s.clipped(cand))
            h_new = E.add(E.mul(E.sub(const(1, z), z), ht), E.mul(z, h))
            ys[t], h = s.step_output(t, h_new, h)
        ys_all.append(ys)
        hs.append(h)
    return s.finish(ys_all, [hs])[:n.num_outputs]


@rule("RNN")
def _rnn(n):
    s = _Setup(n, 1, ["Tanh"])
    H = s.hidden
    ys_all, hs = [], []
    for d, direction in enumerate(s.dirs):
        act = s.acts[d]
        w = shp.transpose(_take(s.w, 0, d), perm=(1, 0))
        r = shp.transpose(_take(s.r, 0, d), perm=(1, 0))
        xw = L.matmul(s.x, w)
        if s.b is not None:
            bd = _take(s.b, 0, d)
            xw = E.add(xw, E.add(_rows(bd, 0, H), _rows(bd, H, 2 * H)))
        h = s.initial(5, d)
        ys = [None] * s.seq
        order = range(s.seq) if direction == "forward" else range(s.seq - 1, -1, -1)
        for t in order:
            h_new = act(s.clipped(E.add(_take(xw, 0, t), L.matmul(h, r))))
            ys[t], h = s.step_output(t, h_new, h)
        ys_all.append(ys)
        hs.append(h)
    return s.finish(ys_all, [hs])[:n.num_outputs]
