"""Pooling with dilated windows (taps dilation apart, as ONNX and PyTorch define it): max and average
pooling and their gradient ops against a tap-by-tap NumPy loop and PyTorch."""
import numpy as np
import pytest

from cgvm.errors import GraphBuildError, ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import pool as P
from harness import Case, check_case, check_grad, pad_pairs, run_op, spatial
from test_pool import ref_out_size

rng = np.random.default_rng(12)


@pytest.fixture(autouse=True)
def numpy_kernels(monkeypatch):
    """These are the NumPy kernels' tests: the compiled tier (tests/ops/test_pool_native.py) stays off."""
    monkeypatch.setenv("CGVM_JIT", "0")


def r(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def ref_dilated_pool(x, kernel, stride=None, pad=0, dilation=1, ceil_mode=False, mode="max", count_include_pad=True):
    """Pooling with window taps ``dilation`` apart, tap by tap (ONNX's and PyTorch's rule): max over
    the in-image taps (first maximum in row-major tap order, with its flat in-plane index), or the
    sum over them divided by the taps inside the padded extent (or inside the image)."""
    nsp = x.ndim - 2
    k, d = spatial(kernel, nsp), spatial(dilation, nsp)
    s = spatial(stride if stride is not None else kernel, nsp)
    pads = pad_pairs(pad, nsp)
    sizes = x.shape[2:]
    span = [(k[i] - 1) * d[i] + 1 for i in range(nsp)]
    outs = [ref_out_size(sizes[i], span[i], s[i], pads[i][0], pads[i][1], ceil_mode) for i in range(nsp)]
    y = np.zeros(x.shape[:2] + tuple(outs), x.dtype)
    mask = np.zeros(y.shape, np.int64)
    for n, c in np.ndindex(*x.shape[:2]):
        for p in np.ndindex(*outs):
            best, where, total, padded_taps, inside_taps = None, -1, 0.0, 0, 0
            for taps in np.ndindex(*k):
                pos = [p[i] * s[i] - pads[i][0] + taps[i] * d[i] for i in range(nsp)]
                if all(pos[i] < sizes[i] + pads[i][1] for i in range(nsp)):
                    padded_taps += 1
                if not all(0 <= pos[i] < sizes[i] for i in range(nsp)):
                    continue
                inside_taps += 1
                v = x[(n, c) + tuple(pos)]
                total += v
                if best is None or v > best:
                    best, where = v, int(np.ravel_multi_index(tuple(pos), sizes))
            if mode == "max":
                y[(n, c) + p], mask[(n, c) + p] = best, where
            else:
                y[(n, c) + p] = total / (padded_taps if count_include_pad else inside_taps)
    return (y, mask) if mode == "max" else y


def dilated_case(name, x, mode="max", mask=False, **attrs):
    if mode == "max":
        return Case(name, lambda v: P.max_pool(v, return_mask=mask, **attrs), [x],
                    lambda a: ref_dilated_pool(a, **attrs) if mask else ref_dilated_pool(a, **attrs)[0])
    return Case(name, lambda v: P.avg_pool(v, **attrs), [x], lambda a: ref_dilated_pool(a, mode="avg", **attrs))


DILATED_CASES = [
    dilated_case("max2d_dilation2", r(2, 2, 7, 8), kernel=2, stride=1, dilation=2),
    dilated_case("max2d_dilation_pad_ceil", r(1, 2, 8, 7), kernel=3, stride=2, pad=1, dilation=(2, 3),
                 ceil_mode=True),
    dilated_case("max1d_dilation_mask", r(1, 2, 11), mask=True, kernel=3, stride=2, pad=2, dilation=2),
    dilated_case("max3d_dilation", r(1, 1, 6, 5, 6), kernel=2, stride=1, dilation=(2, 1, 2)),
    dilated_case("avg2d_dilation", r(1, 2, 7, 7), mode="avg", kernel=2, stride=1, dilation=2),
    dilated_case("avg2d_dilation_pad_ceil", r(1, 2, 8, 7), mode="avg", kernel=3, stride=2, pad=(1, 2, 2, 1),
                 dilation=2, ceil_mode=True),
    dilated_case("avg3d_dilation_exclude_pad_ceil", r(1, 1, 7, 6, 5), mode="avg", kernel=2, stride=2, pad=1,
                 dilation=2, ceil_mode=True, count_include_pad=False),
    Case("max_pool_grad_dilation", lambda x, g: P.max_pool_grad(x, g, kernel=2, stride=1, pad=1, dilation=2),
         [r(1, 2, 6, 5), r(1, 2, 6, 5)],
         lambda x, g: ref_max_pool_grad_dilated(x, g, kernel=2, stride=1, pad=1, dilation=2), grad_inputs=[1]),
    Case("max_pool_select_dilation", lambda x, v: P.max_pool_select(x, v, kernel=2, stride=2, dilation=3),
         [r(1, 2, 8, 7), r(1, 2, 8, 7)],
         lambda x, v: ref_max_pool_select_dilated(x, v, kernel=2, stride=2, dilation=3), grad_inputs=[1]),
    Case("avg_pool_grad_dilation", lambda g, x: P.avg_pool_grad(g, x, kernel=2, stride=1, pad=1, dilation=2,
                                                                count_include_pad=False),
         [r(1, 2, 5, 4), r(1, 2, 5, 4)],
         lambda g, x: ref_avg_pool_grad_dilated(g, x, kernel=2, stride=1, pad=1, dilation=2, count_include_pad=False),
         grad_inputs=[0]),
]


def ref_max_pool_grad_dilated(x, g, **attrs):
    _, mask = ref_dilated_pool(x, **attrs)
    dx = np.zeros(x.shape[:2] + (int(np.prod(x.shape[2:])),), g.dtype)
    for n, c in np.ndindex(*x.shape[:2]):
        np.add.at(dx[n, c], mask[n, c].ravel(), g[n, c].ravel())
    return dx.reshape(x.shape)


def ref_max_pool_select_dilated(x, v, **attrs):
    _, mask = ref_dilated_pool(x, **attrs)
    flat = v.reshape(v.shape[:2] + (-1,))
    return np.take_along_axis(flat, mask.reshape(mask.shape[:2] + (-1,)), axis=2).reshape(mask.shape)


def ref_avg_pool_grad_dilated(g, x, **attrs):
    flat = np.zeros(x.size, g.dtype)
    dx = np.zeros(x.size, g.dtype)
    for j in range(x.size):
        flat[j] = 1
        dx[j] = (ref_dilated_pool(flat.reshape(x.shape), mode="avg", **attrs) * g).sum()
        flat[j] = 0
    return dx.reshape(x.shape)


@pytest.mark.parametrize("case", DILATED_CASES, ids=repr)
def test_dilated_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in DILATED_CASES if c.grad], ids=repr)
def test_dilated_gradients(case, backend):
    check_grad(case, backend)


def test_dilated_pooling_matches_pytorch():
    torch = pytest.importorskip("torch")
    x = r(2, 3, 9, 10)
    got_max = run_op(lambda v: P.max_pool(v, kernel=3, stride=2, pad=1, dilation=2, ceil_mode=True), [x])[0]
    want_max = torch.nn.functional.max_pool2d(torch.from_numpy(x), 3, 2, 1, dilation=2, ceil_mode=True).numpy()
    np.testing.assert_allclose(got_max, want_max, rtol=1e-6)
    x3 = r(1, 2, 7, 6, 8)
    got = run_op(lambda v: P.max_pool(v, kernel=2, stride=(1, 2, 1), dilation=(2, 1, 3)), [x3])[0]
    want = torch.nn.functional.max_pool3d(torch.from_numpy(x3), 2, (1, 2, 1), dilation=(2, 1, 3)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_dilated_pooling_checks_the_padding_against_the_span():
    x = input_value(TensorType((1, 1, 9, 9), np.float32), "x")
    P.max_pool(x, kernel=2, pad=2, dilation=3)          # pad 2 < span 4: allowed
    with pytest.raises((ShapeError, GraphBuildError)):
        P.max_pool(x, kernel=2, pad=4, dilation=3)
