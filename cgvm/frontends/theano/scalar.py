"""``theano.scalar``: Theano's scalar dtypes and its ``upcast`` rule.

Scripts use this module for dtype arithmetic (``theano.scalar.upcast(a.dtype, b.dtype)``) and
scalar type objects (``theano.scalar.float32``); a scalar type called makes a 0-d variable.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .config import config
from .var import TensorType, TensorVariable, as_tensor_variable

__all__ = ["upcast", "Scalar", "ScalarType", "get_scalar_type", "as_scalar", "constant"]


def upcast(dtype: Any, *dtypes: Any) -> str:
    """The dtype of combining ``dtype`` and ``dtypes``, kept in ``floatX`` unless float64 is asked for.

    NumPy's promotion of 0-d arrays, then Theano's twist: a float64 result is brought back to
    float32 (float16) when ``floatX`` is float32 (float16) and no operand was float64 itself.
    """
    names = [np.dtype(d).name for d in (dtype,) + dtypes]
    rval = np.result_type(*[np.zeros((), n) for n in names]).name
    explicit64 = "float64" in names
    if rval == "float64" and not explicit64 and config.floatX in ("float32", "float16"):
        if config.floatX == "float16" and "float32" not in names:
            return "float16"
        return "float32"
    if rval == "float32" and config.floatX == "float16" and "float32" not in names:
        return "float16"
    return rval


class Scalar:
    """A scalar type: ``Scalar('float32')``; calling it makes a 0-d variable of that dtype."""

    def __init__(self, dtype: Any):
        self.dtype = config.floatX if dtype == "floatX" else np.dtype(dtype).name
        self.ndim = 0
        self.broadcastable = ()

    def __call__(self, name: Optional[str] = None) -> TensorVariable:
        return TensorType(self.dtype, shape=())(name)

    make_variable = __call__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Scalar) and other.dtype == self.dtype

    def __hash__(self) -> int:
        return hash(("scalar", self.dtype))

    def __repr__(self) -> str:
        return f"Scalar({self.dtype})"


ScalarType = Scalar


def get_scalar_type(dtype: Any) -> Scalar:
    return Scalar(dtype)


def as_scalar(x: Any, name: Optional[str] = None) -> TensorVariable:
    """``x`` as a 0-d variable (TypeError if it has dimensions)."""
    v = as_tensor_variable(x, name=name)
    if v.ndim != 0:
        raise TypeError(f"as_scalar: {v!r} has {v.ndim} dimensions")
    return v


def constant(x: Any, name: Optional[str] = None) -> TensorVariable:
    return as_scalar(x, name=name)


for _name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
              "float64", "bool"):
    globals()[_name] = Scalar(_name)
int_types = tuple(Scalar(d) for d in ("int8", "int16", "int32", "int64"))
uint_types = tuple(Scalar(d) for d in ("uint8", "uint16", "uint32", "uint64"))
float_types = tuple(Scalar(d) for d in ("float16", "float32", "float64"))
discrete_types = int_types + uint_types
continuous_types = float_types
all_types = discrete_types + continuous_types
