"""Batch-last convolution kernels against a plain NumPy loop, and the dispatch that picks them."""
import itertools

import numpy as np
import pytest

import cgvm
from cgvm.ir import TensorType, input_value
from cgvm.ops import conv as cv
from cgvm.ops.kernels import conv_batchlast as bl


def _reference(x, w, stride, pad, dilation, groups):
    """y[n, o, i, j] = sum over c in o's group, ki, kj of xpad[n, c, i·s + ki·d, j·s + kj·d] · w[o, c, ki, kj]."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    y = np.zeros((n, o, oh, ow), x.dtype)
    og = o // groups
    for oc in range(o):
        grp = oc // og
        for i, j in itertools.product(range(oh), range(ow)):
            for ki, kj in itertools.product(range(kh), range(kw)):
                patch = xp[:, grp * cg:(grp + 1) * cg, i * stride[0] + ki * dilation[0], j * stride[1] + kj * dilation[1]]
                y[:, oc, i, j] += patch @ w[oc, :, ki, kj]
    return y


CASES = [  # (N, C, H, W), (O, C/g, kh, kw), stride, pad, dilation, groups
    ((6, 3, 9, 8), (4, 3, 3, 3), (1, 1), (0, 0), (1, 1), 1),
    ((5, 4, 10, 9), (6, 2, 3, 2), (2, 1), (1, 2), (1, 1), 2),
    ((4, 2, 11, 11), (3, 2, 3, 3), (1, 2), (2, 1), (2, 2), 1),
    ((8, 1, 12, 12), (5, 1, 5, 5), (1, 1), (0, 0), (1, 1), 1),
    ((1, 4, 7, 10), (6, 2, 3, 3), (2, 2), (1, 0), (1, 2), 2),    # batch 1, groups with 3 outputs each
]


@pytest.mark.parametrize("x_shape,w_shape,stride,pad,dilation,groups", CASES)
def test_forward_and_gradients_match_a_numpy_loop(x_shape, w_shape, stride, pad, dilation, groups):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape)
    w = rng.standard_normal(w_shape)
    b = rng.standard_normal(w_shape[0])
    geo = cv.ConvGeometry(2, stride, pad, dilation, groups)
    want = _reference(x, w, stride, pad, dilation, groups)
    out_sizes = want.shape[2:]
    got = bl.forward(np, x, w, b, geo, out_sizes, np.empty(want.shape))
    np.testing.assert_allclose(got, want + b.reshape(1, -1, 1, 1), rtol=1e-10, atol=1e-10)

    # gradients of sum(y * r) by linearity: dx = conv's adjoint applied to r, checked entry by entry
    r = rng.standard_normal(want.shape)
    dx = bl.backward_input(np, r, w, x_shape[2:], geo, np.empty(x_shape))
    dw = bl.backward_weight(np, x, r, w_shape[2:], geo, np.empty(w_shape))
    for flat in rng.choice(x.size, 6, replace=False):
        e = np.zeros(x.size)
        e[flat] = 1.0
        ref = np.sum(_reference(e.reshape(x_shape), w, stride, pad, dilation, groups) * r)
        assert dx.reshape(-1)[flat] == pytest.approx(ref, rel=1e-9, abs=1e-9)
    for flat in rng.choice(w.size, 6, replace=False):
        e = np.zeros(w.size)
        e[flat] = 1.0
        ref = np.sum(_reference(x, e.reshape(w_shape), stride, pad, dilation, groups) * r)
        assert dw.reshape(-1)[flat] == pytest.approx(ref, rel=1e-9, abs=1e-9)


def test_row_chunks_cover_every_output_row(monkeypatch):
    """A tiny column budget forces one output row per chunk; results must not change."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((4, 3, 9, 9)), rng.standard_normal((5, 3, 3, 3))
    geo = cv.ConvGeometry(2, (1, 1), (1, 1), (1, 1), 1)
    whole = bl.forward(np, x, w, None, geo, (9, 9), np.empty((4, 5, 9, 9)))
    g = rng.standard_normal(whole.shape)
    dx_whole = bl.backward_input(np, g, w, (9, 9), geo, np.empty(x.shape))
    dw_whole = bl.backward_weight(np, x, g, (3, 3), geo, np.empty(w.shape))
    monkeypatch.setattr(bl, "COLUMN_BUDGET_BYTES", 1)
    assert len(bl._row_chunks(9, 100)) == 9
    np.testing.assert_allclose(bl.forward(np, x, w, None, geo, (9, 9), np.empty(whole.shape)), whole, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(bl.backward_input(np, g, w, (9, 9), geo, np.empty(x.shape)), dx_whole, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(bl.backward_weight(np, x, g, (3, 3), geo, np.empty(w.shape)), dw_whole, rtol=1e-10, atol=1e-12)


def test_dispatch_takes_batch_last_for_small_images_in_a_batch_only():
    for kind in ("forward", "input", "weight"):
        assert bl.batch_last_pays((64, 20, 12, 12), (8, 8), kind)       # LeNet's conv2
        assert not bl.batch_last_pays((2, 20, 12, 12), (8, 8), kind)    # no batch to stream over
        assert not bl.batch_last_pays((16, 64, 56, 56), (56, 56), kind)  # long rows: per-sample kernels
        assert not bl.batch_last_pays((16, 8, 20), (18,), kind)         # 1-D
    assert bl.batch_last_pays((16, 256, 13, 13), (13, 13), "input")
    assert not bl.batch_last_pays((16, 256, 13, 13), (13, 13), "forward")
    assert not bl.batch_last_pays((64, 1, 28, 28), (24, 24), "forward")    # LeNet's conv1


def test_compiled_lenet_sized_training_gradients_match_the_loop():
    """Through the compiled path (conv grad ops dispatching to batch-last) against the reference."""
    rng = np.random.default_rng(2)
    xv = input_value(TensorType((8, 2, 10, 10), "float64"), "x")
    wv = input_value(TensorType((3, 2, 3, 3), "float64"), "w")
    y = cv.conv(xv, wv, stride=(1, 1), pad=(1, 1))
    cost = cgvm.ops.reduce.sum(cgvm.ops.elementwise.mul(y, y))
    f = cgvm.compile([xv, wv], cgvm.grad(cost, [xv, wv]))
    x, w = rng.standard_normal((8, 2, 10, 10)), rng.standard_normal((3, 2, 3, 3))
    gx, gw = f(x, w)
    yr = _reference(x, w, (1, 1), (1, 1), (1, 1), 1)
    for flat in rng.choice(w.size, 5, replace=False):
        e = np.zeros(w.size)
        e[flat] = 1e-6
        num = (np.sum(_reference(x, w + e.reshape(w.shape), (1, 1), (1, 1), (1, 1), 1) ** 2) -
               np.sum(_reference(x, w - e.reshape(w.shape), (1, 1), (1, 1), (1, 1), 1) ** 2)) / 2e-6
        assert gw.reshape(-1)[flat] == pytest.approx(num, rel=1e-5)
    for flat in rng.choice(x.size, 5, replace=False):
        e = np.zeros(x.size)
        e[flat] = 1.0
        lin = np.sum(2 * yr * _reference(e.reshape(x.shape), w, (1, 1), (1, 1), (1, 1), 1))
        assert gx.reshape(-1)[flat] == pytest.approx(lin, rel=1e-9)


@pytest.mark.parametrize("threshold", [1, 10 ** 9])
def test_nchw_store_both_ways(monkeypatch, threshold):
    """A channel at a time or one transposed copy: the same array, from a strided (cropped) source too."""
    monkeypatch.setattr(bl, "PER_CHANNEL_STORE_ELEMENTS", threshold)
    rng = np.random.default_rng(2)
    src = rng.standard_normal((3, 7, 6, 5))
    out = np.empty((5, 3, 5, 4))
    bl.store_nchw(np, out, src[:, 1:6, 2:, :])
    np.testing.assert_array_equal(out, src[:, 1:6, 2:, :].transpose(3, 0, 1, 2))
    bias = rng.standard_normal(3)
    bl.store_nchw(np, out, src[:, 1:6, 2:, :], bias)
    np.testing.assert_array_equal(out, src[:, 1:6, 2:, :].transpose(3, 0, 1, 2) + bias.reshape(1, 3, 1, 1))
    x_shape, w_shape, stride, pad, dilation, groups = CASES[1]
    w = rng.standard_normal(w_shape)
    geo = cv.ConvGeometry(2, stride, pad, dilation, groups)
    y_shape = _reference(np.zeros(x_shape), w, stride, pad, dilation, groups).shape
    r = rng.standard_normal(y_shape)
    dx = bl.backward_input(np, r, w, x_shape[2:], geo, np.empty(x_shape))
    for flat in rng.choice(int(np.prod(x_shape)), 4, replace=False):
        e = np.zeros(int(np.prod(x_shape)))
        e[flat] = 1.0
        ref = np.sum(_reference(e.reshape(x_shape), w, stride, pad, dilation, groups) * r)
        assert dx.reshape(-1)[flat] == pytest.approx(ref, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("x_shape,w_shape,stride,pad,dilation,groups", CASES)
def test_compiled_col2im_equals_the_numpy_adds(monkeypatch, dtype, x_shape, w_shape, stride, pad, dilation, groups):
    """The input gradient's strided adds, compiled (cgvm.ops.kernels.native), add the same terms in the
    same order as the NumPy loop: the results are equal to the bit."""
    pytest.importorskip("numba")
    rng = np.random.default_rng(3)
    w = rng.standard_normal(w_shape).astype(dtype)
    geo = cv.ConvGeometry(2, stride, pad, dilation, groups)
    r = rng.standard_normal(_reference(np.zeros(x_shape), w, stride, pad, dilation, groups).shape).astype(dtype)
    monkeypatch.setenv("CGVM_JIT", "0")
    want = bl.backward_input(np, r, w, x_shape[2:], geo, np.empty(x_shape, dtype))
    monkeypatch.setenv("CGVM_JIT", "1")
    monkeypatch.setenv("CGVM_JIT_HOT", "0")
    calls = bl._col2im_rows.calls
    got = bl.backward_input(np, r, w, x_shape[2:], geo, np.empty(x_shape, dtype))
    assert bl._col2im_rows.compiled is not None and bl._col2im_rows.calls >= calls
    np.testing.assert_array_equal(got, want)
