"""Core rows (issue 2): call overhead, elementwise chains, MLP training step, conv2d forward, compile time."""
from __future__ import annotations

import time
from typing import List, Optional

import numpy as np

import cgvm
from cgvm.ir import TensorType, input_value, param_value
from cgvm.ops import elementwise as E
from cgvm.ops import linalg as L
from cgvm.ops import reduce as R

from .harness import Row


def _torch():
    """PyTorch with the same thread budget as cgvm's BLAS pool (one run, one budget)."""
    try:
        import torch
    except ImportError:
        return None
    from cgvm.backend.threads import ensure_configured, num_threads

    ensure_configured()
    torch.set_num_threads(num_threads() or 1)
    return torch


def _pytensor():
    """PyTensor with the same thread budget: without BLAS link flags it multiplies through SciPy's
    own OpenBLAS, a second library beside NumPy's that cgvm leaves alone, which otherwise keeps a
    thread per core (measured: PyTensor's MLP step 4.2 ms with it, 4.6 ms at cgvm's one thread)."""
    try:
        import pytensor
        import pytensor.tensor as pt
    except ImportError:
        return None
    from cgvm.backend.threads import ensure_configured, num_threads

    ensure_configured()
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return pytensor, pt
    threadpool_limits(num_threads() or 1, user_api="blas")   # every BLAS loaded by now, SciPy's included
    return pytensor, pt


def call_overhead() -> Row:
    row = Row("call overhead: f(x) = x + 1, one element", number=20000)
    x = input_value(TensorType((1,)), "x")
    f = cgvm.compile([x], E.add(x, 1.0))
    a = np.ones(1, np.float32)
    row.add("cgvm", lambda: f(a))
    one = np.float32(1)
    row.add("numpy", lambda: np.add(a, one))
    torch = _torch()
    if torch is not None:
        t = torch.ones(1)
        row.add("torch", lambda: t + 1)
    pt = _pytensor()
    if pt is not None:
        pytensor, T = pt
        xs = T.vector("x", dtype="float32")
        g = pytensor.function([xs], xs + np.float32(1))
        row.add("pytensor", lambda: g(a))
    return row


def _chain_ops(n: int):
    """n dependent elementwise ops cycling through add, mul, tanh, sub (values stay bounded)."""
    return [("add", 0.5), ("mul", 0.9), ("tanh", None), ("sub", 0.25)] * (n // 4) + [("tanh", None)] * (n % 4)


def _cgvm_chain(n: int, size: int):
    x = input_value(TensorType((size,)), "x")
    y = x
    for op, c in _chain_ops(n):
        y = E.tanh(y) if op == "tanh" else getattr(E, op)(y, c)
    return cgvm.compile([x], y)


def chain(n: int, size: int, number: int) -> Row:
    row = Row(f"{n}-op elementwise chain, {size} elements", number=number)
    f = _cgvm_chain(n, size)
    a = np.linspace(-1, 1, size).astype(np.float32)
    ops = _chain_ops(n)
    row.add("cgvm", lambda: f(a))
    consts = {c: np.float32(c) for _, c in ops if c is not None}

    def numpy_eager():
        y = a
        for op, c in ops:
            if op == "add":
                y = y + consts[c]
            elif op == "mul":
                y = y * consts[c]
            elif op == "sub":
                y = y - consts[c]
            else:
                y = np.tanh(y)
        return y
    row.add("numpy", numpy_eager)
    np.testing.assert_allclose(f(a), numpy_eager(), rtol=1e-5, atol=1e-6)
    torch = _torch()
    if torch is not None:
        t = torch.from_numpy(a)

        def torch_eager():
            y = t
            for op, c in ops:
                if op == "add":
                    y = y + c
                elif op == "mul":
                    y = y * c
                elif op == "sub":
                    y = y - c
                else:
                    y = torch.tanh(y)
            return y
        row.add("torch", torch_eager)
    pt = _pytensor()
    if pt is not None and n <= 100:  # PyTensor needs seconds to minutes to compile 1000-op graphs
        pytensor, T = pt
        xs = T.vector("x", dtype="float32")
        y = xs
        for op, c in ops:
            y = T.tanh(y) if op == "tanh" else {"add": y + np.float32(c or 0), "mul": y * np.float32(c or 1),
                                                 "sub": y - np.float32(c or 0)}[op]
        g = pytensor.function([xs], y)
        row.add("pytensor", lambda: g(a))
    return row


def _mlp_sizes():
    return [784, 512, 512, 10]


def mlp_step() -> Optional[Row]:
    from cgvm.ops import loss as LS

    if not hasattr(LS, "softmax_cross_entropy"):
        return None
    row = Row("MLP 784-512-512-10 SGD step, batch 128", number=20, rounds=7)
    rng = np.random.default_rng(0)
    sizes = _mlp_sizes()
    Ws = [(rng.standard_normal((a, b)) * np.sqrt(2 / a)).astype(np.float32) for a, b in zip(sizes, sizes[1:])]
    bs = [np.zeros(b, np.float32) for b in sizes[1:]]
    X = rng.standard_normal((128, 784)).astype(np.float32)
    Y = rng.integers(0, 10, 128).astype(np.int64)
    lr = 0.01

    ws = cgvm.Workspace()
    x = input_value(TensorType((None, 784)), "x")
    y = input_value(TensorType((None,), "int64"), "y")
    params = []
    h = x
    for i, (W, b) in enumerate(zip(Ws, bs)):
        ws[f"W{i}"], ws[f"b{i}"] = W.copy(), b.copy()
        Wv, bv = param_value(f"W{i}", TensorType(W.shape)), param_value(f"b{i}", TensorType(b.shape))
        params += [Wv, bv]
        h = E.add(L.matmul(h, Wv), bv)
        if i < len(Ws) - 1:
            h = E.relu(h)
    loss = LS.softmax_cross_entropy(h, y)
    grads = cgvm.grad(loss, params)
    step = cgvm.compile([x, y], loss, workspace=ws,
                        updates={p: E.sub(p, E.mul(g, lr)) for p, g in zip(params, grads)})
    row.add("cgvm", lambda: step(X, Y))
    torch = _torch()
    if torch is not None:
        tp = [torch.tensor(a, requires_grad=True) for pair in zip(Ws, bs) for a in pair]
        tX, tY = torch.from_numpy(X), torch.from_numpy(Y)
        F = torch.nn.functional

        def torch_step():
            h = tX
            for i in range(3):
                h = torch.addmm(tp[2 * i + 1], h, tp[2 * i])
                if i < 2:
                    h = F.relu(h)
            loss = F.cross_entropy(h, tY)
            gs = torch.autograd.grad(loss, tp)
            with torch.no_grad():
                for p, g in zip(tp, gs):
                    p.sub_(g, alpha=lr)
            return loss
        row.add("torch", torch_step)
    pt = _pytensor()
    if pt is not None:
        pytensor, T = pt
        xs, ys = T.matrix("x", dtype="float32"), T.vector("y", dtype="int64")
        shared = [pytensor.shared(a.copy()) for pair in zip(Ws, bs) for a in pair]
        h = xs
        for i in range(3):
            h = T.dot(h, shared[2 * i]) + shared[2 * i + 1]
            if i < 2:
                h = T.maximum(h, 0)
        p = T.special.log_softmax(h, axis=1)
        cost = -T.mean(p[T.arange(ys.shape[0]), ys])
        gs = T.grad(cost, shared)
        g = pytensor.function([xs, ys], cost, updates=[(s, s - np.float32(lr) * gg) for s, gg in zip(shared, gs)])
        row.add("pytensor", lambda: g(X, Y))
    return row


def conv2d_forward() -> Optional[Row]:
    from cgvm.ops import conv as C

    row = Row("conv2d forward, batch 8, 3->32 ch, 64x64, 3x3 pad 1", number=20)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((8, 3, 64, 64)).astype(np.float32)
    Wt = rng.standard_normal((32, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    x = input_value(TensorType((None, 3, 64, 64)), "x")
    f = cgvm.compile([x], C.conv(x, Wt, b, pad=1))
    row.add("cgvm", lambda: f(X))
    torch = _torch()
    if torch is not None:
        tX, tW, tb = torch.from_numpy(X), torch.from_numpy(Wt), torch.from_numpy(b)
        with torch.no_grad():
            np.testing.assert_allclose(f(X), torch.nn.functional.conv2d(tX, tW, tb, padding=1).numpy(),
                                       rtol=1e-4, atol=1e-4)

        def torch_conv():
            with torch.no_grad():
                return torch.nn.functional.conv2d(tX, tW, tb, padding=1)
        row.add("torch", torch_conv)
    return row


def compile_time(n: int) -> Row:
    row = Row(f"compile a {n}-op graph (passes + codegen + first call)", number=1, rounds=1)
    a = np.linspace(-1, 1, 16).astype(np.float32)

    def cg():
        t0 = time.perf_counter()
        f = _cgvm_chain(n, 16)
        f(a)
        return time.perf_counter() - t0
    samples = [cg() for _ in range(5)]
    row.fixed["cgvm"] = sorted(samples)[len(samples) // 2]
    pt = _pytensor()
    if pt is not None:
        pytensor, T = pt

        def pg():
            xs = T.vector("x", dtype="float32")
            y = xs
            for op, c in _chain_ops(n):
                y = T.tanh(y) if op == "tanh" else {"add": y + np.float32(c or 0), "mul": y * np.float32(c or 1),
                                                     "sub": y - np.float32(c or 0)}[op]
            t0 = time.perf_counter()
            g = pytensor.function([xs], y)
            g(a)
            return time.perf_counter() - t0
        row.fixed["pytensor"] = min(pg() for _ in range(2 if n <= 100 else 1))
    return row


def rows(quick: bool = False) -> List[Row]:
    out = [call_overhead(), chain(1000, 1, 20 if quick else 100), chain(100, 10_000, 50 if quick else 200)]
    for r in (mlp_step(), conv2d_forward(), dlpack_exchange()):
        if r is not None:
            out.append(r)
    from . import rnn

    out += rnn.rows()
    out += [compile_time(10), compile_time(1000)]
    return out


def dlpack_exchange() -> Optional[Row]:
    """Importing a 4 MiB torch tensor without a copy: cgvm.from_dlpack beside NumPy's own."""
    torch = _torch()
    if torch is None:
        return None
    from cgvm.dlpack import from_dlpack

    t = torch.zeros(1 << 20)
    row = Row("DLPack import of a 4 MiB torch tensor (zero-copy)", number=2000)
    row.add("cgvm", lambda: from_dlpack(t))
    row.add("numpy", lambda: np.from_dlpack(t))
    return row
