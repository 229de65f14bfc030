"""The compiled max-pooling kernels (cgvm.ops.kernels.pool_native) against Caffe's loops, and their tiering."""
import numpy as np
import pytest

from cgvm.ops import pool as P
from cgvm.ops.kernels import native, pool_native
from cgvm.ops.kernels.pool_windows import PoolGeometry
from test_pool import ref_max_pool_grad, ref_pool

pytest.importorskip("numba")
rng = np.random.default_rng(5)

GEOMETRIES = [  # kernel, stride, pad, ceil_mode, dilation
    ((2, 2), (2, 2), (0,), False, (1,)),      # the 2x2 tiled kernels
    ((3, 3), (2, 2), (1,), True, (1,)),       # overlapping, padded, ceil mode
    ((2, 3), (1, 2), (1, 0, 0, 1), False, (1,)),
    ((3, 3), (1, 1), (0,), False, (2, 1)),
    ((3, 3), (3, 3), (0,), True, (1,)),       # a clipped last window
]


@pytest.fixture
def compiled_now(monkeypatch):
    monkeypatch.delenv("CGVM_JIT", raising=False)
    monkeypatch.setenv("CGVM_JIT_HOT", "0")


def _attrs(geometry):
    kernel, stride, pad, ceil_mode, dilation = geometry
    return dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil_mode, dilation=dilation)


def pool(x, **attrs):
    return P.max_pool.bind(np, dict(attrs, return_mask=False))(x)


def pool_grad(*inputs, **attrs):
    return P.max_pool_grad.bind(np, attrs)(*inputs)


def _dilated_ref(x, kernel, stride, pad, ceil_mode, dilation):
    """Caffe's windows with taps ``dilation`` apart: the reference loop on the dilated window's taps."""
    geo = PoolGeometry(2, kernel, stride, pad, ceil_mode, dilation)
    oh, ow = geo.out_sizes(x.shape[2:])
    (ph, _), (pw, _) = geo.pads
    y = np.full(x.shape[:2] + (oh, ow), -np.inf, x.dtype)
    dx_at = np.zeros(y.shape + (2,), np.int64)
    for i, j in np.ndindex(oh, ow):
        for a in range(kernel[0]):
            for b in range(kernel[1]):
                h, w = i * stride[0] - ph + a * dilation[0], j * stride[1] - pw + b * dilation[1]
                if 0 <= h < x.shape[2] and 0 <= w < x.shape[3]:
                    better = x[:, :, h, w] > y[:, :, i, j]
                    y[:, :, i, j] = np.where(better, x[:, :, h, w], y[:, :, i, j])
                    dx_at[:, :, i, j] = np.where(better[..., None], (h, w), dx_at[:, :, i, j])
    return y, dx_at


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_compiled_kernels_match_caffes_loops(compiled_now, geometry, dtype):
    attrs = _attrs(geometry)
    # ties on purpose: a coarse grid of values, so windows often hold their maximum twice
    x = rng.integers(-3, 4, (2, 3, 9, 11)).astype(dtype)
    y = pool(x, **attrs)
    assert pool_native.max_pool_2x2.compiled is not None or geometry != GEOMETRIES[0]
    g = rng.standard_normal(y.shape).astype(dtype)
    dx = pool_grad(x, g, y, **attrs)
    dx_without_y = pool_grad(x, g, **attrs)
    if geometry[4] == (1,):
        want_y, _ = ref_pool(x, kernel=geometry[0], stride=geometry[1], pad=geometry[2], ceil_mode=geometry[3])
        want_dx = ref_max_pool_grad(x, g, kernel=geometry[0], stride=geometry[1], pad=geometry[2],
                                    ceil_mode=geometry[3])
    else:
        want_y, at = _dilated_ref(x, *geometry)
        want_dx = np.zeros_like(x)
        for n, c, i, j in np.ndindex(*g.shape):
            want_dx[n, c, at[n, c, i, j, 0], at[n, c, i, j, 1]] += g[n, c, i, j]
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-6)
    np.testing.assert_allclose(dx_without_y, want_dx, rtol=1e-6)


@pytest.mark.parametrize("geometry", GEOMETRIES[:2])
def test_compiled_and_numpy_kernels_agree_on_nan_and_views(monkeypatch, geometry):
    attrs = _attrs(geometry)
    x = rng.standard_normal((3, 2, 10, 12)).astype(np.float32)
    x[0, 1, 3, 4] = np.nan
    x = x[:, :, :, 1:]                          # a non-contiguous view
    monkeypatch.setenv("CGVM_JIT", "0")
    want_y = pool(x, **attrs)
    # a window whose maximum is NaN routes its gradient by each kernel's comparisons (cgvm.ops.pool):
    # its g is 0 here, so where it goes does not show
    g = np.where(np.isnan(want_y), 0, rng.standard_normal(want_y.shape)).astype(np.float32)
    want_dx = pool_grad(x, g, want_y, **attrs)
    monkeypatch.setenv("CGVM_JIT", "1")
    monkeypatch.setenv("CGVM_JIT_HOT", "0")
    got_y = pool(x, **attrs)
    got_dx = pool_grad(x, g, got_y, **attrs)
    assert np.isnan(got_y).any()
    np.testing.assert_array_equal(got_y, want_y)
    np.testing.assert_allclose(got_dx, want_dx, rtol=1e-6)


@pytest.mark.parametrize("geometry", GEOMETRIES[:2])
def test_an_infinite_gradient_reaches_only_the_maximum(compiled_now, geometry):
    """As Caffe's scatter to the argmax: every other element gets exactly 0, not 0 * inf = NaN."""
    kernel, stride, pad, ceil_mode, _ = geometry
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    y = pool(x, **_attrs(geometry))
    g = rng.standard_normal(y.shape).astype(np.float32)
    g[0, 1, 1, 1] = np.inf
    got = pool_grad(x, g, y, **_attrs(geometry))
    assert not np.isnan(got).any() and np.isinf(got).sum() == 1
    np.testing.assert_allclose(got, ref_max_pool_grad(x, g, kernel=kernel, stride=stride, pad=pad,
                                                      ceil_mode=ceil_mode), rtol=1e-6)


@pytest.mark.parametrize("geometry,compiled", [(((3, 3), (2, 2), (1,), False, (1,)), True),
                                               (((2, 2), (2, 2), (0,), True, (1,)), True),
                                               (((2, 2), (1, 1), (0,), False, (1,)), False),
                                               (((3, 3), (3, 3), (0,), True, (1,)), False),
                                               (((3, 3), (2, 2), (1,), False, (2, 2)), False)])
def test_only_geometries_measured_faster_go_to_the_general_loop(compiled_now, monkeypatch, geometry, compiled):
    """GRAD_GEOMETRIES route the gradient to the compiled loop; other windows, and every forward but
    2x2 tiles, stay with the NumPy kernels, which were faster there."""
    calls = []
    monkeypatch.setattr(pool_native.max_pool_grad_2d, "run", lambda xp, *a: calls.append(1) or False)
    forward = []
    monkeypatch.setattr(pool_native.max_pool_2x2, "run", lambda xp, *a: forward.append(1) or False)
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    y = pool(x, **_attrs(geometry))
    pool_grad(x, rng.standard_normal(y.shape).astype(np.float32), y, **_attrs(geometry))
    assert bool(calls) == compiled and not forward


def test_a_kernel_compiles_only_once_hot(monkeypatch):
    monkeypatch.delenv("CGVM_JIT", raising=False)
    monkeypatch.setenv("CGVM_JIT_HOT", "2")
    kernel = native.NativeKernel(pool_native.max_pool_2x2.fn)
    x = rng.standard_normal((1, 1, 4, 4))
    y = np.zeros((1, 1, 2, 2))
    assert [kernel.run(np, x, y) for _ in range(4)] == [False, False, True, True]
    np.testing.assert_array_equal(y, x.reshape(1, 1, 2, 2, 2, 2).max(axis=(3, 5)))


def test_other_dtypes_backends_and_the_switch_stay_numpy(monkeypatch):
    monkeypatch.setenv("CGVM_JIT_HOT", "0")
    kernel = native.NativeKernel(pool_native.max_pool_2x2.fn)
    x16 = np.ones((1, 1, 4, 4), np.float16)
    assert not kernel.run(np, x16, np.zeros((1, 1, 2, 2), np.float16))
    assert not kernel.run(object(), np.ones((1, 1, 4, 4)), np.zeros((1, 1, 2, 2)))
    monkeypatch.setenv("CGVM_JIT", "0")
    assert not kernel.run(np, np.ones((1, 1, 4, 4)), np.zeros((1, 1, 2, 2)))
    assert kernel.compiled is None


def test_a_signature_numba_cannot_compile_falls_back_for_good(compiled_now):
    def broken(x, y):
        y[0, 0, 0, 0] = undefined_name   # noqa: F821 -- a typing error for Numba

    kernel = native.NativeKernel(broken)
    with pytest.warns(RuntimeWarning, match="broken"):
        assert not kernel.run(np, np.ones((1, 1, 2, 2)), np.zeros((1, 1, 1, 1)))
    assert kernel.failed and not kernel.run(np, np.ones((1, 1, 2, 2)), np.zeros((1, 1, 1, 1)))
