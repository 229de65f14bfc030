"""``theano.tensor.xlogx``: x*log(x) and x*log(y), defined as 0 where x is 0 (entropy terms)."""
from __future__ import annotations

from typing import Any

from . import basic as B
from .var import TensorVariable, as_tensor_variable

__all__ = ["xlogx", "xlogy0"]


def xlogx(x: Any) -> TensorVariable:
    """x * log(x), 0 where x == 0; gradient 1 + log(x)."""
    x = as_tensor_variable(x)
    safe = B.switch(B.eq(x, 0), 1, x)  # log is taken of a positive value only, so no NaN gradient
    return B.switch(B.eq(x, 0), 0, B.mul(x, B.log(safe)))


def xlogy0(x: Any, y: Any) -> TensorVariable:
    """x * log(y), 0 where x == 0 (whatever y is); gradients log(y) and x / y."""
    x, y = as_tensor_variable(x), as_tensor_variable(y)
    safe = B.switch(B.eq(x, 0), 1, y)
    return B.switch(B.eq(x, 0), 0, B.mul(x, B.log(safe)))
