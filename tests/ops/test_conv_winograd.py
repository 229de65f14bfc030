"""Winograd F(2x2, 3x3) and F(4x4, 3x3) convolution against a direct NumPy loop, and conv's choice of it."""
import numpy as np
import pytest

import cgvm
from cgvm.ir import TensorType, input_value
from cgvm.ops import conv as CV
from cgvm.ops.kernels import conv_im2col as IM
from cgvm.ops.kernels import conv_winograd as WG
from cgvm.ops import elementwise as E

rng = np.random.default_rng(11)


def direct_conv(x, w, b=None, pads=((1, 1), (1, 1))):
    """y[n, o, i, j] = b[o] + sum_{c, ki, kj} w[o, c, ki, kj] * xpad[n, c, i + ki, j + kj], in float64."""
    xpad = np.pad(x.astype(np.float64), [(0, 0), (0, 0), pads[0], pads[1]])
    out_h, out_w = xpad.shape[2] - 2, xpad.shape[3] - 2
    y = np.zeros((x.shape[0], w.shape[0], out_h, out_w))
    for ki in range(3):
        for kj in range(3):
            window = xpad[:, :, ki:ki + out_h, kj:kj + out_w]
            y += np.einsum("oc,nchw->nohw", w[:, :, ki, kj].astype(np.float64), window)
    if b is not None:
        y += b.astype(np.float64).reshape(1, -1, 1, 1)
    return y


def run_winograd(x, w, b, pads, tile):
    out_h = x.shape[2] + pads[0][0] + pads[0][1] - 2
    out_w = x.shape[3] + pads[1][0] + pads[1][1] - 2
    out = np.full((x.shape[0], w.shape[0], out_h, out_w), np.nan, dtype=x.dtype)
    result = WG.winograd_conv2d(np, x, w, b, pads, out, tile)
    assert result is out
    return out


def relative_error(got, want):
    return np.abs(got - want).max() / np.abs(want).max()


@pytest.mark.parametrize("tile", [2, 4])
def test_one_dimensional_transforms_compute_a_correlation_exactly(tile):
    at, g, bt = WG.winograd_matrices(tile)
    assert at.shape == (tile, tile + 2) and g.shape == (tile + 2, 3) and bt.shape == (tile + 2, tile + 2)
    for _ in range(5):
        filt, data = rng.standard_normal(3), rng.standard_normal(tile + 2)
        want = [filt @ data[i:i + 3] for i in range(tile)]
        np.testing.assert_allclose(at @ ((g @ filt) * (bt @ data)), want, rtol=0, atol=1e-13)


SHAPES = [  # (N, C, O, H, W, pads)
    (2, 3, 4, 8, 8, ((1, 1), (1, 1))),        # even sizes, a multiple of both tiles
    (1, 2, 3, 7, 9, ((1, 1), (1, 1))),        # odd sizes: ragged last tiles
    (3, 1, 1, 5, 6, ((0, 0), (0, 0))),        # no padding
    (2, 4, 2, 6, 5, ((2, 2), (2, 2))),        # padding 2: output larger than the input
    (1, 3, 5, 3, 3, ((0, 0), (0, 0))),        # a single output pixel
    (2, 2, 3, 9, 4, ((0, 2), (1, 0))),        # asymmetric padding
    (1, 5, 4, 13, 11, ((1, 1), (2, 2))),
]


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:5])) + f"-pad{s[5]}")
@pytest.mark.parametrize("with_bias", [False, True])
def test_float64_matches_the_direct_loop(tile, shape, with_bias):
    n, c, o, h, w_, pads = shape
    x = rng.standard_normal((n, c, h, w_))
    w = rng.standard_normal((o, c, 3, 3))
    b = rng.standard_normal(o) if with_bias else None
    got = run_winograd(x, w, b, pads, tile)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, direct_conv(x, w, b, pads), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("tile", [2, 4])
@pytest.mark.parametrize("shape", [(2, 16, 8, 14, 14, ((1, 1), (1, 1))), (1, 64, 32, 9, 7, ((1, 1), (1, 1))),
                                   (4, 128, 128, 7, 7, ((1, 1), (1, 1)))])
def test_float32_error_is_small_relative_to_the_output(tile, shape):
    n, c, o, h, w_, pads = shape
    x = rng.standard_normal((n, c, h, w_)).astype(np.float32)
    w = (rng.standard_normal((o, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    got = run_winograd(x, w, b, pads, tile)
    assert got.dtype == np.float32
    assert relative_error(got, direct_conv(x, w, b, pads)) < 2e-5


@pytest.mark.parametrize("tile", [2, 4])
def test_bands_and_sample_chunks_cover_the_whole_output(monkeypatch, tile):
    """A tiny budget gives bands of one tile row of one sample; larger minimum band sizes give
    chunks of several samples, the last one shorter."""
    x = rng.standard_normal((5, 3, 10, 9))
    w = rng.standard_normal((4, 3, 3, 3))
    b = rng.standard_normal(4)
    want = direct_conv(x, w, b)
    per_sample = -(-10 // tile) * -(-9 // tile)
    monkeypatch.setattr(WG, "BAND_BUDGET_BYTES", 1)
    for min_tiles, samples in [(1, 1), (per_sample, 1), (2 * per_sample, 2), (3 * per_sample + 1, 3)]:
        monkeypatch.setattr(WG, "MIN_BAND_TILES", min_tiles)
        plan = WG._Plan(x.shape, 4, ((1, 1), (1, 1)), tile, 8)
        assert plan.samples == samples
        assert plan.band_rows == (1 if min_tiles == 1 else plan.tiles_h)
        np.testing.assert_allclose(run_winograd(x, w, b, ((1, 1), (1, 1)), tile), want, rtol=1e-10, atol=1e-10)


def test_the_plan_splits_large_images_into_bands_of_rows():
    plan = WG._Plan((2, 64, 112, 112), 64, ((1, 1), (1, 1)), 4, 4)
    assert (plan.tiles_h, plan.tiles_w, plan.rows, plan.cols_per_phase) == (28, 28, 114, 29)
    assert plan.samples == 1 and 1 <= plan.band_rows < 28
    assert plan.band_tiles * 2 * plan.tile_floats * 4 <= max(WG.BAND_BUDGET_BYTES,
                                                              2 * WG.MIN_BAND_TILES * plan.tile_floats * 4)
    small = WG._Plan((16, 512, 7, 7), 512, ((1, 1), (1, 1)), 2, 4)
    assert small.band_rows == small.tiles_h == 4 and 2 <= small.samples < 16


# --------------------------------------------------------------------------- choice in conv_forward

def pick(x_shape, w_shape, stride=1, pad=1, dilation=1, groups=1, dtype=np.float32):
    x = np.zeros(x_shape, dtype)
    w = np.zeros(w_shape, dtype)
    geo = CV.ConvGeometry(len(x_shape) - 2, (stride,), (pad,), (dilation,), groups)
    kind, tile = IM.forward_methods(x.shape, w.shape, x.dtype, geo)[0]
    return tile if kind == "winograd" else None


def test_resnet_like_convolutions_take_winograd():
    assert pick((16, 64, 56, 56), (64, 64, 3, 3)) == 4
    assert pick((16, 128, 28, 28), (128, 128, 3, 3)) == 4
    assert pick((16, 256, 14, 14), (256, 256, 3, 3)) == 4
    assert pick((16, 512, 7, 7), (512, 512, 3, 3)) == 2          # 16 MiB of F(2x2) weights beat 36 MiB
    assert pick((32, 512, 7, 7), (512, 512, 3, 3)) == 4          # ... unless the batch is larger
    assert pick((16, 512, 5, 5), (512, 512, 3, 3)) == 2          # ragged 5x5: F(2x2) has less work
    assert pick((1, 64, 56, 56), (64, 64, 3, 3), dtype=np.float64) == 4
    assert pick((16, 64, 56, 56), (16, 64, 3, 3)) == 4            # 16 output channels from 64


@pytest.mark.parametrize("case", [
    dict(x_shape=(16, 64, 56, 56), w_shape=(128, 64, 3, 3), stride=2),       # stride 2
    dict(x_shape=(16, 64, 56, 56), w_shape=(64, 64, 1, 1), pad=0),            # 1x1
    dict(x_shape=(16, 3, 224, 224), w_shape=(64, 3, 7, 7), stride=2, pad=3),  # 7x7 stem
    dict(x_shape=(16, 64, 56, 56), w_shape=(64, 32, 3, 3), groups=2),         # grouped
    dict(x_shape=(16, 64, 56, 56), w_shape=(64, 64, 3, 3), dilation=2),       # dilated
    dict(x_shape=(8, 3, 64, 64), w_shape=(32, 3, 3, 3)),                      # 3 input channels
    dict(x_shape=(16, 16, 56, 56), w_shape=(64, 16, 3, 3)),                   # 16 input channels
    dict(x_shape=(16, 64, 56, 56), w_shape=(8, 64, 3, 3)),                    # 8 output channels
    dict(x_shape=(1, 256, 14, 14), w_shape=(256, 256, 3, 3)),                 # 16 tiles for 256x256 weights
    dict(x_shape=(16, 64, 56, 56), w_shape=(64, 64, 3, 3), dtype=np.float16),
    dict(x_shape=(16, 64, 56), w_shape=(64, 64, 3)),                          # 1-D
    dict(x_shape=(2, 32, 8, 8, 8), w_shape=(32, 32, 3, 3, 3)),                # 3-D
], ids=["stride2", "1x1", "stem", "groups", "dilation", "3-channels", "16-in", "8-out", "few-tiles", "float16",
                      "1d", "3d"])
def test_other_convolutions_keep_im2col(case):
    assert pick(**case) is None


def test_conv_forward_sends_eligible_calls_to_the_winograd_kernel(monkeypatch):
    calls = []
    real = WG.winograd_conv2d

    def spy(xp, x, w, b, pads, out, tile, temps=None):
        calls.append((x.shape, tile))
        return real(xp, x, w, b, pads, out, tile, temps)

    monkeypatch.setattr(WG, "winograd_conv2d", spy)
    x = rng.standard_normal((4, 32, 16, 16)).astype(np.float32)
    w = (rng.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    got = IM.conv_forward(np, x, w, b, CV.ConvGeometry(2, (1,), (1,), (1,), 1))
    assert calls == [((4, 32, 16, 16), 4)]
    assert relative_error(got, direct_conv(x, w, b)) < 2e-5
    IM.conv_forward(np, x, w[:, :, :1, :1], b, CV.ConvGeometry(2, (1,), (0,), (1,), 1))
    IM.conv_forward(np, x, w, b, CV.ConvGeometry(2, (2,), (1,), (1,), 1))
    assert len(calls) == 1


def test_a_non_contiguous_output_buffer_gets_the_result():
    x = rng.standard_normal((4, 32, 16, 16))
    w = rng.standard_normal((32, 32, 3, 3))
    big = np.zeros((4, 32, 16, 32))
    out = big[..., ::2]
    result = IM.conv_forward(np, x, w, None, CV.ConvGeometry(2, (1,), (1,), (1,), 1), out=out)
    assert result is out
    np.testing.assert_allclose(out, direct_conv(x, w), rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- through the compiler

def compiled_pair(build, monkeypatch, x):
    """The compiled function's result with Winograd, and with Winograd switched off (im2col)."""
    xv = input_value(TensorType((None,) + x.shape[1:], x.dtype.name), "x")
    winograd = cgvm.compile([xv], build(xv))
    monkeypatch.setattr(WG, "MIN_IN_CHANNELS", 10 ** 9)
    im2col = cgvm.compile([xv], build(xv))
    return winograd, winograd(x), im2col(x)


def test_compiled_conv_is_unchanged(monkeypatch):
    x = rng.standard_normal((4, 32, 15, 16)).astype(np.float32)
    w = (rng.standard_normal((48, 32, 3, 3)) / 17).astype(np.float32)
    b = rng.standard_normal(48).astype(np.float32)
    _, winograd, im2col = compiled_pair(lambda v: CV.conv(v, w, b, pad=1), monkeypatch, x)
    want = direct_conv(x, w, b)
    assert relative_error(winograd, want) < 2e-5 and relative_error(im2col, want) < 2e-5
    np.testing.assert_allclose(winograd, im2col, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_compiled_conv_bias_relu_fuses_and_is_unchanged(monkeypatch):
    x = rng.standard_normal((4, 32, 16, 16))
    w = rng.standard_normal((32, 32, 3, 3)) / 17
    b = rng.standard_normal((32, 1, 1))
    f, winograd, im2col = compiled_pair(lambda v: E.relu(E.add(CV.conv(v, w, pad=1), b)), monkeypatch, x)
    assert [n.op.name for n in f.graph.nodes] == ["conv_bias_act"]
    want = np.maximum(direct_conv(x, w, b.reshape(-1)), 0)
    np.testing.assert_allclose(winograd, want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(im2col, want, rtol=1e-10, atol=1e-10)
