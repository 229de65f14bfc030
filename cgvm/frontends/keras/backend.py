"""The Keras frontend's link to cgvm: symbolic tensors, variables in the Workspace, and the build scope.

A ``KerasTensor`` wraps one ``cgvm.ir.Value``; ``__cgvm_value__`` hands that Value to any cgvm op
or other frontend, and ``Layer.__call__`` accepts anything that has it (or a bare Value). A
``Variable`` is a Workspace entry plus a parameter Value of the same name, so the arrays a Keras
model trains are the arrays every compiled program (and every other frontend) reads.

Graphs are built under a ``BuildScope`` that says whether the model runs in training mode, which
int64 seed Value dropout layers draw from, and collects the state updates (BatchNorm moving
statistics) and extra losses (``add_loss``, activity regularizers) that the layers emit.
"""
from __future__ import annotations

import itertools
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from ...backend import host_array
from ...ir.graph import Value, param_value
from ...ir.types import DType, TensorType
from ...ops import elementwise as ew
from ...ops import linalg
from ...ops import indexing
from ...vm.workspace import Workspace, default_workspace

_workspace: Optional[Workspace] = None


def get_workspace() -> Workspace:
    """The Workspace Keras variables live in (cgvm's default one unless set)."""
    return _workspace if _workspace is not None else default_workspace()


def set_workspace(workspace: Optional[Workspace]) -> None:
    """Put Keras variables created from now on into ``workspace`` (None: cgvm's default one)."""
    global _workspace
    _workspace = workspace


def floatx() -> str:
    return "float32"


def epsilon() -> float:
    return 1e-7


def image_data_format() -> str:
    return "channels_last"


def backend() -> str:
    return "cgvm"


# --------------------------------------------------------------------------- names

_name_counts: Dict[str, int] = {}


def unique_name(base: str) -> str:
    """``dense``, ``dense_1``, ``dense_2`` ... as Keras names layers."""
    n = _name_counts.get(base, 0)
    _name_counts[base] = n + 1
    return base if n == 0 else f"{base}_{n}"


def clear_session() -> None:
    """Forget the layer-name counters (as keras.backend.clear_session does)."""
    _name_counts.clear()


_variable_ids = itertools.count()


def snake_case(name: str) -> str:
    """Keras' class-name to layer-name rule: ``Conv2D`` -> ``conv2d``, ``SimpleRNN`` -> ``simple_rnn``."""
    import re

    out = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    out = re.sub(r"([a-z])([A-Z])", r"\1_\2", out).lower()
    return out


# --------------------------------------------------------------------------- tensors

def to_value(x: Any) -> Value:
    """The cgvm Value of a KerasTensor, Variable, Theano-style variable or Value."""
    if isinstance(x, Value):
        return x
    if hasattr(x, "__cgvm_value__"):
        return x.__cgvm_value__()
    from ...ir.builder import as_value

    return as_value(x)


def get_mask(x: Any) -> Optional[Value]:
    """The Keras mask attached to ``x`` (None for anything but a masked KerasTensor)."""
    mask = getattr(x, "_keras_mask", None) if isinstance(x, KerasTensor) else None
    return None if mask is None else to_value(mask)


def is_symbolic(x: Any) -> bool:
    return isinstance(x, (Value, KerasTensor)) or hasattr(x, "__cgvm_value__")


class KerasTensor:
    """A symbolic tensor of the Keras frontend: one cgvm Value, and the layer call that made it.

    ``_keras_history`` is ``(layer, node_index, tensor_index)`` for outputs of recorded layer
    calls (the functional API), None for intermediate tensors inside a layer's ``call``.
    ``_keras_mask`` is the tensor's Keras mask: a bool Value (usually (batch, time)) or None.
    Python operators build cgvm nodes (recorded as operation layers in functional models).
    """

    __array_priority__ = 1000
    __array_ufunc__ = None

    def __init__(self, value: Value, history: Optional[Tuple[Any, int, int]] = None, name: Optional[str] = None,
                 mask: Optional[Value] = None):
        self.value = value
        self._keras_history = history
        self.name = name
        self._keras_mask = mask

    def __cgvm_value__(self) -> Value:
        return self.value

    @property
    def shape(self) -> Tuple[Optional[int], ...]:
        return tuple(self.value.shape)

    @property
    def dtype(self) -> str:
        return self.value.dtype.name

    @property
    def ndim(self) -> int:
        return self.value.ndim

    def __repr__(self) -> str:
        src = f", name={self.name}" if self.name else ""
        return f"<KerasTensor shape={self.shape}, dtype={self.dtype}{src}>"

    def __hash__(self) -> int:
        return id(self)

    # -- operators: functional models record them as operation layers
    def _op(self, fn, *others):
        from .layers.base import apply_operation

        return apply_operation(fn, self, *others)

    def __add__(self, o): return self._op(ew.add, o)
    def __radd__(self, o): return apply_operation_r(ew.add, o, self)
    def __sub__(self, o): return self._op(ew.sub, o)
    def __rsub__(self, o): return apply_operation_r(ew.sub, o, self)
    def __mul__(self, o): return self._op(ew.mul, o)
    def __rmul__(self, o): return apply_operation_r(ew.mul, o, self)
    def __truediv__(self, o): return self._op(ew.div, o)
    def __rtruediv__(self, o): return apply_operation_r(ew.div, o, self)
    def __pow__(self, o): return self._op(ew.pow, o)
    def __matmul__(self, o): return self._op(linalg.matmul, o)
    def __rmatmul__(self, o): return apply_operation_r(linalg.matmul, o, self)
    def __neg__(self): return self._op(ew.neg)
    def __abs__(self): return self._op(ew.abs)

    def __getitem__(self, key):
        from .layers.base import apply_operation

        return apply_operation(lambda v: _getitem(v, key), self)


def apply_operation_r(fn, left, right):
    from .layers.base import apply_operation

    return apply_operation(lambda r, l=left: fn(l, r), right)


def _getitem(v: Value, key: Any) -> Value:
    """Basic indexing (ints, slices, Ellipsis, None) with NumPy semantics."""
    from ...ops import shape as shp

    if not isinstance(key, tuple):
        key = (key,)
    if Ellipsis in key:
        i = key.index(Ellipsis)
        fill = v.ndim - (len(key) - 1 - sum(1 for k in key if k is None))
        key = key[:i] + (slice(None),) * fill + key[i + 1:]
    starts, stops, steps, axes, drop, new_axes = [], [], [], [], [], []
    axis = 0
    out_axis = 0
    for k in key:
        if k is None:
            new_axes.append(out_axis)
            out_axis += 1
            continue
        if isinstance(k, slice):
            if k != slice(None):
                starts.append(k.start), stops.append(k.stop), steps.append(k.step), axes.append(axis)
            out_axis += 1
        else:
            k = int(k)
            starts.append(k), stops.append(k + 1 if k != -1 else None), steps.append(None), axes.append(axis)
            drop.append(axis)
        axis += 1
    out = v
    if axes:
        out = indexing.slice(out, starts=starts, stops=stops, steps=steps, axes=axes)
    if drop:
        out = shp.squeeze(out, axis=drop)
    if new_axes:
        out = shp.expand_dims(out, axis=new_axes)
    return out


# --------------------------------------------------------------------------- variables

class Variable:
    """A layer weight: a named Workspace entry and the parameter Value programs read it through."""

    def __init__(self, initial: np.ndarray, *, name: str, path: str, trainable: bool = True,
                 regularizer: Any = None, constraint: Any = None, workspace: Optional[Workspace] = None):
        self.workspace = workspace if workspace is not None else get_workspace()
        self.name = name
        self.trainable = trainable
        self.regularizer = regularizer
        self.constraint = constraint
        self.path = self._free_path(path)
        arr = np.asarray(initial)
        self.workspace.set(self.path, arr.copy())
        self.value = param_value(self.path, TensorType(arr.shape, DType(arr.dtype)))

    def _free_path(self, path: str) -> str:
        candidate = path
        while candidate in self.workspace:
            candidate = f"{path}#{next(_variable_ids)}"
        return candidate

    def __cgvm_value__(self) -> Value:
        return self.value

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self.value.shape)

    @property
    def dtype(self) -> str:
        return self.value.dtype.name

    def numpy(self) -> np.ndarray:
        return host_array(self.workspace[self.path]).copy()

    def assign(self, value: Any) -> None:
        arr = np.asarray(value, dtype=self.value.dtype.np)
        if arr.shape != self.shape:
            from ...errors import ShapeError

            raise ShapeError(f"variable {self.path!r} has shape {self.shape}, got a value of shape {arr.shape}")
        self.workspace.set(self.path, arr.copy())

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def __repr__(self) -> str:
        return f"<Variable path={self.path}, shape={self.shape}, dtype={self.dtype}>"

    # operators inside a layer's call (custom layers write ``x @ self.w + self.b``)
    def _wrap(self) -> KerasTensor:
        return KerasTensor(self.value)

    def __add__(self, o): return self._wrap() + o
    def __radd__(self, o): return apply_operation_r(ew.add, o, self._wrap())
    def __sub__(self, o): return self._wrap() - o
    def __rsub__(self, o): return apply_operation_r(ew.sub, o, self._wrap())
    def __mul__(self, o): return self._wrap() * o
    def __rmul__(self, o): return apply_operation_r(ew.mul, o, self._wrap())
    def __truediv__(self, o): return self._wrap() / o
    def __matmul__(self, o): return self._wrap() @ o
    def __rmatmul__(self, o): return apply_operation_r(linalg.matmul, o, self._wrap())
    def __neg__(self): return -self._wrap()
    def __getitem__(self, key): return self._wrap()[key]


# --------------------------------------------------------------------------- build scope

@dataclass
class BuildScope:
    """What a graph is being built for, and what its layers emit besides their outputs."""

    training: bool = False
    seed: Optional[Value] = None
    updates: Dict[str, Tuple[Value, Value]] = field(default_factory=dict)  # path -> (param, new value)
    # like ``updates`` but applied by every program, not only training steps (stateful RNN states)
    state_updates: Dict[str, Tuple[Value, Value]] = field(default_factory=dict)
    losses: List[Value] = field(default_factory=list)
    _seed_offsets: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def next_seed(self) -> Optional[Value]:
        """A distinct int64 seed Value per random layer call, derived from the step's seed input."""
        if self.seed is None:
            return None
        return ew.add(self.seed, np.int64(next(self._seed_offsets) * 1_000_003))


_scope: ContextVar[Optional[BuildScope]] = ContextVar("keras_build_scope", default=None)
_call_depth: ContextVar[int] = ContextVar("keras_call_depth", default=0)


def current_scope() -> BuildScope:
    s = _scope.get()
    return s if s is not None else _INFERENCE


_INFERENCE = BuildScope()


@contextmanager
def build_scope(scope: BuildScope) -> Iterator[BuildScope]:
    token = _scope.set(scope)
    try:
        yield scope
    finally:
        _scope.reset(token)


@contextmanager
def inside_call() -> Iterator[None]:
    """Layer calls nested in another layer's call (or in a model replay) are not recorded."""
    token = _call_depth.set(_call_depth.get() + 1)
    try:
        yield
    finally:
        _call_depth.reset(token)


def recording() -> bool:
    return _call_depth.get() == 0


def flatten(structure: Any) -> List[Any]:
    """Leaves of nested lists, tuples and dicts (dicts in key order as given)."""
    if isinstance(structure, (list, tuple)):
        return [leaf for item in structure for leaf in flatten(item)]
    if isinstance(structure, dict):
        return [leaf for item in structure.values() for leaf in flatten(item)]
    return [structure]


def map_structure(fn: Any, structure: Any) -> Any:
    if isinstance(structure, list):
        return [map_structure(fn, s) for s in structure]
    if isinstance(structure, tuple):
        return tuple(map_structure(fn, s) for s in structure)
    if isinstance(structure, dict):
        return {k: map_structure(fn, s) for k, s in structure.items()}
    return fn(structure)


def shape_of(x: Any) -> Any:
    """The Keras input_shape of a structure of tensors: a tuple, or a list of tuples."""
    if isinstance(x, (list, tuple)):
        return [shape_of(i) for i in x]
    if isinstance(x, dict):
        return {k: shape_of(i) for k, i in x.items()}
    return tuple(to_value(x).shape)


def as_array(x: Any) -> np.ndarray:
    return host_array(x)
