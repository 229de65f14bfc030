"""Random draws driven by an explicit state tensor: uniform, normal, binomial, integers, choice, permutation.

The state is a small int64 vector ``[seed, counter]`` held wherever the caller keeps it (a
Workspace entry for Theano's RandomStreams). ``random_draw(state, shape, a, b)`` returns the
sample and the next state ``[seed, counter + 1]``; a draw is a pure function of the state, so
the same seed gives the same sequence on every run and graphs stay reproducible. Generation
uses the array module's own ``random.default_rng`` (NumPy's PCG64 on the CPU).

``shape`` is an int64 vector (its length must be known when the graph is built); ``a`` and ``b``
are the distribution's parameters as tensors: (low, high) for uniform, (mean, std) for normal,
(n, p) for binomial, (low, high) inclusive-exclusive for integers, (n, p) for choice (``p`` a
probability vector or empty for uniform choice) and (n, unused) for permutation.
"""
from __future__ import annotations

from ..errors import ShapeError
from ..ir.attrs import Bool, DTypeAttr, Ints, Str
from ..ir.types import TensorType, int64
from .registry import OPAQUE, defop

DISTRIBUTIONS = ("uniform", "normal", "binomial", "integers", "choice", "permutation")


def _draw_infer(types, dist, dtype, static_shape, replace):
    state, shape = types[0], types[1]
    if state.ndim != 1 or not state.dtype.is_int:
        raise ShapeError(f"random_draw: the state must be an int64 vector, got {state!r}")
    if shape.ndim != 1 or not shape.dtype.is_int or shape.shape[0] is None:
        raise ShapeError(f"random_draw: the shape must be an integer vector of known length, got {shape!r}")
    dims = static_shape if static_shape is not None else (None,) * shape.shape[0]
    if len(dims) != shape.shape[0]:
        raise ShapeError(f"random_draw: static shape {dims} for a shape vector of length {shape.shape[0]}")
    return [TensorType(dims, dtype), state]


random_draw = defop("random_draw", num_inputs=4, num_outputs=2, pattern=OPAQUE, stateful=True,
                    differentiable=False, writes_out=False, infer=_draw_infer,
                    attrs={"dist": Str(choices=DISTRIBUTIONS), "dtype": DTypeAttr("float32"),
                           "static_shape": Ints(None), "replace": Bool(True)},
                    doc="(sample, next_state) of distribution `dist` with parameters a, b and the given shape.")


def _seed_of(xp, state) -> int:
    seed, counter = (int(v) for v in state.tolist()[:2])
    # one 63-bit stream seed per (seed, counter), mixed so that neighbouring counters are unrelated
    return (seed * 0x9E3779B97F4A7C15 + counter * 0xBF58476D1CE4E5B9) % (1 << 63)


@random_draw.kernel
def _(xp, state, shape, a, b, *, dist, dtype, static_shape, replace):
    rng = xp.random.default_rng(_seed_of(xp, state))
    size = tuple(int(d) for d in shape.tolist())
    npd = dtype.np
    if dist == "uniform":
        r = a + (b - a) * rng.random(size)
    elif dist == "normal":
        r = a + b * rng.standard_normal(size)
    elif dist == "binomial":
        r = rng.binomial(xp.broadcast_to(a, size).astype(xp.int64), xp.broadcast_to(b, size).astype(xp.float64))
    elif dist == "integers":
        r = rng.integers(int(a), int(b), size=size)
    elif dist == "permutation":
        n = int(a)
        r = xp.stack([rng.permutation(n) for _ in range(int(_prod(size[:-1])))]).reshape(size) if size[:-1] \
            else rng.permutation(n)
    else:  # choice
        p = None if b.size == 0 else b / b.sum()
        r = rng.choice(int(a), size=size, replace=replace, p=p)
    nxt = state.copy()
    nxt[1] += 1
    return xp.asarray(r).astype(npd, copy=False), nxt


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def initial_state(seed: int):
    """A state vector for ``seed`` (a NumPy int64 array ``[seed, 0]``)."""
    import numpy as np

    return np.array([int(seed) % (1 << 63), 0], dtype=np.int64)


__all__ = ["random_draw", "initial_state", "DISTRIBUTIONS", "int64"]
