"""Checking ops: a table of cases against a plain NumPy reference, and numeric gradients in float64.

A Case builds output(s) from symbolic inputs with cgvm ops; the harness compiles it (passes,
planning, VM), runs it, checks the values against ``reference`` (written with plain NumPy or
loops, never with cgvm kernels) and against ``eval_graph`` (the IR interpreter), and, if
``grad`` is set, checks cgvm.grad against central differences in float64.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

import cgvm
from cgvm.ir import Graph, TensorType, input_value


@dataclass
class Case:
    name: str
    build: Callable[..., Any]                # build(*symbolic_inputs) -> Value or tuple of Values
    inputs: Sequence[np.ndarray]
    reference: Callable[..., Any]            # reference(*numpy_inputs) -> array or tuple of arrays
    grad: bool = True                        # run the numeric gradient check
    grad_inputs: Optional[Sequence[int]] = None  # which inputs to differentiate (default: float ones)
    rtol: float = 1e-5
    atol: float = 1e-6
    dynamic: bool = False                    # declare input shapes unknown (None dims)
    eps: float = 1e-6
    grad_rtol: float = 1e-4
    grad_atol: float = 1e-6
    extra: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return self.name


def _symbolic(inputs, dynamic):
    return [input_value(TensorType([None] * a.ndim if dynamic else a.shape, a.dtype), f"in{i}")
            for i, a in enumerate(inputs)]


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def check_case(case: Case, backend: str = "numpy") -> None:
    ws = cgvm.Workspace(backend)
    xp = ws.backend.xp
    syms = _symbolic(case.inputs, case.dynamic)
    outs = _as_tuple(case.build(*syms))
    f = cgvm.compile(syms, list(outs), workspace=ws, name=case.name, debug=True)
    got = f(*[xp.asarray(a) for a in case.inputs])
    want = _as_tuple(case.reference(*[np.array(a, copy=True) for a in case.inputs]))
    assert len(got) == len(want), f"{case.name}: {len(got)} outputs, reference has {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g = ws.backend.to_numpy(g)
        w = np.asarray(w)
        assert g.shape == w.shape, f"{case.name} output {i}: shape {g.shape}, reference {w.shape}"
        if w.dtype != object:
            assert g.dtype == w.dtype or (g.dtype.kind == w.dtype.kind == "f"), \
                f"{case.name} output {i}: dtype {g.dtype}, reference {w.dtype}"
        np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol, err_msg=f"{case.name} output {i}")
    # the VM agrees with the IR interpreter on the unoptimized graph
    graph = Graph(syms, list(outs))
    ref = cgvm.eval_graph(graph, [xp.asarray(a) for a in case.inputs], xp=xp)
    for i, (g, r) in enumerate(zip(got, ref)):
        np.testing.assert_allclose(ws.backend.to_numpy(g), ws.backend.to_numpy(xp.asarray(r)),
                                   rtol=1e-6, atol=1e-7, err_msg=f"{case.name} output {i}: VM vs eval_graph")


def numeric_grad(fn: Callable[[Sequence[np.ndarray]], float], inputs: Sequence[np.ndarray], k: int,
                 eps: float) -> np.ndarray:
    x = inputs[k]
    g = np.zeros_like(x)
    flat = x.reshape(-1)
    gflat = g.reshape(-1)
    for j in range(flat.size):
        old = flat[j]
        flat[j] = old + eps
        plus = fn(inputs)
        flat[j] = old - eps
        minus = fn(inputs)
        flat[j] = old
        gflat[j] = (plus - minus) / (2 * eps)
    return g


def linear_adjoint(linear: Callable[[np.ndarray], np.ndarray], x: np.ndarray, g: np.ndarray) -> np.ndarray:
    """d/dx of sum(g * linear(x)) for a reference ``linear`` in x, exactly: one unit vector of x at a time."""
    dx = np.zeros(x.size)
    unit = np.zeros(x.size)
    for j in range(x.size):
        unit[j] = 1
        dx[j] = (linear(unit.reshape(x.shape)) * g).sum()
        unit[j] = 0
    return dx.reshape(x.shape)


def check_grad(case: Case, backend: str = "numpy") -> None:
    """cgvm.grad of sum_i <out_i, w_i> (random w) against central differences, in float64."""
    rng = np.random.default_rng(0)
    inputs = [a.astype(np.float64) if a.dtype.kind == "f" else a.copy() for a in case.inputs]
    which = case.grad_inputs if case.grad_inputs is not None else \
        [i for i, a in enumerate(inputs) if a.dtype.kind == "f"]
    ws = cgvm.Workspace(backend)
    xp = ws.backend.xp
    syms = _symbolic(inputs, case.dynamic)
    outs = [o for o in _as_tuple(case.build(*syms)) if o.dtype.is_float]
    weights = [rng.standard_normal([d if d is not None else 1 for d in o.shape]) for o in outs]
    # weights are shaped after the outputs' static shapes; dynamic cases compute them at run time
    probe = cgvm.compile(syms, outs, workspace=ws)
    shapes = [ws.backend.to_numpy(v).shape for v in probe(*[xp.asarray(a) for a in inputs])]
    weights = [rng.standard_normal(s) for s in shapes]
    cost = None
    for o, w in zip(outs, weights):
        term = cgvm.ops.reduce.sum(cgvm.ops.elementwise.mul(o, w.astype(o.dtype.np)))
        cost = term if cost is None else cgvm.ops.elementwise.add(cost, term)
    grads = cgvm.grad(cost, [syms[i] for i in which])
    f = cgvm.compile(syms, [cost] + list(grads), workspace=ws, debug=True)

    def scalar(vals):
        return float(ws.backend.to_numpy(f(*[xp.asarray(a) for a in vals])[0]))

    got = f(*[xp.asarray(a) for a in inputs])[1:]
    for k, g in zip(which, got):
        num = numeric_grad(scalar, inputs, k, case.eps)
        np.testing.assert_allclose(ws.backend.to_numpy(g), num, rtol=case.grad_rtol, atol=case.grad_atol,
                                   err_msg=f"{case.name}: gradient wrt input {k}")


def second_order(build_cost: Callable[..., Any]) -> Callable[..., Any]:
    """A case whose output is the gradient of a cost w.r.t. its first input (so check_grad checks 2nd order)."""
    def build(*xs):
        return cgvm.grad(build_cost(*xs), xs[0])
    return build


def spatial(v: Any, nsp: int) -> tuple:
    """A per-spatial-axis attribute (one value for all axes, or one per axis) as a tuple."""
    v = (v,) if isinstance(v, int) else tuple(v)
    return v * nsp if len(v) == 1 else v


def pad_pairs(pad: Any, nsp: int) -> list:
    """Padding attributes (1 value, one per axis, or begins then ends) as (before, after) pairs."""
    pad = (pad,) if isinstance(pad, int) else tuple(pad)
    if len(pad) == 1:
        return [(pad[0], pad[0])] * nsp
    if len(pad) == nsp:
        return [(p, p) for p in pad]
    return list(zip(pad[:nsp], pad[nsp:]))


def run_op(build: Callable[..., Any], inputs: Sequence[np.ndarray], backend: str = "numpy") -> list:
    """Compile ``build`` over inputs shaped like ``inputs`` and return its outputs as NumPy arrays."""
    xs = [input_value(TensorType(a.shape, a.dtype), f"x{i}") for i, a in enumerate(inputs)]
    outs = _as_tuple(build(*xs))
    ws = cgvm.Workspace(backend)
    f = cgvm.compile(xs, list(outs), workspace=ws)
    return [ws.backend.to_numpy(v) for v in f(*[ws.backend.asarray(a) for a in inputs])]

