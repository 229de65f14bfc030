"""``theano.shared``: variables whose storage lives in the Workspace, shared by every function.

A shared variable is a parameter Value (``cgvm.ir.param_value``) bound by name to a Workspace
entry; every compiled function reads it from there and writes its updates back there, so an
update made by one function is seen by all. Names in the Workspace are generated to be unique
(``W``, ``W_1``...); the user's ``name`` stays the variable's name for printing.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Optional, Sequence

import numpy as np

from ...ir.graph import PARAM, Value, param_value
from ...ir.types import DType
from ...ir.types import TensorType as IRType
from ...vm.workspace import Workspace, default_workspace
from .var import SHARED_BY_VALUE, TensorVariable, convert_input

_counter = itertools.count()


def _unique_key(ws: Workspace, name: Optional[str]) -> str:
    base = f"theano.{name}" if name else "theano.shared"
    if base not in ws:
        return base
    while True:
        key = f"{base}_{next(_counter)}"
        if key not in ws:
            return key


class SharedVariable(TensorVariable):
    """A symbolic variable with a value held in the Workspace."""

    def __init__(self, value: np.ndarray, name: Optional[str] = None, *, workspace: Optional[Workspace] = None,
                 shape: Optional[Sequence[Optional[int]]] = None, strict: bool = False,
                 allow_downcast: Optional[bool] = None):
        ws = workspace if workspace is not None else default_workspace()
        self.workspace = ws
        self.key = _unique_key(ws, name)
        ir_shape = tuple(shape) if shape is not None else (None,) * value.ndim
        super().__init__(param_value(self.key, IRType(ir_shape, DType(value.dtype))), name=name)
        ws.set(self.key, value)
        self.strict = strict
        self.allow_downcast = allow_downcast
        self.default_update: Optional[TensorVariable] = None
        SHARED_BY_VALUE[id(self._value)] = weakref.ref(self, _forget(id(self._value)))

    # -- value access ------------------------------------------------------------------
    def get_value(self, borrow: bool = False, return_internal_type: bool = False) -> Any:
        arr = self.workspace[self.key]
        if borrow:
            return arr
        return self.workspace.backend.to_numpy(arr).copy() if not return_internal_type else arr.copy()

    def set_value(self, value: Any, borrow: bool = False) -> None:
        """Store ``value`` (copied unless ``borrow``); its dtype must cast safely and its rank match."""
        arr = convert_input(value, self._value.type, strict=self.strict, allow_downcast=self.allow_downcast,
                            what=f"set_value of shared variable {self.name or self.key!r}")
        if not borrow and arr is value:
            arr = np.array(arr, copy=True)
        self.workspace.set(self.key, arr)

    @property
    def container(self) -> "SharedVariable":
        return self

    @property
    def storage(self) -> list:
        return [self.get_value(borrow=True)]

    def zero(self, borrow: bool = False) -> None:
        self.set_value(np.zeros_like(self.get_value(borrow=True)), borrow=True)

    def clone(self) -> "SharedVariable":
        """A new shared variable holding a copy of the value."""
        return shared(self.get_value(), name=self.name, workspace=self.workspace)

    def __repr__(self) -> str:
        return self.name or f"<SharedVariable {self.key}>"

    # -- pickling (Theano users ``pickle.dump`` their models) --------------------------
    def __getstate__(self) -> dict:
        """The variable with a copy of its value; the Workspace stays behind."""
        state = super().__getstate__()
        state.pop("workspace", None)
        state["_pickled_array"] = self.workspace.backend.to_numpy(self.workspace[self.key])
        return state

    def __setstate__(self, state: dict) -> None:
        """Back as a new shared variable of the default Workspace, under a fresh entry name.

        The parameter Value is renamed in place, so every node of a graph unpickled with it
        reads the new entry.
        """
        array = state.pop("_pickled_array")
        self.__dict__.update(state)
        ws = default_workspace()
        self.workspace = ws
        self.key = _unique_key(ws, self._name)
        self._value.name = self.key
        ws.set(self.key, array)
        SHARED_BY_VALUE[id(self._value)] = weakref.ref(self, _forget(id(self._value)))

    __str__ = __repr__


def _forget(value_id: int):
    def callback(_ref) -> None:
        SHARED_BY_VALUE.pop(value_id, None)
    return callback


def shared(value: Any, name: Optional[str] = None, strict: bool = False, allow_downcast: Optional[bool] = None,
           borrow: bool = False, broadcastable: Optional[Sequence[bool]] = None,
           shape: Optional[Sequence[Optional[int]]] = None, workspace: Optional[Workspace] = None,
           target: Any = None) -> SharedVariable:
    """A shared variable initialised with ``value`` (copied unless ``borrow=True``).

    As in Theano, the dtype is the value's own (``shared(1.0)`` is float64, not floatX) and the
    static shape is not inferred: every dimension may change with ``set_value`` unless
    ``broadcastable``/``shape`` pin it.
    """
    if isinstance(value, SharedVariable):
        value = value.get_value()
    if isinstance(value, np.random.RandomState) or isinstance(value, np.random.Generator):
        from .random import shared_rng

        return shared_rng(value, name=name, workspace=workspace)
    arr = value if borrow and isinstance(value, np.ndarray) else np.array(value, copy=True)
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"shared: cannot store {type(value).__name__} of dtype {arr.dtype}")
    dims = None
    if shape is not None:
        dims = tuple(shape)
    elif broadcastable is not None:
        dims = tuple(1 if b else None for b in broadcastable)
    if dims is not None:
        if len(dims) != arr.ndim or any(d is not None and d != s for d, s in zip(dims, arr.shape)):
            raise TypeError(f"shared: value of shape {arr.shape} does not fit shape/broadcastable {dims}")
    return SharedVariable(arr, name, workspace=workspace, shape=dims, strict=strict, allow_downcast=allow_downcast)


def is_shared(x: Any) -> bool:
    return isinstance(x, SharedVariable)


def shared_from_workspace(source: Any, workspace: Optional[Workspace] = None,
                          name: Optional[str] = None) -> SharedVariable:
    """The shared variable of an entry already in the Workspace: no copy, one array for both sides.

    ``source`` is the parameter Value a graph reads (a Caffe ``symbolic_net``'s ``params``), an
    object that hands one out through ``__cgvm_value__`` (a Keras weight: its own workspace is
    used unless ``workspace`` is given), or an entry name. Given a Value, the shared variable wraps
    that very Value, so ``grad`` and ``function(updates=...)`` reach the other frontend's graph
    (a second parameter Value of the same name would read the same array but be another leaf for
    ``grad``). Asking again for the same Value or name returns the first shared variable.
    """
    if isinstance(source, str):
        ws = workspace if workspace is not None else default_workspace()
        if source not in ws:
            raise KeyError(f"shared_from_workspace: the workspace has no entry {source!r}")
        for ref in list(SHARED_BY_VALUE.values()):
            known = ref()
            if known is not None and known.key == source and known.workspace is ws:
                return known
        array = ws[source]
        value = param_value(source, IRType(tuple(array.shape), DType(array.dtype)))
    else:
        value = source if isinstance(source, Value) else source.__cgvm_value__()
        if not isinstance(value, Value) or value.kind != PARAM:
            raise TypeError(f"shared_from_workspace: {source!r} is not a parameter (a Workspace entry read by name)")
        ws = workspace if workspace is not None else getattr(source, "workspace", None) or default_workspace()
        if value.name not in ws:
            raise KeyError(f"shared_from_workspace: the workspace has no entry {value.name!r}")
        hit = SHARED_BY_VALUE.get(id(value))
        if hit is not None and hit() is not None:
            return hit()
    var = SharedVariable.__new__(SharedVariable)
    TensorVariable.__init__(var, value, name=name or value.name)
    var.workspace, var.key = ws, value.name
    var.strict, var.allow_downcast, var.default_update = False, None, None
    SHARED_BY_VALUE[id(value)] = weakref.ref(var, _forget(id(value)))
    return var
