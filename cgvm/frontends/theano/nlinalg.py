"""``T.nlinalg``: the matrix helpers cgvm has ops for (trace, diag, extract_diag)."""
from __future__ import annotations

from typing import Any

from . import shapes as S
from .var import TensorVariable, as_tensor_variable

trace = S.trace
extract_diag = S.diagonal


def diag(x: Any) -> TensorVariable:
    """The diagonal of a matrix, or a diagonal matrix from a vector."""
    v = as_tensor_variable(x)
    if v.ndim == 2:
        return S.diagonal(v)
    return S.eye(S._dims(v)[0], dtype=v.dtype) * v.dimshuffle("x", 0)
