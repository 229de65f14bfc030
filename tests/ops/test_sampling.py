"""grid_sample against a point-by-point NumPy loop (ONNX GridSample's rules), PyTorch's grid_sample,
and numeric gradients with respect to the image and the grid."""
import math

import numpy as np
import pytest

from cgvm.errors import GraphBuildError, ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import sampling as SA
from harness import Case, check_case, check_grad, linear_adjoint, run_op

rng = np.random.default_rng(21)


def r(*shape):
    return rng.standard_normal(shape)


def grid(*shape, spread=1.3):
    """Points mostly inside [-1, 1], some outside (the padding modes matter there)."""
    return rng.uniform(-spread, spread, shape)


# --------------------------------------------------------------------------- the reference, one point at a time

def _reflect(v, lo, hi):
    span = hi - lo
    if span <= 0:
        return lo
    while v < lo or v > hi:
        v = 2 * lo - v if v < lo else 2 * hi - v
    return v


def _bounds(n, align):
    return (0.0, n - 1.0) if align else (-0.5, n - 0.5)


def _pixel(img, index, padding, align):
    """img[index] with the padding rule for an integer tap index per axis."""
    pos = []
    for i, n in zip(index, img.shape):
        if padding == "zeros":
            if not 0 <= i < n:
                return 0.0
        elif padding == "border":
            i = min(max(i, 0), n - 1)
        else:
            i = min(max(int(_reflect(float(i), *_bounds(n, align))), 0), n - 1)
        pos.append(i)
    return img[tuple(pos)]


def _keys(t):
    a = -0.75
    t = abs(t)
    if t <= 1:
        return (a + 2) * t ** 3 - (a + 3) * t ** 2 + 1
    if t < 2:
        return a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a
    return 0.0


def ref_grid_sample(x, g, mode="linear", padding_mode="zeros", align_corners=False):
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    nsp = len(sizes)
    out = np.zeros((n, c) + g.shape[1:-1])
    for b in range(n):
        for o in np.ndindex(*g.shape[1:-1]):
            coords = g[(b,) + o][::-1]
            pos = []
            for v, size in zip(coords, sizes):
                p = (v + 1) / 2 * (size - 1) if align_corners else ((v + 1) * size - 1) / 2
                if mode == "nearest":
                    p = float(np.rint(p))
                lo, hi = _bounds(size, align_corners)
                if p < lo or p > hi:
                    if padding_mode == "border":
                        p = min(max(p, 0), size - 1)
                    elif padding_mode == "reflection":
                        p = _reflect(p, lo, hi)
                pos.append(p)
            if mode == "nearest":
                taps = [[(int(p), 1.0)] for p in pos]
            elif mode == "linear":
                taps = [[(math.floor(p), 1 - (p - math.floor(p))), (math.floor(p) + 1, p - math.floor(p))]
                        for p in pos]
            else:
                taps = [[(math.floor(p) + k, _keys(p - math.floor(p) - k)) for k in (-1, 0, 1, 2)] for p in pos]
            for ch in range(c):
                total = 0.0
                for combo in np.ndindex(*[len(t) for t in taps]):
                    index = [taps[d][combo[d]][0] for d in range(nsp)]
                    weight = np.prod([taps[d][combo[d]][1] for d in range(nsp)])
                    total += weight * _pixel(x[b, ch], index, padding_mode, align_corners)
                out[(b, ch) + o] = total
    return out


# --------------------------------------------------------------------------- cases

def sample_case(name, x, g, grad=True, **attrs):
    return Case(name, lambda a, b: SA.grid_sample(a, b, **attrs), [x, g],
                lambda a, b: ref_grid_sample(a, b, **attrs), grad=grad, eps=1e-6, grad_rtol=1e-4, grad_atol=1e-6)


CASES = [
    sample_case("linear_zeros", r(2, 3, 5, 6), grid(2, 4, 3, 2)),
    sample_case("linear_zeros_align", r(1, 2, 4, 5), grid(1, 3, 4, 2), align_corners=True),
    sample_case("linear_border", r(1, 2, 5, 4), grid(1, 4, 4, 2, spread=1.8), padding_mode="border"),
    sample_case("linear_reflection", r(1, 2, 4, 6), grid(1, 3, 5, 2, spread=2.5), padding_mode="reflection"),
    sample_case("linear_reflection_align", r(1, 1, 5, 5), grid(1, 4, 3, 2, spread=3.2), padding_mode="reflection",
                align_corners=True),
    sample_case("cubic_zeros", r(1, 2, 5, 6), grid(1, 3, 4, 2), mode="cubic"),
    sample_case("cubic_border_align", r(1, 2, 6, 5), grid(1, 3, 3, 2, spread=1.6), mode="cubic",
                padding_mode="border", align_corners=True),
    sample_case("cubic_reflection", r(1, 1, 5, 4), grid(1, 4, 2, 2, spread=2.2), mode="cubic",
                padding_mode="reflection"),
    sample_case("nearest_zeros", r(2, 2, 4, 5), grid(2, 3, 3, 2), mode="nearest"),
    sample_case("nearest_reflection_align", r(1, 2, 5, 4), grid(1, 3, 4, 2, spread=2.0), mode="nearest",
                padding_mode="reflection", align_corners=True),
    sample_case("linear_3d", r(1, 2, 3, 4, 5), grid(1, 2, 3, 2, 3)),
    sample_case("nearest_3d_border", r(1, 1, 4, 3, 5), grid(1, 3, 2, 2, 3, spread=1.5), mode="nearest",
                padding_mode="border"),
    sample_case("linear_1d_border", r(2, 3, 7), grid(2, 5, 1), padding_mode="border"),
    Case("grad_x", lambda g, x, gr: SA.grid_sample_grad_x(g, x, gr, mode="cubic", padding_mode="reflection"),
         [r(1, 2, 3, 4), r(1, 2, 5, 4), grid(1, 3, 4, 2, spread=2.0)],
         lambda g, x, gr: _adjoint_x(g, x, gr, mode="cubic", padding_mode="reflection"), grad=False),
    Case("grad_grid", lambda g, x, gr: SA.grid_sample_grad_grid(g, x, gr, padding_mode="border", align_corners=True),
         [r(1, 2, 3, 4), r(1, 2, 5, 4), grid(1, 3, 4, 2, spread=1.5)],
         lambda g, x, gr: _numeric_grid_grad(g, x, gr, padding_mode="border", align_corners=True), grad=False,
         rtol=1e-5, atol=1e-6),
]


def _adjoint_x(g, x, gr, **attrs):
    """d/dx of sum(g * grid_sample(x)) through the reference."""
    return linear_adjoint(lambda u: ref_grid_sample(u, gr, **attrs), x, g)


def _numeric_grid_grad(g, x, gr, eps=1e-6, **attrs):
    out = np.zeros(gr.shape)
    flat = gr.reshape(-1).copy()
    for j in range(flat.size):
        plus, minus = flat.copy(), flat.copy()
        plus[j] += eps
        minus[j] -= eps
        hi = (ref_grid_sample(x, plus.reshape(gr.shape), **attrs) * g).sum()
        lo = (ref_grid_sample(x, minus.reshape(gr.shape), **attrs) * g).sum()
        out.reshape(-1)[j] = (hi - lo) / (2 * eps)
    return out


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)


# --------------------------------------------------------------------------- PyTorch

@pytest.mark.parametrize("mode", ["bilinear", "bicubic", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_matches_pytorch(mode, padding_mode, align_corners):
    torch = pytest.importorskip("torch")
    x = r(2, 3, 6, 7).astype(np.float32)
    # bicubic with border padding: ONNX clamps a position outside the image to its edge pixel,
    # PyTorch clamps each tap, so they agree only for points inside the image
    spread = 1.0 if (mode, padding_mode) == ("bicubic", "border") else 1.6
    g = grid(2, 5, 4, 2, spread=spread).astype(np.float32)
    if mode == "nearest":
        # keep points off the rounding ties, where PyTorch rounds after padding and ONNX before
        g = np.round(g * 8) / 8 + 1.0 / 64
    ours = {"bilinear": "linear", "bicubic": "cubic", "nearest": "nearest"}[mode]
    got = run_op(lambda a, b: SA.grid_sample(a, b, mode=ours, padding_mode=padding_mode, align_corners=align_corners),
                 [x, g])[0]
    want = torch.nn.functional.grid_sample(torch.from_numpy(x), torch.from_numpy(g), mode=mode,
                                           padding_mode=padding_mode, align_corners=align_corners).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gradients_match_pytorch():
    torch = pytest.importorskip("torch")
    import cgvm

    x = r(1, 2, 5, 6)
    g = grid(1, 4, 3, 2, spread=1.4)
    w = r(1, 2, 4, 3)
    tx = torch.tensor(x, requires_grad=True)
    tg = torch.tensor(g, requires_grad=True)
    (torch.nn.functional.grid_sample(tx, tg, mode="bilinear", padding_mode="reflection", align_corners=False)
     * torch.from_numpy(w)).sum().backward()
    xs = input_value(TensorType(x.shape, np.float64), "x")
    gs = input_value(TensorType(g.shape, np.float64), "g")
    y = SA.grid_sample(xs, gs, padding_mode="reflection")
    cost = cgvm.ops.reduce.sum(cgvm.ops.elementwise.mul(y, w))
    dx, dg = cgvm.grad(cost, [xs, gs])
    got_x, got_g = cgvm.compile([xs, gs], [dx, dg])(x, g)
    np.testing.assert_allclose(got_x, tx.grad.numpy(), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got_g, tg.grad.numpy(), rtol=1e-6, atol=1e-9)


def test_bad_grids_are_refused():
    x = input_value(TensorType((1, 2, 4, 4), np.float32), "x")
    with pytest.raises((ShapeError, GraphBuildError)):
        SA.grid_sample(x, input_value(TensorType((1, 3, 3, 3), np.float32), "g"))     # 3 coordinates for 2-D
    with pytest.raises((ShapeError, GraphBuildError)):
        SA.grid_sample(x, input_value(TensorType((2, 3, 3, 2), np.float32), "g"))     # batch 2 for batch 1
    with pytest.raises((ValueError, GraphBuildError)):
        SA.grid_sample(x, input_value(TensorType((1, 3, 3, 2), np.float32), "g"), mode="area")
