"""Theano's symbolic types and variables over cgvm's IR.

A ``TensorVariable`` wraps one ``cgvm.ir.Value`` and records new nodes through Python operators,
so ``x * w + b`` builds IR while the user writes Theano. ``__cgvm_value__`` lets every cgvm op
take a variable directly. Two wrappers of one Value are the same variable (equality and hashing
follow the Value), because Theano code keys dicts (``givens``, ``updates``) by variable. As in
Theano, ``==`` is identity, not an elementwise comparison: use ``T.eq``.

``TensorType`` is Theano's type object: a dtype and a static shape where ``1`` marks a
broadcastable dimension and ``None`` an unknown one; calling it makes a new input variable.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence, Tuple

import numpy as np

from ...errors import GraphBuildError
from ...ir.graph import CONST, INPUT, PARAM, Value, const_value, input_value
from ...ir.types import DType
from ...ir.types import TensorType as IRType
from .config import config

#: dtype letter prefixes of Theano's constructors (fvector, imatrix, ...); complex types are not supported
DTYPE_PREFIX = {"b": "int8", "w": "int16", "i": "int32", "l": "int64", "f": "float32", "d": "float64"}


def float_x() -> str:
    return config.floatX


class TensorType:
    """Theano's tensor type: ``TensorType('float32', broadcastable=(False, True))`` or ``shape=(None, 1)``."""

    def __init__(self, dtype: Any = None, broadcastable: Optional[Sequence[bool]] = None,
                 name: Optional[str] = None, shape: Optional[Sequence[Optional[int]]] = None):
        self.dtype = DType(float_x() if dtype in (None, "floatX") else dtype).name
        if shape is None:
            if broadcastable is None:
                raise TypeError("TensorType needs broadcastable= or shape=")
            shape = tuple(1 if b else None for b in broadcastable)
        elif broadcastable is not None:
            if len(broadcastable) != len(shape):
                raise TypeError("broadcastable and shape must have the same length")
            shape = tuple(1 if b else s for b, s in zip(broadcastable, shape))
        self.shape: Tuple[Optional[int], ...] = tuple(None if s is None else int(s) for s in shape)
        self.name = name

    @classmethod
    def from_ir(cls, t: IRType) -> "TensorType":
        return cls(t.dtype.name, shape=t.shape)

    def ir(self) -> IRType:
        return IRType(self.shape, self.dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def broadcastable(self) -> Tuple[bool, ...]:
        return tuple(s == 1 for s in self.shape)

    def __call__(self, name: Optional[str] = None) -> "TensorVariable":
        return TensorVariable(input_value(self.ir(), name), name=name)

    def make_variable(self, name: Optional[str] = None) -> "TensorVariable":
        return self(name)

    def filter(self, data: Any, strict: bool = False, allow_downcast: Optional[bool] = None) -> np.ndarray:
        """``data`` as an array of this type; raises TypeError when it does not fit."""
        return convert_input(data, self.ir(), strict=strict, allow_downcast=allow_downcast, what="value")

    def is_valid_value(self, data: Any) -> bool:
        try:
            self.filter(data, strict=True)
            return True
        except (TypeError, ValueError):
            return False

    def clone(self, dtype: Any = None, broadcastable: Optional[Sequence[bool]] = None,
              shape: Optional[Sequence[Optional[int]]] = None) -> "TensorType":
        if broadcastable is not None and shape is None:
            shape = tuple(1 if b else None for b in broadcastable)
        return TensorType(self.dtype if dtype is None else dtype, shape=self.shape if shape is None else shape)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorType) and other.dtype == self.dtype and other.shape == self.shape

    def __hash__(self) -> int:
        return hash((self.dtype, self.shape))

    def __repr__(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"TensorType({self.dtype}, shape=({dims}{',' if self.ndim == 1 else ''}))"


def convert_input(data: Any, want: IRType, *, strict: bool = False, allow_downcast: Optional[bool] = None,
                  what: str = "input") -> np.ndarray:
    """Theano's ``filter``: a NumPy array of ``want``'s dtype and rank, or TypeError.

    strict: the dtype must match exactly. allow_downcast True: any cast; None: python scalars and
    floats into a floatX tensor may be downcast, arrays only by safe casts; False: safe casts only.
    """
    dtype = want.dtype.np
    if isinstance(data, np.ndarray) and data.dtype == dtype:
        arr = data
    elif strict:
        raise TypeError(f"{what} must be an array of dtype {dtype.name}, got "
                        f"{getattr(data, 'dtype', type(data).__name__)} (strict=True)")
    else:
        is_python = isinstance(data, (int, float, bool, list, tuple))
        arr = np.asarray(data)
        if arr.dtype != dtype:
            if allow_downcast:
                arr = arr.astype(dtype)
            elif np.can_cast(arr.dtype, dtype, "safe"):
                arr = arr.astype(dtype)
            elif (allow_downcast is None and is_python and arr.dtype.kind in "iub"
                  and np.asarray(arr.astype(dtype) == arr).all()):
                arr = arr.astype(dtype)  # python ints that fit: Theano accepts them
            elif (allow_downcast is None and arr.ndim == 0 and arr.dtype.kind == "f" and dtype.kind == "f"
                  and (dtype.name == float_x() or (is_python and arr.astype(dtype) == arr))):
                arr = arr.astype(dtype)  # a python/0-d float into a floatX scalar, or one it holds exactly
            else:
                raise TypeError(
                    f"{what}: cannot convert {arr.dtype.name} data to {dtype.name} without losing "
                    "precision; cast it (e.g. numpy.asarray(x, dtype=...)) or pass "
                    "allow_input_downcast=True to function()")
    if arr.ndim != len(want.shape):
        raise TypeError(f"{what}: wrong number of dimensions: expected {len(want.shape)}, got {arr.ndim} "
                        f"with shape {arr.shape}")
    for i, (d, s) in enumerate(zip(want.shape, arr.shape)):
        if d is not None and d != s:
            raise TypeError(f"{what}: dimension {i} must have length {d} (it is broadcastable or fixed), "
                            f"got shape {arr.shape}")
    return arr


class _Tag:
    """``var.tag``: a free attribute bag (``test_value``, ``trace``)."""


class TensorVariable:
    """A symbolic tensor; wraps a cgvm ``Value``."""

    __array_priority__ = 1000
    __array_ufunc__ = None  # numpy defers to our reflected operators: ``ndarray + var`` is symbolic

    def __init__(self, value: Value, name: Optional[str] = None):
        self._value = value
        self._name = name if name is not None else value.name if value.kind != PARAM else None
        if name is not None and value.kind != PARAM:
            value.name = name
        self.tag = _Tag()

    # -- identity ------------------------------------------------------------------
    def __cgvm_value__(self) -> Value:
        return self._value

    @property
    def value(self) -> Value:
        """The cgvm IR value underneath."""
        return self._value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorVariable) and other._value is self._value

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return id(self._value)

    # -- type ----------------------------------------------------------------------
    @property
    def name(self) -> Optional[str]:
        return self._name

    @name.setter
    def name(self, name: Optional[str]) -> None:
        self._name = name
        if self._value.kind != PARAM:
            self._value.name = name

    @property
    def type(self) -> TensorType:
        return TensorType.from_ir(self._value.type)

    @property
    def dtype(self) -> str:
        return self._value.dtype.name

    @property
    def ndim(self) -> int:
        return self._value.ndim

    @property
    def broadcastable(self) -> Tuple[bool, ...]:
        return tuple(d == 1 for d in self._value.shape)

    @property
    def owner(self) -> Any:
        return self._value.node

    def __repr__(self) -> str:
        return self._name or f"<TensorVariable {self._value.type!r}>"

    __str__ = __repr__

    #: Theano 1.0: every variable is true (``if not W:`` tests an optional argument for None),
    #: except results of ``<``, ``<=``, ``>``, ``>=``, whose truth would silently mean
    #: ``a < b < c``; those raise
    _is_nonzero = True

    def __bool__(self) -> bool:
        if self._is_nonzero:
            return True
        raise TypeError("a symbolic comparison has no truth value (chained comparisons such as a < b < c "
                        "do not work on variables); use T.and_, T.switch or ifelse")

    def __iter__(self):
        n = self._value.shape[0] if self.ndim else None
        if n is None:
            raise TypeError("TensorType does not support iteration: the length of the first dimension "
                            "is not known when the graph is built")
        for i in range(n):
            yield self[i]

    def __len__(self) -> int:
        raise TypeError("symbolic variables have no len(); use x.shape[0]")

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("_fn_cache", None)  # compiled functions of ``eval``: rebuilt on demand
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    # -- operators (delegated to the tensor namespace) -----------------------------
    def __add__(self, o): return _T().add(self, o)
    def __radd__(self, o): return _T().add(o, self)
    def __sub__(self, o): return _T().sub(self, o)
    def __rsub__(self, o): return _T().sub(o, self)
    def __mul__(self, o): return _T().mul(self, o)
    def __rmul__(self, o): return _T().mul(o, self)
    def __truediv__(self, o): return _T().true_div(self, o)
    def __rtruediv__(self, o): return _T().true_div(o, self)
    def __floordiv__(self, o): return _T().int_div(self, o)
    def __rfloordiv__(self, o): return _T().int_div(o, self)
    def __mod__(self, o): return _T().mod(self, o)
    def __rmod__(self, o): return _T().mod(o, self)
    def __pow__(self, o): return _T().pow(self, o)
    def __rpow__(self, o): return _T().pow(o, self)
    def __neg__(self): return _T().neg(self)
    def __pos__(self): return self
    def __abs__(self): return _T().abs(self)
    def __lt__(self, o): return _comparison(_T().lt(self, o))
    def __le__(self, o): return _comparison(_T().le(self, o))
    def __gt__(self, o): return _comparison(_T().gt(self, o))
    def __ge__(self, o): return _comparison(_T().ge(self, o))
    def __invert__(self): return _T().invert(self)
    def __and__(self, o): return _T().and_(self, o)
    def __rand__(self, o): return _T().and_(o, self)
    def __or__(self, o): return _T().or_(self, o)
    def __ror__(self, o): return _T().or_(o, self)
    def __xor__(self, o): return _T().xor(self, o)
    def __rxor__(self, o): return _T().xor(o, self)
    def __matmul__(self, o): return _T().dot(self, o)
    def __rmatmul__(self, o): return _T().dot(o, self)

    def __getitem__(self, index):
        from . import subtensor

        return subtensor.getitem(self, index)

    # -- methods -------------------------------------------------------------------
    def sum(self, axis=None, dtype=None, keepdims=False, acc_dtype=None):
        return _T().sum(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def mean(self, axis=None, dtype=None, keepdims=False, acc_dtype=None):
        return _T().mean(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def prod(self, axis=None, dtype=None, keepdims=False, acc_dtype=None):
        return _T().prod(self, axis=axis, dtype=dtype, keepdims=keepdims)

    def max(self, axis=None, keepdims=False): return _T().max(self, axis=axis, keepdims=keepdims)
    def min(self, axis=None, keepdims=False): return _T().min(self, axis=axis, keepdims=keepdims)
    def argmax(self, axis=None, keepdims=False): return _T().argmax(self, axis=axis, keepdims=keepdims)
    def argmin(self, axis=None, keepdims=False): return _T().argmin(self, axis=axis, keepdims=keepdims)
    def var(self, axis=None, ddof=0, keepdims=False, corrected=False):
        return _T().var(self, axis=axis, ddof=ddof, keepdims=keepdims, corrected=corrected)
    def std(self, axis=None, ddof=0, keepdims=False, corrected=False):
        return _T().std(self, axis=axis, ddof=ddof, keepdims=keepdims, corrected=corrected)
    def all(self, axis=None, keepdims=False): return _T().all(self, axis=axis, keepdims=keepdims)
    def any(self, axis=None, keepdims=False): return _T().any(self, axis=axis, keepdims=keepdims)
    def norm(self, L, axis=None, keepdims=False): return _T().norm(self, L, axis=axis, keepdims=keepdims)

    def reshape(self, shape, ndim=None):
        return _T().reshape(self, shape, ndim=ndim)

    def dimshuffle(self, *pattern):
        if len(pattern) == 1 and isinstance(pattern[0], (list, tuple)):
            pattern = tuple(pattern[0])
        return _T().dimshuffle(self, pattern)

    def flatten(self, ndim=1, outdim=None): return _T().flatten(self, ndim if outdim is None else outdim)
    def ravel(self): return _T().flatten(self, 1)
    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (list, tuple)):
            axes = tuple(axes[0])
        return _T().transpose(self, axes or None)

    @property
    def T(self): return _T().transpose(self)

    def swapaxes(self, a, b): return _T().swapaxes(self, a, b)
    def squeeze(self, axis=None): return _T().squeeze(self, axis)
    def astype(self, dtype): return _T().cast(self, dtype)
    def dot(self, o): return _T().dot(self, o)
    def __dot__(self, o): return _T().dot(self, o)
    def __rdot__(self, o): return _T().dot(o, self)
    def clip(self, a_min, a_max): return _T().clip(self, a_min, a_max)
    def round(self, mode=None): return _T().round(self, mode)
    def sort(self, axis=-1, kind="quicksort", order=None): return _T().sort(self, axis)
    def argsort(self, axis=-1, kind="quicksort", order=None): return _T().argsort(self, axis)
    def cumsum(self, axis=None): return _T().cumsum(self, axis)
    def cumprod(self, axis=None): return _T().cumprod(self, axis)
    def repeat(self, repeats, axis=None): return _T().repeat(self, repeats, axis)
    def take(self, indices, axis=None, mode="raise"): return _T().take(self, indices, axis)
    def nonzero(self, return_matrix=False): return _T().nonzero(self, return_matrix)
    def diagonal(self, offset=0, axis1=0, axis2=1): return _T().diagonal(self, offset, axis1, axis2)
    def trace(self): return _T().trace(self)
    def copy(self, name=None):
        out = _T().tensor_copy(self)
        out.name = name
        return out
    def zeros_like(self, dtype=None): return _T().zeros_like(self, dtype)
    def ones_like(self, dtype=None): return _T().ones_like(self, dtype)
    def exp(self): return _T().exp(self)
    def log(self): return _T().log(self)
    def sqrt(self): return _T().sqrt(self)
    def conj(self): return self

    @property
    def shape(self): return _T().shape(self)

    @property
    def size(self): return _T().prod(_T().shape(self))

    def eval(self, inputs_to_values: Optional[dict] = None):
        """Compile (once per set of inputs, cached) and run this expression."""
        from .function import function

        inputs_to_values = inputs_to_values or {}
        keys = tuple(inputs_to_values)
        cache = self.__dict__.setdefault("_fn_cache", {})
        fn = cache.get(keys)
        if fn is None:
            fn = cache[keys] = function(list(keys), self, on_unused_input="ignore")
        return fn(*[inputs_to_values[k] for k in keys])


class TensorConstant(TensorVariable):
    """A constant; ``.data`` / ``.value`` hold the array (read-only)."""

    @property
    def data(self) -> np.ndarray:
        return self._value.data

    def eval(self, inputs_to_values: Optional[dict] = None):
        return np.array(self._value.data, copy=True)

    def __repr__(self) -> str:
        return self._name or f"TensorConstant{{{np.array2string(self._value.data, threshold=6)}}}"

    __str__ = __repr__


# ----------------------------------------------------------------------------- wrapping


def _comparison(result: TensorVariable) -> TensorVariable:
    result._is_nonzero = False
    return result


def _T():
    from . import tensor

    return tensor


#: SharedVariable objects by the workspace key of their parameter Value (set by shared.py)
SHARED_BY_VALUE: dict = {}


def wrap(value: Value) -> TensorVariable:
    """The variable for a cgvm Value (a SharedVariable for a shared parameter)."""
    if value.kind == CONST:
        return TensorConstant(value)
    if value.kind == PARAM:
        hit = SHARED_BY_VALUE.get(id(value))
        if hit is not None:
            obj = hit()
            if obj is not None:
                return obj
    return TensorVariable(value)


def unwrap(x: Any) -> Value:
    """The cgvm Value of ``x``: a variable, a Value, or a Python/NumPy constant."""
    if isinstance(x, TensorVariable):
        return x._value
    if isinstance(x, Value):
        return x
    return constant(x)._value


def constant(x: Any, name: Optional[str] = None, ndim: Optional[int] = None, dtype: Any = None) -> TensorConstant:
    """``T.constant``: python ints take the smallest int type that holds them, floats ``floatX`` (Theano's casts)."""
    if isinstance(x, TensorVariable):
        x = _const_data(x)
    if dtype is not None:
        arr = np.asarray(x, dtype=DType(dtype).np)
    else:
        arr = np.asarray(x)
        if arr.dtype == object:
            raise GraphBuildError(f"cannot make a constant from {type(x).__name__} {x!r}")
        if not isinstance(x, (np.ndarray, np.generic)):
            arr = _autocast(arr)
    if ndim is not None:
        if arr.ndim > ndim:
            raise ValueError(f"constant of rank {arr.ndim} cannot have ndim={ndim}")
        arr = arr.reshape((1,) * (ndim - arr.ndim) + arr.shape)
    out = TensorConstant(const_value(arr, arr.dtype))
    if name is not None:
        out.name = name
    return out


def _autocast(arr: np.ndarray) -> np.ndarray:
    if arr.dtype.kind == "f":
        fx = np.dtype(float_x())
        if arr.ndim == 0 and fx == np.float64 and arr.astype(np.float32) == arr:
            return arr.astype(np.float32)  # Theano's autocast: the smallest float that holds it exactly
        if fx != arr.dtype and np.all(arr.astype(fx) == arr):
            return arr.astype(fx)
        return arr.astype(fx) if fx == np.float32 and arr.ndim == 0 else arr
    if arr.dtype.kind in "iu" and arr.size:
        for d in (np.int8, np.int16, np.int32, np.int64):
            info = np.iinfo(d)
            if arr.min() >= info.min and arr.max() <= info.max:
                return arr.astype(d)
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64)
    return arr


def _const_data(x: TensorVariable) -> np.ndarray:
    if x._value.kind != CONST:
        raise TypeError(f"{x!r} is not a constant")
    return x._value.data


def as_tensor_variable(x: Any, name: Optional[str] = None, ndim: Optional[int] = None) -> TensorVariable:
    """A variable for ``x`` (itself if already symbolic; lists of variables are stacked)."""
    if isinstance(x, TensorVariable):
        if ndim is not None and x.ndim != ndim:
            raise ValueError(f"{x!r} has {x.ndim} dimensions, expected {ndim}")
        return x
    if isinstance(x, Value) or hasattr(x, "__cgvm_value__"):
        return wrap(x if isinstance(x, Value) else x.__cgvm_value__())
    if isinstance(x, (list, tuple)) and any(isinstance(e, TensorVariable) for e in _flat(x)):
        return _T().stack([as_tensor_variable(e) for e in x])
    return constant(x, name=name, ndim=ndim)


def _flat(x: Iterable) -> Iterable:
    for e in x:
        if isinstance(e, (list, tuple)):
            yield from _flat(e)
        else:
            yield e


def is_input(x: TensorVariable) -> bool:
    return x._value.kind == INPUT
