"""Convolutions through cuDNN on the CuPy backend, where CuPy offers it; im2col+GEMM otherwise.

``choose(xp, dtype, nsp, pads, direction)`` says which path a convolution takes and, for the
fallback, why (NumPy backend, no cuDNN in this CuPy, ``CGVM_CUDNN=0``, asymmetric padding, a
dtype or rank cuDNN does not take). The three entry points (``forward``, ``backward_data``,
``backward_filter``) call CuPy's wrappers (``cupyx.cudnn.convolution_forward``,
``convolution_backward_data``, ``convolution_backward_filter``) with the output array given,
so results land in the planned buffer; 1-D convolutions go as 2-D ones with a unit height.

cuDNN takes symmetric padding only, and float16/32/64 NCHW tensors of 2 or 3 spatial axes (1
via the unit axis). CuPy v14 dropped its cuDNN binding; there, and where the cuDNN library is
not installed (``pip install nvidia-cudnn-cu12``), every convolution takes the fallback, which
the GPU check reports. ``CGVM_CUDNN``: unset, ``1``/``on``/``auto`` (use it where possible) or
``0``/``off`` (never); anything else is an error. Algorithms are auto-tuned (cuDNN's find, once
per shape, cached by CuPy) unless ``CGVM_CUDNN_AUTOTUNE=0``.
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple, Optional, Sequence, Tuple

import numpy as np

_ON = ("", "1", "on", "true", "yes", "auto")
_OFF = ("0", "off", "false", "no")
#: dtypes cuDNN convolves
DTYPES = ("float16", "float32", "float64")


class Choice(NamedTuple):
    """The path a convolution takes: ``"cudnn"`` or ``"im2col"`` (with ``reason`` for the latter)."""

    path: str
    reason: str = ""


def _flag(name: str) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    from ..errors import ConfigError

    raise ConfigError(f"{name}={raw!r}: use 1/on/auto (cuDNN where CuPy offers it) or 0/off (im2col+GEMM)")


def _is_cupy(xp: Any) -> bool:
    return getattr(xp, "__name__", "").partition(".")[0] == "cupy"


_library_cache: dict = {}


def library(xp: Any) -> Tuple[Optional[Any], str]:
    """CuPy's cuDNN wrapper module for array module ``xp`` and ``""``, or None and why not."""
    if not _is_cupy(xp):
        return None, "the NumPy backend has no cuDNN"
    if "lib" not in _library_cache:
        lib, reasons = None, []
        for module in ("cupyx.cudnn", "cupy.cudnn"):   # CuPy 11-13, then older CuPy
            try:
                lib = __import__(module, fromlist=["convolution_forward"])
                if hasattr(lib, "convolution_forward"):
                    break
                lib = None
                reasons.append(f"{module} has no convolution_forward")
            except Exception as exc:  # ImportError, or cuDNN's shared library failing to load
                reasons.append(f"{type(exc).__name__}: {exc}")
        version = getattr(xp, "__version__", "?")
        why = "" if lib is not None else (f"CuPy {version} has no usable cuDNN binding (CuPy 14 dropped it; "
                                          f"CuPy 13 needs the cuDNN library): {reasons[0]}")
        _library_cache["lib"] = (lib, why)
    return _library_cache["lib"]


def choose(xp: Any, dtype: Any, nsp: int, pads: Sequence[Tuple[int, int]]) -> Choice:
    """Which path a convolution with these facts takes (see the module doc)."""
    enabled = _flag("CGVM_CUDNN")    # checked first: a bad value is an error on every backend
    lib, why = library(xp)
    if lib is None:
        return Choice("im2col", why)
    if not enabled:
        return Choice("im2col", "CGVM_CUDNN=0")
    if np.dtype(dtype).name not in DTYPES:
        return Choice("im2col", f"cuDNN does not convolve {np.dtype(dtype).name}")
    if nsp not in (1, 2, 3):
        return Choice("im2col", f"cuDNN takes 1 to 3 spatial axes, not {nsp}")
    if any(b != e for b, e in pads):
        return Choice("im2col", f"asymmetric padding {tuple(pads)} (cuDNN pads both sides alike)")
    return Choice("cudnn")


def _as_2d(a: Any, nsp: int) -> Any:
    """A 1-D convolution's (N, C, L) operand as (N, C, 1, L)."""
    return a.reshape(a.shape[:2] + (1,) + a.shape[2:]) if nsp == 1 else a


def _params(nsp: int, pads: Sequence[Tuple[int, int]], stride: Sequence[int], dilation: Sequence[int]
            ) -> Tuple[tuple, tuple, tuple]:
    pad = tuple(int(b) for b, _ in pads)
    stride, dilation = tuple(int(s) for s in stride), tuple(int(d) for d in dilation)
    if nsp == 1:
        return (0,) + pad, (1,) + stride, (1,) + dilation
    return pad, stride, dilation


def _target(xp: Any, out: Optional[Any], shape: Tuple[int, ...], dtype: Any) -> Any:
    return out if out is not None and out.flags.c_contiguous and out.shape == shape else xp.empty(shape, dtype=dtype)


def _finish(xp: Any, target: Any, out: Optional[Any]) -> Any:
    if out is None or target is out:
        return target
    out[...] = target
    return out


def _tuning() -> bool:
    return _flag("CGVM_CUDNN_AUTOTUNE")


def forward(xp: Any, x: Any, w: Any, b: Optional[Any], out_shape: Tuple[int, ...], nsp: int,
            pads: Sequence[Tuple[int, int]], stride: Sequence[int], dilation: Sequence[int], groups: int,
            out: Optional[Any] = None) -> Any:
    """y = conv(x, w) + b by cudnnConvolutionForward (and cudnnAddTensor for the bias), into ``out``."""
    lib, _ = library(xp)
    pad, st, dil = _params(nsp, pads, stride, dilation)
    y = _target(xp, out, tuple(out_shape), x.dtype)
    lib.convolution_forward(xp.ascontiguousarray(_as_2d(x, nsp)), xp.ascontiguousarray(_as_2d(w, nsp)),
                            None if b is None else xp.ascontiguousarray(b), _as_2d(y, nsp), pad, st, dil,
                            int(groups), auto_tune=_tuning(), tensor_core="auto")
    return _finish(xp, y, out)


def backward_data(xp: Any, g: Any, w: Any, in_shape: Tuple[int, ...], nsp: int, pads: Sequence[Tuple[int, int]],
                  stride: Sequence[int], dilation: Sequence[int], groups: int, out: Optional[Any] = None) -> Any:
    """dx of y = conv(x, w) for y's gradient ``g`` (also conv_transpose's forward), into ``out``."""
    lib, _ = library(xp)
    pad, st, dil = _params(nsp, pads, stride, dilation)
    dx = _target(xp, out, tuple(in_shape), g.dtype)
    lib.convolution_backward_data(xp.ascontiguousarray(_as_2d(w, nsp)), xp.ascontiguousarray(_as_2d(g, nsp)),
                                  None, _as_2d(dx, nsp), pad, st, dil, int(groups), deterministic=False,
                                  auto_tune=_tuning(), tensor_core="auto")
    return _finish(xp, dx, out)


def backward_filter(xp: Any, x: Any, g: Any, w_shape: Tuple[int, ...], nsp: int, pads: Sequence[Tuple[int, int]],
                    stride: Sequence[int], dilation: Sequence[int], groups: int, out: Optional[Any] = None) -> Any:
    """dw of y = conv(x, w) for y's gradient ``g``, into ``out``."""
    lib, _ = library(xp)
    pad, st, dil = _params(nsp, pads, stride, dilation)
    dw = _target(xp, out, tuple(w_shape), x.dtype)
    lib.convolution_backward_filter(xp.ascontiguousarray(_as_2d(x, nsp)), xp.ascontiguousarray(_as_2d(g, nsp)),
                                    _as_2d(dw, nsp), pad, st, dil, int(groups), deterministic=False,
                                    auto_tune=_tuning(), tensor_core="auto")
    return _finish(xp, dw, out)


__all__ = ["Choice", "DTYPES", "backward_data", "backward_filter", "choose", "forward", "library"]
