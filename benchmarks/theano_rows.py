"""Theano-style rows: the same scripts run by cgvm.theano and by PyTensor (call overhead, compile time
of a training function, MLP step, RNN scan forward and forward+grad)."""
from __future__ import annotations

import time
from typing import Any, List, Tuple

import numpy as np

from .core import _pytensor
from .harness import Row
from .rnn import BATCH, N_HID, N_IN, T_STEPS, _data, _numpy_loop


def _cgvm_theano():
    import cgvm.theano as theano
    import cgvm.theano.tensor as T

    return theano, T


def _frameworks():
    out = [("cgvm", _cgvm_theano())]
    pt = _pytensor()
    if pt is not None:
        out.append(("pytensor", pt))
    return out


def _mlp_train_fn(theano: Any, T: Any, seed: int = 0):
    """A typical training function: MLP 784-512-512-10, softmax NLL, SGD updates, givens minibatch."""
    rng = np.random.default_rng(seed)
    X = theano.shared(rng.standard_normal((1024, 784)).astype(np.float32), name="X")
    Y = theano.shared(rng.integers(0, 10, 1024).astype(np.int64), name="Y")
    sizes = [784, 512, 512, 10]
    params = []
    x, y, i = T.matrix("x", dtype="float32"), T.vector("y", dtype="int64"), T.lscalar("i")
    h = x
    for k, (a, b) in enumerate(zip(sizes, sizes[1:])):
        W = theano.shared((rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32), name=f"W{k}")
        bb = theano.shared(np.zeros(b, np.float32), name=f"b{k}")
        params += [W, bb]
        h = T.dot(h, W) + bb
        if k < 2:
            h = T.maximum(h, 0)
    shifted = h - T.max(h, axis=1, keepdims=True)
    logp = shifted - T.log(T.sum(T.exp(shifted), axis=1, keepdims=True))
    cost = -T.mean(logp[T.arange(y.shape[0]), y])
    grads = T.grad(cost, params)
    t0 = time.perf_counter()
    f = theano.function([i], cost, updates=[(q, q - np.float32(0.01) * g) for q, g in zip(params, grads)],
                        givens={x: X[i * 128:(i + 1) * 128], y: Y[i * 128:(i + 1) * 128]})
    return f, time.perf_counter() - t0


def call_overhead() -> Row:
    row = Row("theano.function call overhead: f(x) = x + 1, one element", number=20000)
    a = np.ones(1, np.float32)
    for name, (theano, T) in _frameworks():
        x = T.vector("x", dtype="float32")
        f = theano.function([x], x + np.float32(1))
        row.add(name, lambda f=f: f(a))
    return row


def compile_time() -> Row:
    row = Row("compile a typical training function (MLP, grad, updates, givens)", number=1, rounds=1)
    for name, (theano, T) in _frameworks():
        times = []
        for seed in range(3):
            f, dt = _mlp_train_fn(theano, T, seed)
            t0 = time.perf_counter()
            f(0)  # first call: cgvm plans memory per input signature here
            times.append(dt + time.perf_counter() - t0)
        row.fixed[name] = sorted(times)[1]
    return row


def mlp_step() -> Row:
    row = Row("theano.function MLP 784-512-512-10 SGD step, batch 128 (givens)", number=10)
    for name, (theano, T) in _frameworks():
        f, _ = _mlp_train_fn(theano, T)
        row.add(name, lambda f=f: f(3))
    return row


def rnn_rows() -> List[Row]:
    X, H0, W, U = _data()
    out = []
    for backward in (False, True):
        row = Row(f"theano.scan RNN (tanh, hidden {N_HID}, input {N_IN}, {T_STEPS} steps, batch {BATCH}) "
                  f"{'forward+grad' if backward else 'forward'}", number=5, rounds=7)
        for name, (theano, T) in _frameworks():
            xs = T.tensor3("X", dtype="float32")
            h0, w, u = (T.matrix(n, dtype="float32") for n in ("H0", "W", "U"))
            hs, _ = theano.scan(lambda x_t, h, w, u: T.tanh(T.dot(x_t, w) + T.dot(h, u)), sequences=xs,
                                outputs_info=h0, non_sequences=[w, u])
            c = hs.sum()
            f = theano.function([xs, h0, w, u], [c] + (list(theano.grad(c, [w, u])) if backward else []))
            row.add(name, lambda f=f: f(X, H0, W, U))
        row.add("numpy", lambda b=backward: _numpy_loop(X, H0, W, U, b))
        out.append(row)
    return out


def _scan(theano: Any, *args: Any, **kwargs: Any) -> Any:
    res = theano.scan(*args, **kwargs) if "cgvm" in theano.__name__ else theano.scan(*args, return_updates=True,
                                                                                        **kwargs)
    return res[0]


def small_scan() -> Row:
    """Many calls on tiny data: an HMC-style leapfrog, 20 scan steps on 3x5 positions (float64)."""
    row = Row("theano.scan small calls: 20 leapfrog steps on 3x5 positions, float64", number=200)
    rng = np.random.default_rng(0)
    cov_inv = np.linalg.inv(np.eye(5) + 0.1)
    mu, v0 = rng.random(5), rng.standard_normal((3, 5))
    for name, (theano, T) in _frameworks():
        pos = theano.shared(rng.standard_normal((3, 5)), name="pos")
        step = theano.shared(np.float64(0.01), name="step")

        def energy(x, T=T):
            return 0.5 * (T.dot(x - mu, cov_inv) * (x - mu)).sum(axis=1)

        def leapfrog(p, v, eps, T=T, energy=energy):
            new_v = v - eps * T.grad(energy(p).sum(), p)
            return [p + eps * new_v, new_v]

        vel = T.matrix("v0", dtype="float64")
        ps, _ = _scan(theano, leapfrog, outputs_info=[pos, vel], non_sequences=[step], n_steps=20)
        accept = T.exp(energy(pos) - energy(ps[-1]))
        f = theano.function([vel], [ps[-1], accept])
        row.add(name, lambda f=f: f(v0))
    return row


def mlp_step_float64() -> Row:
    """The tutorial MLP's steady-state step in Theano's default float64 (784-500-10, batch 20)."""
    row = Row("theano.function tutorial MLP 784-500-10 SGD step, batch 20, float64", number=50)
    rng = np.random.default_rng(1)
    data, labels = rng.random((200, 784)), rng.integers(0, 10, 200)
    for name, (theano, T) in _frameworks():
        X, Y = theano.shared(data, name="X"), theano.shared(labels, name="Y")
        W1 = theano.shared(rng.uniform(-0.07, 0.07, (784, 500)), name="W1")
        b1, b2 = theano.shared(np.zeros(500), name="b1"), theano.shared(np.zeros(10), name="b2")
        W2 = theano.shared(np.zeros((500, 10)), name="W2")
        x, y, i = T.matrix("x", dtype="float64"), T.vector("y", dtype="int64"), T.lscalar("i")
        h = T.tanh(T.dot(x, W1) + b1)
        z = T.dot(h, W2) + b2
        logp = z - T.log(T.sum(T.exp(z - T.max(z, axis=1, keepdims=True)), axis=1, keepdims=True)) \
            - T.max(z, axis=1, keepdims=True)
        cost = -T.mean(logp[T.arange(y.shape[0]), y]) + 0.0001 * ((W1 ** 2).sum() + (W2 ** 2).sum())
        params = [W1, b1, W2, b2]
        grads = T.grad(cost, params)
        f = theano.function([i], cost, updates=[(q, q - 0.01 * g) for q, g in zip(params, grads)],
                            givens={x: X[i * 20:(i + 1) * 20], y: Y[i * 20:(i + 1) * 20]})
        row.add(name, lambda f=f: f(3))
    return row


def _nnet(theano: Any, T: Any) -> Tuple[Any, Any]:
    """(sigmoid, softmax) under each framework's own names."""
    if "cgvm" in theano.__name__:
        return T.nnet.sigmoid, T.nnet.softmax
    from pytensor.tensor.special import softmax

    # Theano's softmax of a vector is a 1 x n row (the tutorial indexes s[:, 0, :]); PyTensor's a vector
    return T.sigmoid, lambda x: softmax(x.dimshuffle("x", 0) if x.ndim == 1 else x, axis=-1)


def rnnslu_train() -> Row:
    """Many small calls with a new length each: the rnnslu tutorial's Elman RNN (ATIS sizes, float64),
    one sentence trained by ``sentence_train`` (scan over its words, BPTT, SGD on every parameter)
    and the embeddings renormalized, sentences of 6 to 17 words in turn."""
    row = Row("theano.scan rnnslu-style small calls: Elman RNN train + normalize per sentence "
              "(vocabulary 572, embedding 50x7, hidden 200, 127 classes), float64", number=24)
    rng = np.random.default_rng(2)
    ne, de, cs, nh, nc = 572, 50, 7, 200, 127
    init = [0.2 * rng.uniform(-1, 1, shape) for shape in ((ne + 1, de), (de * cs, nh), (nh, nh), (nh, nc))]
    sentences = []
    for n in (9, 14, 6, 17, 11, 8):
        words = list(rng.integers(0, ne, n))
        padded = [-1] * (cs // 2) + words + [-1] * (cs // 2)
        sentences.append(([np.asarray(padded[i:i + cs], np.int32) for i in range(n)],
                          rng.integers(0, nc, n).astype(np.int32)))
    for name, (theano, T) in _frameworks():
        sigmoid, softmax = _nnet(theano, T)
        emb, wx, wh, w = (theano.shared(v.copy(), name=k) for v, k in zip(init, ("emb", "wx", "wh", "w")))
        bh, b, h0 = (theano.shared(np.zeros(k), name=n) for k, n in ((nh, "bh"), (nc, "b"), (nh, "h0")))
        params = [emb, wx, wh, w, bh, b, h0]
        idxs = T.imatrix()
        x = emb[idxs].reshape((idxs.shape[0], de * cs))
        y_sentence = T.ivector("y_sentence")

        def recurrence(x_t, h_tm1, T=T, sigmoid=sigmoid, softmax=softmax, wx=wx, wh=wh, bh=bh, w=w, b=b):
            h_t = sigmoid(T.dot(x_t, wx) + T.dot(h_tm1, wh) + bh)
            return [h_t, softmax(T.dot(h_t, w) + b)]

        [h, s] = _scan(theano, recurrence, sequences=x, outputs_info=[h0, None], n_steps=x.shape[0])
        p_y = s[:, 0, :]
        lr = T.scalar("lr")
        nll = -T.mean(T.log(p_y)[T.arange(x.shape[0]), y_sentence])
        grads = T.grad(nll, params)
        train = theano.function([idxs, y_sentence, lr], nll, updates=[(p, p - lr * g) for p, g in zip(params, grads)])
        normalize = theano.function([], updates={emb: emb / T.sqrt((emb ** 2).sum(axis=1)).dimshuffle(0, "x")})
        state = {"k": 0}

        def call(train=train, normalize=normalize, state=state):
            words, labels = sentences[state["k"] % len(sentences)]
            state["k"] += 1
            train(words, labels, 0.0970806646812754)
            normalize()
        row.add(name, call)
    return row


def rows(quick: bool = False) -> List[Row]:
    return [call_overhead(), compile_time(), mlp_step(), small_scan(), rnnslu_train(), mlp_step_float64()] + rnn_rows()
