"""Theano's ``RandomStreams``: seeded random draws whose state lives in the Workspace.

Each draw (``srng.uniform((2, 2))``) owns a shared state ``[seed, counter]`` (a Workspace
entry) and a ``default_update`` to the next state, so every call of a function using it gets a
fresh sample, ``no_default_updates=True`` freezes it, and the same seed gives the same
sequence. ``MRG_RandomStreams`` (Theano's GPU-friendly generator) is the same class.
"""
from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from ...ops import random as rnd
from . import basic as B
from . import shapes as S
from .config import config
from .shared import SharedVariable, shared
from .var import TensorVariable, as_tensor_variable, constant, wrap


def _size_args(size: Any, ndim: Optional[int], a: Any, b: Any):
    """(int64 shape vector, static shape or None) for a draw of ``size``."""
    if size is None:
        like = B.add(B.mul(as_tensor_variable(a), 0), B.mul(as_tensor_variable(b), 0))
        vec = S.shape(like)
        static = like.value.shape if None not in like.value.shape else None
        return vec, static
    if isinstance(size, TensorVariable):
        if size.ndim != 1 or size.value.shape[0] is None:
            raise ValueError("random draw: a symbolic size must be a vector of known length (e.g. x.shape)")
        if size.value.kind == "const":
            return B.cast(size, "int64"), tuple(int(d) for d in size.value.data)
        return B.cast(size, "int64"), None
    if isinstance(size, (int, np.integer)):
        size = (int(size),)
    size = tuple(size)
    if ndim is not None and ndim != len(size):
        raise ValueError(f"random draw: ndim={ndim} does not match size {size}")
    if all(isinstance(d, (int, np.integer)) for d in size):
        return constant(np.array(size, dtype=np.int64)), tuple(int(d) for d in size)
    return S.stack([B.cast(as_tensor_variable(d) if not isinstance(d, (int, np.integer)) else
                           constant(int(d), dtype="int64"), "int64") for d in size]), None


class RandomStreams:
    """A source of seeded random draws (``theano.tensor.shared_randomstreams.RandomStreams``)."""

    def __init__(self, seed: Optional[int] = None, workspace: Any = None):
        self.default_instance_seed = seed if seed is not None else np.random.randint(2 ** 30)
        self.workspace = workspace
        self.state_updates: List[tuple] = []
        self._seed_gen = np.random.RandomState(self.default_instance_seed)
        self._states: List[SharedVariable] = []

    def seed(self, seed: Optional[int] = None) -> None:
        """Re-seed every draw made so far (and the ones to come) from ``seed``."""
        seed = self.default_instance_seed if seed is None else seed
        self._seed_gen = np.random.RandomState(seed)
        for state in self._states:
            state.set_value(rnd.initial_state(self._seed_gen.randint(2 ** 30)), borrow=True)

    def _draw(self, dist: str, size: Any, ndim: Optional[int], a: Any, b: Any, dtype: str,
              replace: bool = True) -> TensorVariable:
        vec, static = _size_args(size, ndim, a, b)
        state = shared(rnd.initial_state(self._seed_gen.randint(2 ** 30)), name=f"rng_{dist}",
                       workspace=self.workspace)
        av = B.cast(as_tensor_variable(a), "float64") if not isinstance(a, TensorVariable) else a
        bv = B.cast(as_tensor_variable(b), "float64") if not isinstance(b, TensorVariable) else b
        sample, nxt = rnd.random_draw(state.value, vec.value, av.value, bv.value, dist=dist, dtype=dtype,
                                      static_shape=static, replace=replace)
        state.default_update = wrap(nxt)
        self._states.append(state)
        self.state_updates.append((state, state.default_update))
        return wrap(sample)

    def uniform(self, size: Any = (), low: Any = 0.0, high: Any = 1.0, ndim: Optional[int] = None,
                dtype: Optional[str] = None, nstreams: Any = None) -> TensorVariable:
        return self._draw("uniform", size, ndim, low, high, _float(dtype, low, high))

    def normal(self, size: Any = (), avg: Any = 0.0, std: Any = 1.0, ndim: Optional[int] = None,
               dtype: Optional[str] = None, nstreams: Any = None) -> TensorVariable:
        return self._draw("normal", size, ndim, avg, std, _float(dtype, avg, std))

    def binomial(self, size: Any = (), n: Any = 1, p: Any = 0.5, ndim: Optional[int] = None,
                 dtype: str = "int64", nstreams: Any = None, prob: Any = None) -> TensorVariable:
        return self._draw("binomial", size, ndim, n, p if prob is None else prob, dtype)

    def random_integers(self, size: Any = (), low: int = 0, high: int = 1, ndim: Optional[int] = None,
                        dtype: str = "int64") -> TensorVariable:
        """Integers in [low, high] (inclusive, as Theano)."""
        return self._draw("integers", size, ndim, low, high + 1, dtype)

    def integers(self, low: int, high: int, size: Any = (), dtype: str = "int64") -> TensorVariable:
        return self._draw("integers", size, None, low, high, dtype)

    def choice(self, size: Any = (), a: int = 2, replace: bool = True, p: Any = None, ndim: Optional[int] = None,
               dtype: str = "int64") -> TensorVariable:
        """Draws from range(a), uniformly or with probabilities ``p``."""
        probs = np.zeros((0,), dtype=np.float64) if p is None else p
        return self._draw("choice", size, ndim, a, probs, dtype, replace=replace)

    def permutation(self, size: Any = (), n: int = 1, ndim: Optional[int] = None,
                    dtype: str = "int64") -> TensorVariable:
        """Permutations of range(n); ``size`` permutations stacked (shape size + (n,))."""
        if isinstance(size, (int, np.integer)):
            size = (int(size),)
        full = tuple(size or ()) + (n,)
        return self._draw("permutation", full, None, n, 0, dtype)


MRG_RandomStreams = RandomStreams


def _float(dtype: Optional[str], *params: Any) -> str:
    if dtype is not None:
        return config.floatX if dtype == "floatX" else np.dtype(dtype).name
    tensors = [p for p in params if isinstance(p, TensorVariable)]
    if tensors:
        return np.result_type(*[p.dtype for p in tensors]).name if any(
            p.value.dtype.is_float for p in tensors) else config.floatX
    return config.floatX


def shared_rng(value: Any, name: Optional[str] = None, workspace: Any = None) -> SharedVariable:
    """A shared random state seeded from a NumPy RandomState/Generator."""
    if isinstance(value, np.random.RandomState):
        seed = int(value.randint(2 ** 30))
    else:
        seed = int(value.integers(2 ** 30))
    return shared(rnd.initial_state(seed), name=name or "rng", workspace=workspace)

