"""dft against the transform written out as a matrix of e^(-2 pi i k t / n) in NumPy, and numeric gradients."""
import numpy as np
import pytest

from cgvm.errors import GraphBuildError, ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import spectral as SP
from harness import Case, check_case, check_grad, linear_adjoint

rng = np.random.default_rng(5)


def r(*shape):
    return rng.standard_normal(shape)


def _complex(x):
    return x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]


def _pair(z):
    return np.stack([z.real, z.imag], axis=-1)


def ref_dft(x, axis=1, inverse=False, onesided=False, length=None):
    """The transform as a matrix product over ``axis`` (cut or zero-padded to ``length`` first)."""
    z = np.moveaxis(_complex(x), axis, -1)
    m = z.shape[-1]
    if inverse and onesided:
        n = length if length is not None else 2 * (m - 1)
        half = np.zeros(z.shape[:-1] + (n // 2 + 1,), complex)
        keep = min(m, n // 2 + 1)
        half[..., :keep] = z[..., :keep]
        # the full spectrum with Hermitian symmetry; the imaginary parts of the bins that stand
        # alone (the first and, for even n, the middle) do not count
        full = np.zeros(z.shape[:-1] + (n,), complex)
        full[..., :n // 2 + 1] = half
        full[..., 0] = full[..., 0].real
        if n % 2 == 0:
            full[..., n // 2] = full[..., n // 2].real
        for k in range(1, (n + 1) // 2):
            full[..., n - k] = np.conj(half[..., k])
        t = np.arange(n)
        matrix = np.exp(2j * np.pi * np.outer(t, t) / n) / n
        y = (full @ matrix.T).real[..., None]
        return np.moveaxis(y, -2, axis)
    n = length if length is not None else m
    padded = np.zeros(z.shape[:-1] + (n,), complex)
    padded[..., :min(m, n)] = z[..., :min(m, n)]
    t = np.arange(n)
    sign = 1 if inverse else -1
    matrix = np.exp(sign * 2j * np.pi * np.outer(t, t) / n) / (n if inverse else 1)
    y = padded @ matrix.T
    if onesided:
        y = y[..., :n // 2 + 1]
    return np.moveaxis(_pair(y), -2, axis)


def dft_case(name, x, **attrs):
    return Case(name, lambda v: SP.dft(v, **attrs), [x], lambda a: ref_dft(a, **attrs), rtol=1e-9, atol=1e-9)


CASES = [
    dft_case("complex_forward", r(2, 6, 3, 2), axis=1),
    dft_case("real_forward_axis2", r(2, 3, 5, 1), axis=2),
    dft_case("real_onesided_even", r(1, 8, 3, 1), axis=1, onesided=True),
    dft_case("complex_onesided_odd", r(3, 7, 2), axis=1, onesided=True),
    dft_case("inverse", r(2, 5, 4, 2), axis=1, inverse=True),
    dft_case("inverse_real_input", r(4, 6, 1), axis=1, inverse=True),
    dft_case("zero_padded_length", r(2, 5, 2), axis=1, length=8),
    dft_case("cut_length", r(1, 9, 2, 1), axis=1, length=6, onesided=True),
    dft_case("irfft_even", r(2, 5, 3, 2), axis=1, inverse=True, onesided=True),
    dft_case("irfft_odd_length", r(2, 4, 2), axis=1, inverse=True, onesided=True, length=7),
    dft_case("irfft_padded_spectrum", r(1, 3, 2), axis=1, inverse=True, onesided=True, length=9),
    Case("dft_grad", lambda g, x: SP.dft_grad(g, x, axis=1, onesided=True), [r(2, 4, 2), r(2, 6, 1)],
         lambda g, x: _adjoint(g, x, axis=1, onesided=True), rtol=1e-9, atol=1e-9, grad_inputs=[0]),
]


def _adjoint(g, x, **attrs):
    """d/dx of sum(g * dft(x)) through the reference."""
    return linear_adjoint(lambda u: ref_dft(u, **attrs), x, g)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)


def test_float32_stays_float32():
    import cgvm

    x = input_value(TensorType((2, 8, 1), np.float32), "x")
    y = SP.dft(x, axis=1, onesided=True)
    assert y.dtype.np == np.float32 and y.shape == (2, 5, 2)
    got = cgvm.compile([x], [y])(np.ones((2, 8, 1), np.float32))[0]
    assert got.dtype == np.float32 and np.allclose(got[:, 0, 0], 8) and np.allclose(got[:, 1:], 0, atol=1e-6)


def test_the_pair_axis_is_not_a_signal_axis():
    x = input_value(TensorType((2, 8, 2), np.float32), "x")
    with pytest.raises((ShapeError, GraphBuildError)):
        SP.dft(x, axis=2)
    with pytest.raises((ShapeError, GraphBuildError)):
        SP.dft(input_value(TensorType((2, 8, 3), np.float32), "y"), axis=1)
