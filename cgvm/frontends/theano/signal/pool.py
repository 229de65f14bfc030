"""``theano.tensor.signal.pool``: pool_2d over the last two axes (max, sum, average with or without padding)."""
from __future__ import annotations

import warnings
from typing import Any, Optional, Sequence

from ....ops import pool as pl
from .. import basic as B
from .. import shapes as S
from ..var import TensorVariable, as_tensor_variable, wrap

MODES = ("max", "sum", "average_inc_pad", "average_exc_pad")


def pool_2d(input: Any, ws: Optional[Sequence[int]] = None, ignore_border: Optional[bool] = None,
            stride: Optional[Sequence[int]] = None, pad: Sequence[int] = (0, 0), mode: str = "max",
            ds: Any = None, st: Any = None, padding: Any = None) -> TensorVariable:
    """Pool windows ``ws`` of the last two axes; ``ignore_border=False`` keeps partial windows (Theano's default)."""
    ws = tuple(ws if ws is not None else ds)
    stride = tuple(stride if stride is not None else (st if st is not None else ws))
    pad = tuple(padding if padding is not None else pad)
    if mode not in MODES:
        raise ValueError(f"pool_2d: mode must be one of {MODES}, got {mode!r}")
    if ignore_border is None:
        warnings.warn("pool_2d: ignore_border is not set; using False (partial windows kept), as Theano does",
                      stacklevel=2)
        ignore_border = False
    if not ignore_border and any(pad):
        raise ValueError("pool_2d: padding requires ignore_border=True")
    x = as_tensor_variable(input)
    if x.ndim < 2:
        raise TypeError("pool_2d needs at least 2 dimensions")
    # cgvm pools NCHW: fold every leading axis into one batch axis and add a channel axis
    lead = S._dims(x)[:-2]
    x4 = x if x.ndim == 4 else S.reshape(x, [-1, 1] + S._dims(x)[-2:])
    attrs = dict(kernel=ws, stride=stride, pad=pad, ceil_mode=not ignore_border)
    if mode == "max":
        out = wrap(pl.max_pool(x4.value, **attrs))
    else:
        out = wrap(pl.avg_pool(x4.value, count_include_pad=mode != "average_exc_pad", **attrs))
        if mode == "sum":
            out = B.mul(out, ws[0] * ws[1])
    if x.ndim != 4:
        out = S.reshape(out, lead + S._dims(out)[-2:])
    return out


def max_pool_2d_same_size(input: Any, patch_size: Sequence[int]) -> TensorVariable:
    """Keep each window's maximum in place and zero the rest."""
    pooled = pool_2d(input, patch_size, ignore_border=True)
    from ..gradient import grad

    x = as_tensor_variable(input)
    return B.mul(grad(None, x, known_grads={pooled: B.ones_like(pooled)}), x)
