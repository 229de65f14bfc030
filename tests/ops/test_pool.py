"""Pooling ops against direct NumPy loops written from Caffe's rules, Caffe's test numbers, and PyTorch."""
import math

import numpy as np
import pytest

import cgvm
from cgvm.errors import GraphBuildError, ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import pool as P
from cgvm.ops.kernels import pool_windows
from cgvm.ops import reduce as R
from harness import Case, check_case, check_grad, pad_pairs, spatial

rng = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def numpy_kernels(monkeypatch):
    """These are the NumPy kernels' tests: the compiled tier (tests/ops/test_pool_native.py) stays off."""
    monkeypatch.setenv("CGVM_JIT", "0")


def r(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------- reference (Caffe's loops)



def ref_out_size(n, k, s, pad_begin, pad_end, ceil_mode):
    if ceil_mode:
        out = int(math.ceil(float(n + pad_begin + pad_end - k) / s)) + 1
        if (out - 1) * s >= n + pad_begin:  # the last window must start inside image or left padding
            out -= 1
        return out
    return (n + pad_begin + pad_end - k) // s + 1


def ref_pool(x, kernel, stride=None, pad=0, ceil_mode=False, mode="max", count_include_pad=True):
    """Returns (pooled, mask) for max, pooled for avg; windows as in Caffe's pooling_layer.cpp."""
    nsp = x.ndim - 2
    k = spatial(kernel, nsp)
    s = spatial(stride if stride is not None else kernel, nsp)
    pads = pad_pairs(pad, nsp)
    sizes = x.shape[2:]
    outs = [ref_out_size(sizes[i], k[i], s[i], pads[i][0], pads[i][1], ceil_mode) for i in range(nsp)]
    y = np.zeros(x.shape[:2] + tuple(outs), x.dtype)
    mask = np.zeros(y.shape, np.int64)
    for p in np.ndindex(*outs):
        start = [p[i] * s[i] - pads[i][0] for i in range(nsp)]
        end_padded = [min(start[i] + k[i], sizes[i] + pads[i][1]) for i in range(nsp)]
        pool_size = np.prod([end_padded[i] - start[i] for i in range(nsp)])
        lo = [max(start[i], 0) for i in range(nsp)]
        hi = [min(end_padded[i], sizes[i]) for i in range(nsp)]
        window = x[(slice(None), slice(None)) + tuple(slice(lo[i], hi[i]) for i in range(nsp))]
        flat = window.reshape(x.shape[0], x.shape[1], -1)
        at = (slice(None), slice(None)) + p
        if mode == "max":
            first = flat.argmax(axis=2)  # first maximum in row-major window order
            y[at] = flat.max(axis=2)
            coords = np.unravel_index(first, [hi[i] - lo[i] for i in range(nsp)])
            mask[at] = np.ravel_multi_index(tuple(c + lo[i] for i, c in enumerate(coords)), sizes)
        else:
            divisor = pool_size if count_include_pad else flat.shape[2]
            y[at] = flat.sum(axis=2) / divisor
    return (y, mask) if mode == "max" else y


def ref_max_pool_grad(x, g, **attrs):
    """Each g routed to the first argmax of its window (accumulating where windows overlap)."""
    _, mask = ref_pool(x, **attrs)
    dx = np.zeros(x.shape[:2] + (int(np.prod(x.shape[2:])),), g.dtype)
    for n, c in np.ndindex(*x.shape[:2]):
        np.add.at(dx[n, c], mask[n, c].ravel(), g[n, c].ravel())
    return dx.reshape(x.shape)


def ref_max_pool_select(x, v, **attrs):
    _, mask = ref_pool(x, **attrs)
    flat = v.reshape(v.shape[:2] + (-1,))
    return np.take_along_axis(flat, mask.reshape(mask.shape[:2] + (-1,)), axis=2).reshape(mask.shape)


def ref_avg_pool_grad(g, x, **attrs):
    """Adjoint of the averaging map, built column by column from ref_pool."""
    flat = np.zeros(x.size, g.dtype)
    dx = np.zeros(x.size, g.dtype)
    for j in range(x.size):
        flat[j] = 1
        dx[j] = (ref_pool(flat.reshape(x.shape), mode="avg", **attrs) * g).sum()
        flat[j] = 0
    return dx.reshape(x.shape)


# --------------------------------------------------------------------------- cases

def max_case(name, x, dynamic=False, **attrs):
    return Case(name, lambda v: P.max_pool(v, **attrs), [x], lambda a: ref_pool(a, **attrs)[0], dynamic=dynamic)


def mask_case(name, x, **attrs):
    return Case(name, lambda v: P.max_pool(v, return_mask=True, **attrs), [x], lambda a: ref_pool(a, **attrs))


def avg_case(name, x, dynamic=False, **attrs):
    return Case(name, lambda v: P.avg_pool(v, **attrs), [x], lambda a: ref_pool(a, mode="avg", **attrs),
                dynamic=dynamic)


CASES = [
    max_case("max2d_k2", r(2, 3, 4, 6), kernel=2),
    max_case("max2d_k3s2p1_ceil", r(2, 2, 7, 6), kernel=3, stride=2, pad=1, ceil_mode=True),
    max_case("max2d_ceil_extra_output", r(1, 2, 6, 6), kernel=3, stride=2, ceil_mode=True),
    max_case("max2d_floor", r(1, 2, 6, 6), kernel=3, stride=2),
    max_case("max2d_rect_overlap", r(2, 2, 6, 5), kernel=(3, 2), stride=1),
    max_case("max2d_asym_pad", r(1, 2, 5, 5), kernel=2, stride=2, pad=(0, 0, 1, 1)),
    max_case("max2d_clip_rule", r(1, 1, 5, 5), kernel=2, stride=2, pad=1, ceil_mode=True),
    max_case("max1d", r(2, 3, 9), kernel=3, stride=2, pad=1),
    max_case("max3d", r(1, 2, 4, 5, 3), kernel=(2, 3, 2), stride=(2, 2, 1), ceil_mode=True),
    max_case("max2d_dynamic", r(2, 2, 7, 5), dynamic=True, kernel=3, stride=2, pad=1, ceil_mode=True),
    Case("max2d_int", lambda v: P.max_pool(v, kernel=2, pad=1, stride=2),
         [rng.integers(-50, 50, (1, 2, 5, 5)).astype(np.int32)],
         lambda a: ref_pool(a, kernel=2, pad=1, stride=2)[0], grad=False),
    mask_case("max2d_mask", r(2, 2, 6, 5), kernel=3, stride=2, pad=1, ceil_mode=True),
    mask_case("max1d_mask", r(1, 2, 7), kernel=2, stride=1),
    avg_case("avg2d_k2", r(2, 3, 4, 6), kernel=2),
    avg_case("avg2d_pad_ceil", r(2, 2, 7, 6), kernel=3, stride=2, pad=1, ceil_mode=True),
    avg_case("avg2d_ceil_overhang", r(1, 2, 6, 6), kernel=3, stride=2, ceil_mode=True),
    avg_case("avg2d_exclude_pad", r(1, 2, 5, 6), kernel=3, stride=2, pad=1, ceil_mode=True,
             count_include_pad=False),
    avg_case("avg2d_asym_pad", r(1, 2, 5, 5), kernel=(2, 3), stride=(2, 1), pad=(1, 0, 0, 2)),
    avg_case("avg1d", r(2, 2, 8), kernel=4, stride=3, pad=2, ceil_mode=True),
    avg_case("avg3d", r(1, 2, 3, 4, 4), kernel=2, stride=(1, 2, 2), pad=(1, 0, 1)),
    avg_case("avg2d_dynamic", r(2, 2, 7, 5), dynamic=True, kernel=3, stride=2, pad=1, ceil_mode=True),
    Case("max_pool_grad", lambda x, g: P.max_pool_grad(x, g, kernel=3, stride=2, pad=1, ceil_mode=True),
         [r(2, 2, 6, 5), r(2, 2, 4, 3)], lambda x, g: ref_max_pool_grad(x, g, kernel=3, stride=2, pad=1, ceil_mode=True),
         grad_inputs=[1]),
    Case("max_pool_grad_overlap", lambda x, g: P.max_pool_grad(x, g, kernel=2, stride=1),
         [r(1, 2, 4, 4), r(1, 2, 3, 3)], lambda x, g: ref_max_pool_grad(x, g, kernel=2, stride=1),
         grad_inputs=[1], dynamic=True),
    Case("max_pool_select", lambda x, v: P.max_pool_select(x, v, kernel=3, stride=2, pad=1),
         [r(2, 2, 6, 5), r(2, 2, 6, 5)], lambda x, v: ref_max_pool_select(x, v, kernel=3, stride=2, pad=1),
         grad_inputs=[1]),
    Case("avg_pool_grad", lambda g, x: P.avg_pool_grad(g, x, kernel=3, stride=2, pad=1, ceil_mode=True),
         [r(1, 2, 4, 3), r(1, 2, 6, 5)], lambda g, x: ref_avg_pool_grad(g, x, kernel=3, stride=2, pad=1, ceil_mode=True),
         grad_inputs=[0]),
    Case("avg_pool_grad_exclude_pad", lambda g, x: P.avg_pool_grad(g, x, kernel=2, stride=2, pad=1,
                                                                   count_include_pad=False),
         [r(1, 2, 3, 3), r(1, 2, 5, 4)],
         lambda g, x: ref_avg_pool_grad(g, x, kernel=2, stride=2, pad=1, count_include_pad=False),
         grad_inputs=[0], dynamic=True),
    Case("global_avg", P.global_avg_pool, [r(2, 3, 4, 5)], lambda a: a.mean(axis=(2, 3), keepdims=True)),
    Case("global_avg_1d_dynamic", P.global_avg_pool, [r(2, 3, 7)], lambda a: a.mean(axis=2, keepdims=True),
         dynamic=True),
    Case("global_max", P.global_max_pool, [r(2, 3, 4, 5)], lambda a: a.max(axis=(2, 3), keepdims=True)),
    Case("global_max_3d_dynamic", P.global_max_pool, [r(1, 2, 3, 2, 4)], lambda a: a.max(axis=(2, 3, 4),
                                                                                         keepdims=True), dynamic=True),
    Case("global_max_pool_grad", P.global_max_pool_grad, [r(2, 3, 3, 4), r(2, 3, 1, 1)],
         lambda x, g: ref_max_pool_grad(x, g, kernel=(3, 4)), grad_inputs=[1]),
    Case("global_max_pool_select", P.global_max_pool_select, [r(2, 3, 3, 4), r(2, 3, 3, 4)],
         lambda x, v: ref_max_pool_select(x, v, kernel=(3, 4)), grad_inputs=[1]),
    Case("global_avg_pool_grad", P.global_avg_pool_grad, [r(2, 3, 1, 1), r(2, 3, 3, 4)],
         lambda g, x: np.broadcast_to(g / 12, x.shape), grad_inputs=[0]),
    Case("max_pool_second_order", lambda x: cgvm.grad(R.sum(E.mul(P.max_pool(x, kernel=2, stride=1),
                                                                  P.max_pool(x, kernel=2, stride=1))), x),
         [r(1, 2, 4, 4)], lambda x: ref_max_pool_grad(x, 2 * ref_pool(x, kernel=2, stride=1)[0], kernel=2, stride=1)),
    Case("avg_pool_second_order", lambda x: cgvm.grad(R.sum(E.mul(P.avg_pool(x, kernel=3, stride=2, pad=1),
                                                                  P.avg_pool(x, kernel=3, stride=2, pad=1))), x),
         [r(1, 2, 5, 5)], lambda x: ref_avg_pool_grad(2 * ref_pool(x, kernel=3, stride=2, pad=1, mode="avg"), x,
                                                      kernel=3, stride=2, pad=1)),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)


# --------------------------------------------------------------------------- Caffe's test_pooling_layer.cpp

def _run(build, x):
    sym = input_value(TensorType(x.shape, x.dtype), "x")
    out = build(sym)
    outs = list(out) if isinstance(out, tuple) else [out]
    return cgvm.compile([sym], outs)(x)


def _planes(plane, n=2, c=2):
    return np.broadcast_to(np.asarray(plane, np.float32), (n, c) + np.shape(plane)).copy()


MAGIC6 = [[35, 1, 6, 26, 19, 24], [3, 32, 7, 21, 23, 25], [31, 9, 2, 22, 27, 20],
          [8, 28, 33, 17, 10, 15], [30, 5, 34, 12, 14, 16], [4, 36, 29, 13, 18, 11]]
CAFFE_MAX = [
    ("square", [[1, 2, 5, 2, 3], [9, 4, 1, 4, 8], [1, 2, 5, 2, 3]], (2, 2),
     [[9, 5, 5, 8], [9, 5, 5, 8]], [[5, 2, 2, 9], [5, 12, 12, 9]]),
    ("rect_high", MAGIC6, (3, 2),
     [[35, 32, 26, 27, 27], [32, 33, 33, 27, 27], [31, 34, 34, 27, 27], [36, 36, 34, 18, 18]],
     [[0, 7, 3, 16, 16], [7, 20, 20, 16, 16], [12, 26, 26, 16, 16], [31, 31, 26, 34, 34]]),
    ("rect_wide", MAGIC6, (2, 3),
     [[35, 32, 26, 26], [32, 32, 27, 27], [33, 33, 33, 27], [34, 34, 34, 17], [36, 36, 34, 18]],
     [[0, 7, 3, 3], [7, 7, 16, 16], [20, 20, 20, 16], [26, 26, 26, 21], [31, 31, 26, 34]]),
]


@pytest.mark.parametrize("name,plane,kernel,want,want_mask", CAFFE_MAX, ids=[c[0] for c in CAFFE_MAX])
def test_caffe_max_with_mask(name, plane, kernel, want, want_mask):
    y, mask = _run(lambda v: P.max_pool(v, kernel=kernel, stride=1, ceil_mode=True, return_mask=True),
                   _planes(plane))
    np.testing.assert_array_equal(y, _planes(want))
    np.testing.assert_array_equal(mask, _planes(want_mask).astype(np.int64))


def test_ties_go_to_the_first_max_in_window_order():
    x = np.array([[[[1, 3, 3], [3, 3, 0], [2, 3, 3]]]], np.float32)
    y, mask = _run(lambda v: P.max_pool(v, kernel=2, stride=1, return_mask=True), x)
    np.testing.assert_array_equal(y[0, 0], [[3, 3], [3, 3]])
    np.testing.assert_array_equal(mask[0, 0], [[1, 1], [3, 4]])
    sym = input_value(TensorType(x.shape, "float32"), "x")
    dx, = cgvm.compile([sym], [cgvm.grad(R.sum(P.max_pool(sym, kernel=2, stride=1)), sym)])(x)
    np.testing.assert_array_equal(dx[0, 0], [[0, 2, 0], [1, 1, 0], [0, 0, 0]])
    gdx, = cgvm.compile([sym], [cgvm.grad(R.sum(P.global_max_pool(sym)), sym)])(x)
    np.testing.assert_array_equal(gdx[0, 0], [[0, 1, 0], [0, 0, 0], [0, 0, 0]])


def test_caffe_max_padded_and_ave_padded():
    x = _planes([[1, 2, 4], [2, 3, 2], [4, 2, 1]], 1, 1)
    y, = _run(lambda v: P.max_pool(v, kernel=3, stride=2, pad=2, ceil_mode=True), x)
    np.testing.assert_array_equal(y, _planes([[1, 4, 4], [4, 4, 4], [4, 4, 1]], 1, 1))
    y, = _run(lambda v: P.avg_pool(v, kernel=3, stride=1, pad=1, ceil_mode=True), np.full((1, 1, 3, 3), 2, np.float32))
    want = np.array([[8 / 9, 4 / 3, 8 / 9], [4 / 3, 2, 4 / 3], [8 / 9, 4 / 3, 8 / 9]], np.float32)
    np.testing.assert_allclose(y[0, 0], want, rtol=1e-6)


def test_caffe_shapes_and_ceil_rules():
    x = np.zeros((2, 3, 6, 5), np.float32)
    assert _run(lambda v: P.max_pool(v, kernel=3, stride=2, ceil_mode=True), x)[0].shape == (2, 3, 3, 2)
    assert _run(lambda v: P.avg_pool(v, kernel=3, stride=2, pad=1, ceil_mode=True), x)[0].shape == (2, 3, 4, 3)
    assert _run(P.global_avg_pool, x)[0].shape == (2, 3, 1, 1)
    # GoogLeNet pool1: ceil gives 56 where floor (and conv) give 55
    big = np.zeros((1, 1, 112, 112), np.float32)
    assert _run(lambda v: P.max_pool(v, kernel=3, stride=2, ceil_mode=True), big)[0].shape[2:] == (56, 56)
    assert _run(lambda v: P.max_pool(v, kernel=3, stride=2), big)[0].shape[2:] == (55, 55)
    # k3 s2 p1 on 28 -> 15 (no clip); k2 s2 p1 on 5 -> ceil gives 4, the clip rule takes it to 3
    assert _run(lambda v: P.max_pool(v, kernel=3, stride=2, pad=1, ceil_mode=True),
                np.zeros((1, 1, 28, 28), np.float32))[0].shape[2:] == (15, 15)
    assert _run(lambda v: P.max_pool(v, kernel=2, stride=2, pad=1, ceil_mode=True),
                np.zeros((1, 1, 5, 5), np.float32))[0].shape[2:] == (3, 3)
    assert _run(lambda v: P.max_pool(v, kernel=3, stride=2, pad=2, ceil_mode=True),
                np.zeros((1, 1, 3, 3), np.float32))[0].shape[2:] == (3, 3)


def test_caffe_ave_ramp_ceil_overhang():
    # windows running past the image edge in ceil mode are divided by their clipped size
    ramp = np.arange(36, dtype=np.float32).reshape(1, 1, 6, 6)
    y, = _run(lambda v: P.avg_pool(v, kernel=3, stride=2, ceil_mode=True), ramp)
    np.testing.assert_allclose(y[0, 0], [[7, 9, 10.5], [19, 21, 22.5], [28, 30, 31.5]], rtol=1e-6)


def test_kernels_write_into_out():
    x = r(2, 3, 6, 5)
    attrs = dict(kernel=(3,), stride=(2,), pad=(1,), ceil_mode=True)
    buf = np.empty((2, 3, 4, 3), np.float32)
    assert P.max_pool.bind(np, dict(attrs, return_mask=False))(x, out=buf) is buf
    np.testing.assert_array_equal(buf, ref_pool(x, 3, 2, 1, True)[0])
    assert P.avg_pool.bind(np, dict(attrs, count_include_pad=True))(x, out=buf) is buf
    np.testing.assert_allclose(buf, ref_pool(x, 3, 2, 1, True, mode="avg"), rtol=1e-5, atol=1e-6)
    gbuf = np.empty_like(x)
    assert P.max_pool_grad.bind(np, attrs)(x, buf, out=gbuf) is gbuf
    np.testing.assert_allclose(gbuf, ref_max_pool_grad(x, buf, kernel=3, stride=2, pad=1, ceil_mode=True), rtol=1e-6)


# --------------------------------------------------------------------------- errors in the user's terms

def test_bad_pooling_arguments():
    x = input_value(TensorType((None, 3, 8, 8), "float32"), "x")
    with pytest.raises(ShapeError, match=r"must be smaller than the kernel.*test_pool\.py"):
        P.max_pool(x, kernel=2, pad=2)
    with pytest.raises(ShapeError, match=r"kernel has 3 values.*test_pool\.py"):
        P.avg_pool(x, kernel=(2, 2, 2))
    with pytest.raises(ShapeError, match=r"larger than the padded input"):
        P.max_pool(x, kernel=9)
    with pytest.raises(ShapeError, match=r"at least one spatial axis"):
        P.global_max_pool(input_value(TensorType((2, 3), "float32")))
    with pytest.raises(GraphBuildError, match=r"needs attribute 'kernel'"):
        P.max_pool(x)


# --------------------------------------------------------------------------- PyTorch, where installed

TORCH_POOL = [
    dict(kernel=3, stride=2, pad=1, ceil_mode=True),
    dict(kernel=(3, 2), stride=(2, 1), pad=(1, 0), ceil_mode=False),
    dict(kernel=2, stride=2, pad=1, ceil_mode=True),
    dict(kernel=3, stride=3, pad=1, ceil_mode=True),
]


@pytest.mark.parametrize("cfg", TORCH_POOL, ids=str)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_against_torch(cfg, count_include_pad):
    torch = pytest.importorskip("torch")
    functional = torch.nn.functional
    x = rng.standard_normal((2, 3, 7, 8))
    kw = dict(kernel_size=cfg["kernel"], stride=cfg["stride"], padding=cfg["pad"], ceil_mode=cfg["ceil_mode"])
    tx = torch.tensor(x, requires_grad=True)
    tmax = functional.max_pool2d(tx, **kw)
    tavg = functional.avg_pool2d(tx, count_include_pad=count_include_pad, **kw)
    seed_max = rng.standard_normal(tuple(tmax.shape))
    seed_avg = rng.standard_normal(tuple(tavg.shape))
    ((tmax * torch.tensor(seed_max)).sum() + (tavg * torch.tensor(seed_avg)).sum()).backward()

    xs = input_value(TensorType(x.shape, "float64"), "x")
    ymax = P.max_pool(xs, **cfg)
    yavg = P.avg_pool(xs, count_include_pad=count_include_pad, **cfg)
    cost = E.add(R.sum(E.mul(ymax, seed_max)), R.sum(E.mul(yavg, seed_avg)))
    got = cgvm.compile([xs], [ymax, yavg, cgvm.grad(cost, xs)])(x)
    for mine, theirs in zip(got, [tmax, tavg, tx.grad]):
        np.testing.assert_allclose(mine, theirs.detach().numpy(), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("size, ceil_mode", [((4, 6), True), ((5, 7), False)])
def test_tiled_max_pool_gradient_goes_to_the_first_maximum(size, ceil_mode):
    """2x2/2 pooling takes the tiled fast path (floor mode: the tiled part of an odd-sized input);
    ties (ReLU zeros) must still go to the first maximum, and untiled rows get no gradient."""
    import cgvm
    from cgvm.ir import TensorType, input_value
    from cgvm.ops import pool as P

    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3) + size).astype(np.float32)
    x[x < 0.3] = 0.0                      # many tied zeros
    g = rng.standard_normal((2, 3, size[0] // 2, size[1] // 2)).astype(np.float32)
    xs, gs = input_value(TensorType(x.shape), "x"), input_value(TensorType(g.shape), "g")
    got = cgvm.compile([xs, gs], P.max_pool_grad(xs, gs, kernel=(2,), ceil_mode=ceil_mode))(x, g)
    want = np.zeros_like(x)
    for n, c, i, j in np.ndindex(*g.shape):
        window = x[n, c, 2 * i:2 * i + 2, 2 * j:2 * j + 2]
        a, b = np.unravel_index(np.argmax(window), (2, 2))   # argmax: first maximum, row-major
        want[n, c, 2 * i + a, 2 * j + b] += g[n, c, i, j]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape,ceil", [((3, 4, 8, 6), False), ((2, 3, 9, 7), False), ((2, 3, 8, 8), True)])
def test_max_pool_grad_with_the_pooled_output_routes_as_without_it(shape, ceil):
    """The gradient reads the forward's maxima instead of finding them again; routing (ties included)
    must not change, in exact and cropped (floor mode) tilings."""
    rng = np.random.default_rng(7)
    x = np.maximum(rng.standard_normal(shape), 0.0).astype(np.float32)   # ReLU zeros: many ties
    attrs = dict(kernel=(2, 2), stride=(2, 2), pad=(0,), ceil_mode=ceil)
    y = P.max_pool.bind(np, dict(attrs, return_mask=False))(x)
    g = rng.standard_normal(y.shape).astype(np.float32)
    grad = P.max_pool_grad.bind(np, attrs)
    np.testing.assert_array_equal(grad(x, g, y), grad(x, g))
    xv = input_value(TensorType(shape, "float32"), "x")
    (gx,) = cgvm.grad(R.sum(P.max_pool(xv, **attrs)), [xv])
    assert gx.node.op.name == "max_pool_grad" and len(gx.node.inputs) == 3


@pytest.mark.parametrize("kernel,stride,pad", [((3, 3), (2, 2), (1, 1)), ((2, 2), (2, 2), (0, 0)), ((3, 2), (1, 2), (1, 0))])
def test_pooling_in_plane_chunks_matches_the_whole(monkeypatch, kernel, stride, pad):
    """Pooling runs a few (sample, channel) planes at a time, one axis at a time for k x k windows
    with k > 2; chunk boundaries must not change a value (max and average, with padding)."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 5, 9, 8))
    attrs = dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=True)
    mx = P.max_pool.bind(np, dict(attrs, return_mask=False))
    av = P.avg_pool.bind(np, dict(attrs, count_include_pad=True))
    want_max, want_avg = ref_pool(x, kernel, stride, pad, True, "max")[0], ref_pool(x, kernel, stride, pad, True, "avg")
    monkeypatch.setattr(pool_windows, "POOL_CHUNK_BYTES", x[0, 0].nbytes * 4)   # 4 planes a chunk: 15 = 4+4+4+3
    np.testing.assert_allclose(mx(x), want_max, rtol=1e-12)
    np.testing.assert_allclose(av(x), want_avg, rtol=1e-12)


@pytest.mark.parametrize("kernel", [(2, 2), (3, 3), (2, 3), (1, 2), (3, 1)])
def test_windows_tiling_the_input_pool_columns_then_rows(monkeypatch, kernel):
    """Exactly tiled 2-D windows take pool_tiled's layout (columns first, in row chunks); max and
    average must match Caffe's loops, across chunk boundaries, ties (ReLU zeros) included."""
    from cgvm.ops.kernels import pool_tiled

    monkeypatch.setattr(pool_tiled, "CHUNK_BYTES", 200)
    x = np.maximum(r(2, 3, 6 * kernel[0], 4 * kernel[1]), 0)
    calls = []
    real = pool_tiled.pool_2d
    monkeypatch.setattr(pool_tiled, "pool_2d", lambda *a: calls.append(1) or real(*a))
    attrs = dict(kernel=kernel, stride=kernel, pad=(0,), ceil_mode=False)
    got = P.max_pool.bind(np, dict(attrs, return_mask=False))(x)
    np.testing.assert_array_equal(got, ref_pool(x, kernel)[0])
    got = P.avg_pool.bind(np, dict(attrs, count_include_pad=True))(x)
    np.testing.assert_allclose(got, ref_pool(x, kernel, mode="avg"), rtol=1e-6)
    assert len(calls) == 2


@pytest.mark.parametrize("pooled", [True, False])
@pytest.mark.parametrize("size", [(8, 10), (9, 11)])
def test_two_by_two_gradient_in_two_stages_routes_to_the_first_maximum(pooled, size):
    """max_grad_2x2 (columns, then rows) against Caffe's routing, ties included, into a
    non-contiguous output buffer too; in floor mode an odd last row and column get zeros."""
    from cgvm.ops.kernels import pool_tiled

    x = np.maximum(r(3, 4, *size), 0.5)                        # many tied 0.5s
    x[0, 0, :2, :2] = [[1.0, 2.0], [2.0, 1.0]]                 # tie across rows: the top one wins
    g = r(3, 4, 4, 5)
    y = P.max_pool.bind(np, dict(kernel=(2, 2), stride=(2, 2), pad=(0,), ceil_mode=False, return_mask=False))(x)
    np.testing.assert_array_equal(y, ref_pool(x, (2, 2), stride=(2, 2))[0])
    want = ref_max_pool_grad(x, g, kernel=(2, 2))
    np.testing.assert_array_equal(pool_tiled.max_grad_2x2(np, x, g, y if pooled else None, None), want)
    out = np.full(size[::-1] + (4, 3), np.nan, np.float32).transpose(3, 2, 1, 0)   # shaped like x, not contiguous
    assert pool_tiled.max_grad_2x2(np, x, g, y if pooled else None, out) is out
    np.testing.assert_array_equal(out, want)
    assert want[0, 0, 0, 1] == g[0, 0, 0, 0] and want[0, 0, 1, 0] == 0


@pytest.mark.parametrize("kernel,stride,pad,ceil", [((3, 3), (2, 2), (1, 1), False), ((3, 2), (1, 2), (1, 0), True),
                                                     ((2, 2), (1, 1), (0, 0), False)])
@pytest.mark.parametrize("pooled", [True, False])
def test_overlapping_max_pool_gradient_in_plane_chunks_matches_caffe(monkeypatch, kernel, stride, pad, ceil, pooled):
    """The general gradient (overlapping, padded, ceil-mode windows) goes a few planes at a time;
    each g must reach its window's first maximum (ReLU ties included), summed where windows overlap."""
    monkeypatch.setattr(pool_windows, "POOL_CHUNK_BYTES", 7 * 9 * 4 * 3)   # chunks of 3 planes of a 7x9 input
    x = np.maximum(r(2, 5, 7, 9), 0)
    attrs = dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil)
    y = P.max_pool.bind(np, dict(attrs, return_mask=False))(x)
    g = r(*y.shape)
    got = P.max_pool_grad.bind(np, attrs)(x, g, *([y] if pooled else []))
    np.testing.assert_allclose(got, ref_max_pool_grad(x, g, **attrs), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(64, 16, 26, 26), (64, 32, 11, 11), (3, 4, 7, 9)])
def test_two_by_two_pooling_and_gradient_equal_torch_on_relu_maps(shape):
    """The Keras CNN's poolings (exact and floor-mode 2x2 over ReLU maps, many tied zeros) and their
    gradients, with g as the strided view the channels-last graph hands over, equal PyTorch's exactly."""
    torch = pytest.importorskip("torch")
    gen = np.random.default_rng(1)
    x = np.maximum(gen.standard_normal(shape), 0).astype(np.float32)
    x[0, 0, :2, :2] = [[1, 2], [2, 1]]                      # a tie across rows: the top one wins
    attrs = dict(kernel=(2, 2), stride=(2, 2), pad=(0,), ceil_mode=False)
    y = P.max_pool.bind(np, dict(attrs, return_mask=False))(x)
    g = gen.standard_normal(y.shape).astype(np.float32)
    strided_g = np.ascontiguousarray(g.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    grad = P.max_pool_grad.bind(np, attrs)
    tx = torch.from_numpy(x).requires_grad_()
    ty = torch.nn.functional.max_pool2d(tx, 2)
    ty.backward(torch.from_numpy(g))
    np.testing.assert_array_equal(y, ty.detach().numpy())
    np.testing.assert_array_equal(grad(x, strided_g, y), tx.grad.numpy())
    np.testing.assert_array_equal(grad(x, g), tx.grad.numpy())


@pytest.mark.parametrize("kernel,stride,pad,ceil", [((2, 2), (2, 2), (0, 0), False), ((3, 3), (2, 2), (1, 1), True),
                                                    ((2, 3), (1, 2), (1, 0), False)])
def test_an_infinite_gradient_reaches_only_the_window_maximum(kernel, stride, pad, ceil):
    """As Caffe's scatter to the argmax: the other elements get exactly 0, not 0 * inf = NaN."""
    x = r(2, 3, 8, 9)
    attrs = dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil)
    y = P.max_pool.bind(np, dict(attrs, return_mask=False))(x)
    g = r(*y.shape)
    g[1, 2, 1, 1] = -np.inf
    got = P.max_pool_grad.bind(np, attrs)(x, g, y)
    assert not np.isnan(got).any() and np.isinf(got).sum() == 1
    np.testing.assert_allclose(got, ref_max_pool_grad(x, g, **attrs), rtol=1e-6)
