"""Types of IR values: DType (a named NumPy dtype) and TensorType (shape with unknown dims + dtype)."""
from __future__ import annotations

from typing import Iterable, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import DTypeError

Dim = Optional[int]
Shape = Tuple[Dim, ...]


class DType:
    """A tensor element type. Interned: ``DType("float32") is float32``."""

    __slots__ = ("name", "np", "itemsize", "kind")
    _interned: dict = {}

    def __new__(cls, spec: "DTypeLike") -> "DType":
        if isinstance(spec, DType):
            return spec
        try:
            npd = np.dtype(spec)
        except TypeError as exc:
            raise DTypeError(f"not a dtype: {spec!r}") from exc
        hit = cls._interned.get(npd.name)
        if hit is not None:
            return hit
        if npd.name not in _SUPPORTED:
            raise DTypeError(f"dtype {npd.name!r} is not supported; use one of {sorted(_SUPPORTED)}")
        self = object.__new__(cls)
        self.name = npd.name
        self.np = npd
        self.itemsize = npd.itemsize
        self.kind = _STORAGE_KINDS.get(npd.name, npd.kind)  # 'f' float, 'i' signed, 'u' unsigned, 'b' bool
        cls._interned[npd.name] = self
        return self

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self):
        return (DType, (self.name,))


_SUPPORTED = {"float16", "float32", "float64", "int8", "int16", "int32", "int64",
              "uint8", "uint16", "uint32", "uint64", "bool"}

#: narrow storage formats ONNX models carry (bfloat16, float8, int4, ...), NumPy dtypes from the
#: ml_dtypes package where it is installed (onnx depends on it); their kind as the IR sees it
_STORAGE_KINDS = {"bfloat16": "f", "float8_e4m3fn": "f", "float8_e4m3fnuz": "f", "float8_e5m2": "f",
                  "float8_e5m2fnuz": "f", "float8_e8m0fnu": "f", "float4_e2m1fn": "f", "int4": "i", "uint4": "u",
                  "int2": "i", "uint2": "u"}
try:
    import ml_dtypes as _ml_dtypes  # noqa: F401  (registers the dtypes with NumPy)

    _SUPPORTED.update(_STORAGE_KINDS)
except ImportError:  # pragma: no cover - without ml_dtypes only NumPy's own dtypes exist
    pass

DTypeLike = Union[DType, str, type, np.dtype]

float16 = DType("float16")
float32 = DType("float32")
float64 = DType("float64")
int8 = DType("int8")
int16 = DType("int16")
int32 = DType("int32")
int64 = DType("int64")
uint8 = DType("uint8")
bool_ = DType("bool")


def result_dtype(*dtypes: DType) -> DType:
    """NumPy's promotion of array dtypes (no value-based casting)."""
    if len(dtypes) == 1:
        return dtypes[0]
    return DType(np.result_type(*[d.np for d in dtypes]))


class TensorType:
    """Shape and dtype of a value. A dimension of ``None`` is unknown until run time."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Iterable[Dim], dtype: DTypeLike = "float32"):
        self.shape: Shape = tuple(None if d is None else int(d) for d in shape)
        self.dtype: DType = DType(dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_concrete(self) -> bool:
        return None not in self.shape

    @property
    def size(self) -> Optional[int]:
        if not self.is_concrete:
            return None
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> Optional[int]:
        n = self.size
        return None if n is None else n * self.dtype.itemsize

    def with_shape(self, shape: Sequence[Dim]) -> "TensorType":
        return TensorType(shape, self.dtype)

    def with_dtype(self, dtype: DTypeLike) -> "TensorType":
        return TensorType(self.shape, dtype)

    def accepts(self, shape: Sequence[int], dtype: DType) -> bool:
        """Whether a concrete array of this shape and dtype may stand for this type."""
        if len(shape) != len(self.shape) or dtype is not self.dtype:
            return False
        return all(d is None or d == s for d, s in zip(self.shape, shape))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorType) and self.shape == other.shape and self.dtype is other.dtype

    def __hash__(self) -> int:
        return hash((self.shape, self.dtype.name))

    def __repr__(self) -> str:
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype.name}[{dims}]"


def shape_str(shape: Sequence[Dim]) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
