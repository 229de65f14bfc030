"""``T.extra_ops``: cumsum, cumprod, diff, repeat, squeeze, to_one_hot, fill_diagonal."""
from __future__ import annotations

from typing import Any, Optional

from ...ops import indexing as ix
from . import basic as B
from . import shapes as S
from .basic import cumsum  # noqa: F401
from .shapes import cumprod, repeat, squeeze  # noqa: F401
from .subtensor import set_subtensor
from .var import TensorVariable, as_tensor_variable, wrap


def diff(x: Any, n: int = 1, axis: int = -1) -> TensorVariable:
    """n-th discrete difference along ``axis``."""
    out = as_tensor_variable(x)
    ax = axis % out.ndim
    for _ in range(n):
        lo = (slice(None),) * ax + (slice(1, None),)
        hi = (slice(None),) * ax + (slice(None, -1),)
        out = B.sub(out[lo], out[hi])
    return out


def to_one_hot(y: Any, nb_class: int, dtype: Optional[str] = None) -> TensorVariable:
    """A (n, nb_class) matrix with a one at each row's class index."""
    from .config import config

    yv = as_tensor_variable(y)
    return wrap(ix.one_hot(yv.value, depth=int(nb_class), dtype=dtype or config.floatX))


def fill_diagonal(a: Any, val: Any) -> TensorVariable:
    x = as_tensor_variable(a)
    n0, n1 = S._dims(x)
    idx = S.arange(B.minimum(n0, n1))
    return set_subtensor(x[idx, idx], val)


def bincount(x: Any, weights: Any = None, minlength: Optional[int] = None) -> TensorVariable:
    """Counts of each value of a non-negative int vector (length max(x)+1, at least ``minlength``)."""
    xv = as_tensor_variable(x)
    n = B.add(B.max(xv), 1)
    if minlength is not None:
        n = B.maximum(n, int(minlength))
    w = S.ones_like(xv, dtype="int64") if weights is None else as_tensor_variable(weights)
    base = S.zeros([n], dtype=w.dtype)
    from .subtensor import inc_subtensor

    return inc_subtensor(base[xv], w)
