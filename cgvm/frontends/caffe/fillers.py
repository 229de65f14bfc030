"""Caffe's weight fillers (include/caffe/filler.hpp), on NumPy, float32.

`fill(filler_param, shape, rng)` returns a new array. For a blob of shape (d0, d1, ...):
fan_in = count / d0, fan_out = count / d1 (count when there is one axis); xavier and msra use
n = fan_in (FAN_IN, the default), fan_out (FAN_OUT) or their mean (AVERAGE).
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import numpy as np

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeNetError

FILLER_TYPES = ("constant", "uniform", "gaussian", "positive_unitball", "xavier", "msra", "bilinear")


def constant_filler(value: float) -> caffe_pb2.FillerParameter:
    """A FillerParameter of type constant with ``value`` (the defaults some layers use)."""
    filler = caffe_pb2.FillerParameter()
    filler.type = "constant"
    filler.value = value
    return filler


def _fans(shape: Sequence[int]) -> tuple[float, float]:
    count = math.prod(shape)
    fan_in = count / shape[0] if shape and shape[0] else count
    fan_out = count / shape[1] if len(shape) > 1 and shape[1] else count
    return fan_in, fan_out


def _variance_n(param: caffe_pb2.FillerParameter, shape: Sequence[int]) -> float:
    fan_in, fan_out = _fans(shape)
    if param.variance_norm == caffe_pb2.FillerParameter.FAN_OUT:
        return fan_out
    if param.variance_norm == caffe_pb2.FillerParameter.AVERAGE:
        return (fan_in + fan_out) / 2.0
    return fan_in


def check_filler(param: Optional[caffe_pb2.FillerParameter], shape: Sequence[int],
                 error: Callable[[str], Exception] = CaffeNetError) -> None:
    """Raise ``error(message)`` unless ``param`` can fill a blob of ``shape``: a known type, finite
    bounds in order, a non-negative std, a positive fan for xavier/msra (checked before any allocation)."""
    if param is None:
        return
    kind = param.type
    if kind not in FILLER_TYPES:
        raise error(f"unknown filler type {kind!r}; Caffe's fillers are {', '.join(FILLER_TYPES)}")
    if param.sparse >= 0 and kind != "gaussian" and param.HasField("sparse"):
        raise error(f"filler {kind!r} does not take `sparse`; only gaussian fillers are sparse")
    values = {"constant": ("value",), "uniform": ("min", "max"), "gaussian": ("mean", "std")}.get(kind, ())
    for field in values:
        if not math.isfinite(getattr(param, field)):
            raise error(f"{kind} filler: {field} is {getattr(param, field)}; give a finite number")
    if kind == "uniform" and param.min > param.max:
        raise error(f"uniform filler: min {param.min:g} is above max {param.max:g}")
    if kind == "gaussian" and param.std < 0:
        raise error(f"gaussian filler: std {param.std:g} is negative")
    if kind in ("xavier", "msra"):
        try:
            n = _variance_n(param, shape)
        except OverflowError:
            raise error(f"{kind} filler: the blob {tuple(shape)} is too large to compute its fan") from None
        if not n > 0:
            raise error(f"{kind} filler: the blob {tuple(shape)} has fan {n:g}, so its scale would divide by "
                        "zero; give the layer a non-empty blob or another filler")
    if kind == "bilinear" and (len(shape) != 4 or shape[2] != shape[3]):
        raise error(f"the bilinear filler needs a 4-D blob with a square kernel, got {tuple(shape)}")


def fill(param: Optional[caffe_pb2.FillerParameter], shape: Sequence[int],
         rng: np.random.Generator) -> np.ndarray:
    """A new float32 array of ``shape`` filled as ``param`` says (None: constant 0, Caffe's default)."""
    shape = tuple(int(d) for d in shape)
    if param is None:
        return np.zeros(shape, np.float32)
    check_filler(param, shape)
    kind = param.type
    if param.sparse >= 0 and kind != "gaussian" and param.HasField("sparse"):
        raise CaffeNetError(f"filler {kind!r} does not take `sparse`; only gaussian fillers are sparse")
    if kind == "constant":
        return np.full(shape, param.value, np.float32)
    if kind == "uniform":
        return rng.uniform(param.min, param.max, shape).astype(np.float32)
    if kind == "gaussian":
        data = rng.normal(param.mean, param.std, shape).astype(np.float32)
        if param.sparse >= 0:
            # each element is kept with probability sparse / num_outputs (Caffe: sparse / d0)
            if len(shape) < 1:
                raise CaffeNetError("a sparse gaussian filler needs a blob with at least one axis")
            keep = param.sparse / shape[0] if shape[0] else 0.0
            data *= rng.random(shape) < keep
        return data
    if kind == "positive_unitball":
        data = rng.uniform(0.0, 1.0, shape).astype(np.float32)
        if data.ndim >= 1 and shape[0]:
            rows = data.reshape(shape[0], -1)
            rows /= rows.sum(axis=1, keepdims=True)
        return data
    if kind == "xavier":
        scale = math.sqrt(3.0 / _variance_n(param, shape))
        return rng.uniform(-scale, scale, shape).astype(np.float32)
    if kind == "msra":
        std = math.sqrt(2.0 / _variance_n(param, shape))
        return rng.normal(0.0, std, shape).astype(np.float32)
    if kind == "bilinear":
        return bilinear_weights(shape)
    raise CaffeNetError(f"unknown filler type {kind!r}; Caffe's fillers are {', '.join(FILLER_TYPES)}")


def bilinear_weights(shape: Sequence[int]) -> np.ndarray:
    """Caffe's bilinear upsampling kernel, the same for every (out, in) pair of a 4-D blob."""
    if len(shape) != 4 or shape[2] != shape[3]:
        raise CaffeNetError(f"the bilinear filler needs a 4-D blob with a square kernel, got {tuple(shape)}")
    k = shape[3]
    f = math.ceil(k / 2.0)
    c = (k - 1) / (2.0 * f)
    axis = 1.0 - np.abs(np.arange(k) / f - c)
    kernel = np.outer(axis, axis).astype(np.float32)
    return np.broadcast_to(kernel, tuple(shape)).copy()
