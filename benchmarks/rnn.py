"""RNN scan rows: tanh RNN, hidden 128, input 64, 100 steps, batch 32, forward and forward+grad."""
from __future__ import annotations

from typing import List

import numpy as np

import cgvm
from cgvm.ir import Graph, TensorType, input_value
from cgvm.ops import control as C
from cgvm.ops import elementwise as E
from cgvm.ops import linalg as L
from cgvm.ops import reduce as R

from .core import _pytensor, _torch
from .harness import Row

T_STEPS, BATCH, N_IN, N_HID = 100, 32, 64, 128


def _data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((T_STEPS, BATCH, N_IN)).astype(np.float32)
    H0 = np.zeros((BATCH, N_HID), np.float32)
    W = (rng.standard_normal((N_IN, N_HID)) * 0.1).astype(np.float32)
    U = (rng.standard_normal((N_HID, N_HID)) * 0.1).astype(np.float32)
    return X, H0, W, U


def _cgvm_rnn():
    xt = input_value(TensorType((BATCH, N_IN)), "xt")
    hp = input_value(TensorType((BATCH, N_HID)), "h")
    w = input_value(TensorType((N_IN, N_HID)), "w")
    u = input_value(TensorType((N_HID, N_HID)), "u")
    body = Graph([xt, hp, w, u], [E.tanh(E.add(L.matmul(xt, w), L.matmul(hp, u)))], name="rnn_step")
    X = input_value(TensorType((None, BATCH, N_IN)), "X")
    H0, W, U = (input_value(TensorType(s), n) for s, n in
                (((BATCH, N_HID), "H0"), ((N_IN, N_HID), "W"), ((N_HID, N_HID), "U")))
    _, Hs = C.scan(X, H0, W, U, body=body, n_seqs=1, n_carry=1)
    cost = R.sum(Hs)
    fwd = cgvm.compile([X, H0, W, U], cost)
    grad = cgvm.compile([X, H0, W, U], [cost] + cgvm.grad(cost, [W, U]))
    return fwd, grad


def _numpy_loop(X, H0, W, U, backward: bool):
    hs = []
    h = H0
    for t in range(X.shape[0]):
        h = np.tanh(X[t] @ W + h @ U)
        hs.append(h)
    cost = sum(float(h.sum()) for h in hs)
    if not backward:
        return cost
    gW, gU = np.zeros_like(W), np.zeros_like(U)
    gh = np.zeros_like(H0)
    for t in range(X.shape[0] - 1, -1, -1):
        gz = (gh + 1.0) * (1 - hs[t] * hs[t])
        gW += X[t].T @ gz
        gU += (hs[t - 1] if t else H0).T @ gz
        gh = gz @ U.T
    return cost, gW, gU


def rows() -> List[Row]:
    X, H0, W, U = _data()
    fwd, grad = _cgvm_rnn()
    ref = _numpy_loop(X, H0, W, U, True)
    got = grad(X, H0, W, U)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-3, atol=1e-3)
    out = []
    for backward in (False, True):
        row = Row(f"RNN scan (tanh, hidden 128, input 64, 100 steps, batch 32) {'forward+grad' if backward else 'forward'}",
                  number=5, rounds=7)
        row.add("cgvm", (lambda: grad(X, H0, W, U)) if backward else (lambda: fwd(X, H0, W, U)))
        row.add("numpy", lambda b=backward: _numpy_loop(X, H0, W, U, b))
        torch = _torch()
        if torch is not None:
            tX, tH0 = torch.from_numpy(X), torch.from_numpy(H0)
            tW, tU = torch.tensor(W, requires_grad=True), torch.tensor(U, requires_grad=True)

            def torch_loop(b=backward):
                with torch.set_grad_enabled(b):
                    h, total = tH0, 0
                    for t in range(T_STEPS):
                        h = torch.tanh(tX[t] @ tW + h @ tU)
                        total = total + h.sum()
                    if b:
                        return torch.autograd.grad(total, [tW, tU])
                    return total
            row.add("torch", torch_loop)
        pt = _pytensor()
        if pt is not None:
            pytensor, T = pt
            xs = T.tensor3("X", dtype="float32")
            h0, w, u = T.matrix("H0", dtype="float32"), T.matrix("W", dtype="float32"), T.matrix("U", dtype="float32")
            hs, _ = pytensor.scan(lambda x, h, w, u: T.tanh(T.dot(x, w) + T.dot(h, u)), sequences=xs,
                                  outputs_info=h0, non_sequences=[w, u])
            c = hs.sum()
            outs = [c] + (list(pytensor.grad(c, [w, u])) if backward else [])
            g = pytensor.function([xs, h0, w, u], outs)
            row.add("pytensor", lambda: g(X, H0, W, U))
        out.append(row)
    return out
