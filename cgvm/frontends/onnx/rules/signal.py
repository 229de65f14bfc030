"""Signal-processing ONNX ops: DFT (opset 17 and 20 forms), STFT, the window functions, MelWeightMatrix.

DFT and STFT run on cgvm's dft op (a real tensor with a trailing (real, imaginary) axis, as in
ONNX). The windows and the mel filter bank depend on their (static) sizes only, so they become
constants computed here with NumPy.
"""
from __future__ import annotations

import numpy as np

from cgvm.ops import elementwise as E
from cgvm.ops import indexing as I
from cgvm.ops import shape as shp
from cgvm.ops import spectral as SP

from ..translate import np_dtype, rule
from .common import const


def _scalar(n, i, what):
    v = np.asarray(n.need_static(i, what)).reshape(-1)
    if v.size != 1:
        raise n.error(f"input {i} ({what}) must be a scalar, got {v.size} values")
    return v[0]


@rule("DFT")
def _dft(n):
    x = n.input(0)
    if n.opset >= 20:
        axis = int(_scalar(n, 2, "axis")) if n.has_input(2) else -2
    else:
        axis = int(n.attr("axis", 1))
    length = int(_scalar(n, 1, "dft_length")) if n.has_input(1) else None
    a = axis + x.ndim if axis < 0 else axis
    if not 0 <= a < x.ndim - 1:
        raise n.error(f"axis {axis} must name a signal axis of the rank-{x.ndim} input, not its last axis")
    return SP.dft(x, axis=a, inverse=bool(n.attr("inverse", 0)), onesided=bool(n.attr("onesided", 0)),
                  length=length)


@rule("STFT")
def _stft(n):
    """Frames of the (batch, length, 1 | 2) signal, frame_step apart, each weighted by the window,
    then transformed: (batch, frames, bins, 2)."""
    x = n.input(0)
    if x.ndim != 3 or x.shape[1] is None:
        raise n.error(f"the signal must be (batch, length, 1 or 2) with a known length, got {x.shape}")
    step = int(_scalar(n, 1, "frame_step"))
    window = n.input(2) if n.has_input(2) else None
    if n.has_input(3):
        frame = int(_scalar(n, 3, "frame_length"))
    elif window is not None:
        if window.ndim != 1 or window.shape[0] is None:
            raise n.error(f"the window must be one known-length axis, got {window.shape}")
        frame = int(window.shape[0])
    else:
        frame = int(x.shape[1])
    if step < 1 or not 1 <= frame <= x.shape[1]:
        raise n.error(f"frame_step {step} and frame_length {frame} do not fit a signal of length {x.shape[1]}")
    frames = 1 + (x.shape[1] - frame) // step
    where = np.arange(frames)[:, None] * step + np.arange(frame)[None, :]
    framed = I.take(x, const(where, dtype=np.int64), axis=1)             # (batch, frames, frame, 1 | 2)
    if window is not None:
        framed = E.mul(framed, shp.reshape(window, shape=(1, 1, frame, 1)))
    return SP.dft(framed, axis=2, onesided=bool(n.attr("onesided", 1)), length=frame)


def _window_setup(n):
    size = int(_scalar(n, 0, "size"))
    if size < 0:
        raise n.error(f"the window size must not be negative, got {size}")
    dtype = np_dtype(int(n.attr("output_datatype", 1)))
    periodic = bool(n.attr("periodic", 1))
    return np.arange(size, dtype=np.float64), (size if periodic else size - 1), dtype


def _window(n, terms):
    """sum_k a_k cos(2 pi k i / N): the cosine-sum windows ONNX defines."""
    i, denominator, dtype = _window_setup(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = sum(a * np.cos(2 * np.pi * k * i / denominator) for k, a in enumerate(terms))
    return const(np.asarray(w, dtype=np.float64).astype(dtype), dtype=dtype)


@rule("HannWindow")
def _hann(n):
    return _window(n, (0.5, -0.5))


@rule("HammingWindow")
def _hamming(n):
    alpha = 25.0 / 46.0
    return _window(n, (alpha, -(1 - alpha)))


@rule("BlackmanWindow")
def _blackman(n):
    return _window(n, (0.42, -0.5, 0.08))


@rule("MelWeightMatrix")
def _mel(n):
    """(dft_length // 2 + 1, num_mel_bins) triangular filters, equally spaced on the mel scale
    between the edge frequencies (ONNX's definition: bin edges floored to whole DFT bins)."""
    bins = int(_scalar(n, 0, "num_mel_bins"))
    dft_length = int(_scalar(n, 1, "dft_length"))
    rate = int(_scalar(n, 2, "sample_rate"))
    low, high = float(_scalar(n, 3, "lower_edge_hertz")), float(_scalar(n, 4, "upper_edge_hertz"))
    if bins < 1 or dft_length < 1 or rate < 1 or not 0 <= low <= high:
        raise n.error(f"num_mel_bins {bins}, dft_length {dft_length}, sample_rate {rate} and edges {low}..{high} Hz "
                      "do not describe a filter bank")
    spectrogram_bins = dft_length // 2 + 1

    def mel(hz):    # written as ONNX writes it, so that the floored edges agree
        return 2595 * np.log1p(hz / 700) / np.log(10)

    points = np.arange(bins + 2) * ((mel(high) - mel(low)) / (bins + 2)) + mel(low)
    hz = 700 * np.expm1(points / 2595 * np.log(10))
    edges = (((dft_length + 1) * hz) // rate).astype(np.int64)
    if edges.max() >= spectrogram_bins:
        raise n.error(f"the upper edge {high} Hz lies past the {spectrogram_bins} DFT bins at sample rate {rate}")
    out = np.zeros((spectrogram_bins, bins))
    for m in range(bins):
        left, center, right = edges[m], edges[m + 1], edges[m + 2]
        if center == left:
            out[center, m] = 1.0
        else:
            j = np.arange(left, center + 1)
            out[j, m] = (j - left) / (center - left)
        if right > center:
            j = np.arange(center, right)
            out[j, m] = (right - j) / (right - center)
    dtype = np_dtype(int(n.attr("output_datatype", 1)))
    return const(out.astype(dtype), dtype=dtype)

