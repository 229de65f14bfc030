"""The discrete Fourier transform on real tensors that carry complex numbers as a trailing pair axis.

    dft(x, axis=1, inverse=False, onesided=False, length=None) -> y

cgvm has no complex dtype, so, as ONNX's DFT does, a signal is a float tensor whose last axis is 1
(real values) or 2 (real and imaginary parts); ``axis`` (never that last one) is the transformed
one. Forward: ``numpy.fft.fft`` of the signal cut or zero-padded to ``length`` (default: its
size), unnormalized; ``onesided`` keeps the ``length // 2 + 1`` non-redundant bins. Inverse:
``numpy.fft.ifft`` (normalized by 1/length); with ``onesided`` the input is a one-sided spectrum
and the result the real signal ``numpy.fft.irfft`` gives, its last axis 1 (``length`` defaults to
``2 · (bins - 1)``). The result (last axis 2, or 1 for the real inverse) has x's dtype.

The transform is linear, so its gradient is its adjoint (dft_grad): for the forward transform,
``length · ifft`` of the gradient (zero-filled to all bins when one-sided), for the inverse
``fft / length``, for the real inverse the one-sided ``fft`` with the bins that stand for two
(all but the first and, for even lengths, the last) doubled, each then cut or zero-padded back
to the input's length on ``axis`` (and to its real part for a real input). dft_grad's own
gradient is dft again. Kernels use ``xp.fft`` (NumPy and CuPy alike).
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

from ..errors import ShapeError
from ..ir.attrs import Bool, Int
from ..ir.types import TensorType
from .registry import OPAQUE, defop
from .rules import require_float

_ATTRS = {"axis": Int(1), "inverse": Bool(False), "onesided": Bool(False), "length": Int(None)}


def _axis_of(ndim: int, axis: int) -> int:
    if ndim < 2:
        raise ShapeError(f"dft: the input needs a signal axis and the trailing (real, imaginary) axis, got rank {ndim}")
    a = axis + ndim if axis < 0 else axis
    if not 0 <= a < ndim - 1:
        raise ShapeError(f"dft: axis {axis} must name a signal axis of the rank-{ndim} input, not its last "
                         "(real, imaginary) axis")
    return a


def _length(n_in: Optional[int], inverse: bool, onesided: bool, length: Optional[int]) -> Optional[int]:
    if length is not None:
        if length < 1:
            raise ShapeError(f"dft: the transform length must be positive, got {length}")
        return length
    if n_in is None:
        return None
    return 2 * (n_in - 1) if inverse and onesided else n_in


def _out_shape(shape: Tuple[Optional[int], ...], axis: int, inverse: bool, onesided: bool,
               length: Optional[int]) -> Tuple[Optional[int], ...]:
    a = _axis_of(len(shape), axis)
    n = _length(shape[a], inverse, onesided, length)
    bins = n if inverse or not onesided or n is None else n // 2 + 1
    out = list(shape)
    out[a] = bins
    out[-1] = 1 if inverse and onesided else 2
    return tuple(out)


def _dft_infer(types, axis, inverse, onesided, length):
    x = types[0]
    require_float(x, "dft input")
    if x.ndim >= 1 and x.shape[-1] not in (None, 1, 2):
        raise ShapeError(f"dft: the last axis holds (real[, imaginary]) and must be 1 or 2, got {x!r}")
    if inverse and onesided and x.ndim >= 1 and x.shape[-1] == 1:
        raise ShapeError("dft: the real inverse (inverse and onesided) takes a complex one-sided spectrum, "
                         "last axis 2")
    return TensorType(_out_shape(x.shape, axis, inverse, onesided, length), x.dtype)


def _as_complex(x: Any) -> Any:
    return x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]


def _as_pair(xp: Any, z: Any, dtype: Any) -> Any:
    return xp.stack([z.real, z.imag], axis=-1).astype(dtype, copy=False)


def _fit(xp: Any, z: Any, axis: int, n: int) -> Any:
    """z cut or zero-padded to n along axis."""
    have = z.shape[axis]
    if have == n:
        return z
    if have > n:
        return xp.take(z, xp.arange(n), axis=axis)
    widths = [(0, 0)] * z.ndim
    widths[axis] = (0, n - have)
    return xp.pad(z, widths)


def _store(result: Any, out: Any) -> Any:
    if out is None:
        return result
    out[...] = result
    return out


dft = defop("dft", num_inputs=1, pattern=OPAQUE, attrs=dict(_ATTRS), infer=_dft_infer,
            doc="Discrete Fourier transform along `axis` of a (..., 1 | 2) real/complex-pair tensor (ONNX DFT).")


@dft.kernel
def _(xp, x, *, axis, inverse, onesided, length, out=None):
    a = _axis_of(x.ndim, axis)
    n = _length(x.shape[a], inverse, onesided, length)
    z = _as_complex(x)
    if inverse and onesided:
        return _store(xp.fft.irfft(z, n=n, axis=a)[..., None].astype(x.dtype, copy=False), out)
    y = xp.fft.ifft(z, n=n, axis=a) if inverse else xp.fft.fft(z, n=n, axis=a)
    if onesided:
        y = xp.take(y, xp.arange(n // 2 + 1), axis=a)
    return _store(_as_pair(xp, y, x.dtype), out)


@dft.grad
def _(node, g):
    return [dft_grad(g, node.inputs[0], **node.attrs)]


def _dft_grad_infer(types, **attrs):
    g, x = types
    want = _dft_infer([x], **attrs)
    if g.ndim != want.ndim:
        raise ShapeError(f"dft_grad: the gradient {g!r} must be shaped like dft's result {want!r}")
    return x.with_dtype(g.dtype)


dft_grad = defop("dft_grad", num_inputs=2, pattern=OPAQUE, attrs=dict(_ATTRS), infer=_dft_grad_infer,
                 shape_only=(1,),
                 doc="Gradient of dft: (g, x_like) -> the transform's adjoint applied to g, shaped like x.")


@dft_grad.kernel
def _(xp, g, x, *, axis, inverse, onesided, length, out=None):
    a = _axis_of(x.ndim, axis)
    m = x.shape[a]
    n = _length(m, inverse, onesided, length)
    gz = _as_complex(g)
    if inverse and onesided:
        bins = xp.fft.rfft(gz, n=n, axis=a)
        twice = xp.full(n // 2 + 1, 2.0 / n)
        twice[0] = 1.0 / n
        if n % 2 == 0:
            twice[-1] = 1.0 / n
        shape = [1] * bins.ndim
        shape[a] = n // 2 + 1
        back = bins * twice.reshape(shape)
    elif inverse:
        back = xp.fft.fft(gz, n=n, axis=a) / n
    else:
        if onesided:
            gz = _fit(xp, gz, a, n)
        back = xp.fft.ifft(gz, n=n, axis=a) * n
    back = _fit(xp, back, a, m)
    result = back.real[..., None] if x.shape[-1] == 1 else _as_pair(xp, back, g.dtype)
    return _store(result.astype(g.dtype, copy=False), out)


@dft_grad.grad
def _(node, gg):
    # dft_grad is dft's adjoint, so its own adjoint is dft
    return [dft(gg, **node.attrs), None]
