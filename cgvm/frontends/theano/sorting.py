"""``T.sort`` / ``T.argsort`` over cgvm's sorting ops (``axis=None`` sorts the flattened tensor)."""
from __future__ import annotations

from typing import Any, Optional

from ...ops import sorting as srt
from .var import TensorVariable, as_tensor_variable, wrap


def _prepare(a: Any, axis: Optional[int]):
    from .shapes import flatten

    x = as_tensor_variable(a)
    if axis is None:
        return flatten(x), -1
    return x, axis


def sort(a: Any, axis: Optional[int] = -1, kind: str = "quicksort", order: Any = None) -> TensorVariable:
    """Values of ``a`` sorted ascending along ``axis``; differentiable."""
    x, axis = _prepare(a, axis)
    return wrap(srt.sort(x.value, axis=axis))


def argsort(a: Any, axis: Optional[int] = -1, kind: str = "quicksort", order: Any = None) -> TensorVariable:
    """int64 positions that sort ``a`` along ``axis``."""
    x, axis = _prepare(a, axis)
    return wrap(srt.argsort(x.value, axis=axis))
