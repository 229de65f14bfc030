"""Forward values and shapes from Caffe's hand-written tests (caffe_tests.md §A) and its tie rules."""
import numpy as np
import pytest

from caffe_helpers import one_layer_net

SQUARE = np.array([[1, 2, 5, 2, 3], [9, 4, 1, 4, 8], [1, 2, 5, 2, 3]], np.float32)
MAGIC6 = np.array([[35, 1, 6, 26, 19, 24], [3, 32, 7, 21, 23, 25], [31, 9, 2, 22, 27, 20],
                   [8, 28, 33, 17, 10, 15], [30, 5, 34, 12, 14, 16], [4, 36, 29, 13, 18, 11]], np.float32)


def run(body, inputs, n_tops=1, phase=1):
    net = one_layer_net(body, [a.shape for a in inputs], n_tops=n_tops, phase=phase, dtype=np.float32)
    for i, a in enumerate(inputs):
        net.blobs[f"b{i}"].data[...] = a
    net.forward()
    return [net.blobs[f"t{i}"].data for i in range(n_tops)]


def planes(plane, n=2, c=2):
    return np.broadcast_to(plane, (n, c) + plane.shape).copy()


def test_max_pooling_square_with_mask():
    top, mask = run('type: "Pooling" pooling_param { pool: MAX kernel_size: 2 stride: 1 }', [planes(SQUARE)], 2)
    assert np.all(top == [[9, 5, 5, 8], [9, 5, 5, 8]])
    assert np.all(mask == [[5, 2, 2, 9], [5, 12, 12, 9]])


@pytest.mark.parametrize("kh, kw, expected, expected_mask", [
    (3, 2, [[35, 32, 26, 27, 27], [32, 33, 33, 27, 27], [31, 34, 34, 27, 27], [36, 36, 34, 18, 18]],
     [[0, 7, 3, 16, 16], [7, 20, 20, 16, 16], [12, 26, 26, 16, 16], [31, 31, 26, 34, 34]]),
    (2, 3, [[35, 32, 26, 26], [32, 32, 27, 27], [33, 33, 33, 27], [34, 34, 34, 17], [36, 36, 34, 18]],
     [[0, 7, 3, 3], [7, 7, 16, 16], [20, 20, 20, 16], [26, 26, 26, 21], [31, 31, 26, 34]]),
])
def test_max_pooling_rectangles(kh, kw, expected, expected_mask):
    body = f'type: "Pooling" pooling_param {{ pool: MAX kernel_h: {kh} kernel_w: {kw} stride: 1 }}'
    top, mask = run(body, [planes(MAGIC6)], 2)
    assert np.all(top == expected) and np.all(mask == expected_mask)


def test_pooling_padding_and_average_rules():
    x = np.array([[[[1, 2, 4], [2, 3, 2], [4, 2, 1]]]], np.float32)
    top, = run('type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 2 }', [x])
    assert np.all(top == [[1, 4, 4], [4, 4, 4], [4, 4, 1]])
    top, = run('type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 1 pad: 1 }', [np.full((1, 1, 3, 3), 2, np.float32)])
    np.testing.assert_allclose(top[0, 0], [[8 / 9, 4 / 3, 8 / 9], [4 / 3, 2, 4 / 3], [8 / 9, 4 / 3, 8 / 9]], rtol=1e-6)
    ramp = np.arange(36, dtype=np.float32).reshape(1, 1, 6, 6)
    top, = run('type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 }', [ramp])
    np.testing.assert_allclose(top[0, 0], [[7, 9, 10.5], [19, 21, 22.5], [28, 30, 31.5]])
    assert run('type: "Pooling" pooling_param { pool: MAX kernel_size: 2 stride: 2 pad: 1 }',
               [np.zeros((1, 1, 5, 5), np.float32)])[0].shape == (1, 1, 3, 3)
    assert run('type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }',
               [np.zeros((2, 3, 6, 5), np.float32)])[0].shape == (2, 3, 4, 3)


def test_deconvolution_simple():
    body = ('type: "Deconvolution" convolution_param { num_output: 4 kernel_size: 3 stride: 2 '
            'weight_filler { type: "constant" value: 1 } bias_filler { type: "constant" value: 0.1 } }')
    top, = run(body, [np.ones((2, 3, 6, 4), np.float32)])
    assert top.shape == (2, 4, 13, 9)
    for h in range(13):
        for w in range(9):
            overlaps = (h % 2 == 0 and 0 < h < 12) + (w % 2 == 0 and 0 < w < 8)
            assert np.allclose(top[:, :, h, w], {0: 3.1, 1: 6.1, 2: 12.1}[overlaps])


@pytest.mark.parametrize("param, shape", [
    ("shape { dim: 0 dim: 0 dim: 0 dim: 0 }", (2, 3, 6, 5)), ("shape { dim: 0 dim: 3 dim: 10 dim: -1 }", (2, 3, 10, 3)),
    ("axis: 1 shape { dim: 3 dim: 10 dim: -1 }", (2, 3, 10, 3)),
    ("axis: 2 num_axes: 0 shape { dim: 1 dim: 1 dim: 1 }", (2, 3, 1, 1, 1, 6, 5)),
    ("axis: 0 num_axes: 0 shape { dim: 1 dim: 1 dim: 1 }", (1, 1, 1, 2, 3, 6, 5)),
    ("axis: -1 num_axes: 0 shape { dim: 1 dim: 1 dim: 1 }", (2, 3, 6, 5, 1, 1, 1)),
    ("axis: 1 num_axes: 2 shape { dim: -1 }", (2, 18, 5)), ("shape { dim: 0 dim: -1 dim: 1 dim: 1 }", (2, 90, 1, 1)),
])
def test_reshape_shapes(param, shape):
    x = np.arange(180, dtype=np.float32).reshape(2, 3, 6, 5)
    top, = run(f'type: "Reshape" reshape_param {{ {param} }}', [x])
    assert top.shape == shape and np.array_equal(top.ravel(), x.ravel())


@pytest.mark.parametrize("param, shape", [("", (2, 90)), ("axis: 2", (2, 3, 30)), ("end_axis: -2", (2, 18, 5)),
                                          ("axis: 0 end_axis: -2", (36, 5))])
def test_flatten_shapes(param, shape):
    assert run(f'type: "Flatten" flatten_param {{ {param} }}', [np.zeros((2, 3, 6, 5), np.float32)])[0].shape == shape


@pytest.mark.parametrize("param, shape", [("axis: 0", (2, 3, 4, 2)), ("", (2, 4, 4, 2)), ("axis: -1", (2, 4, 5, 2))])
def test_crop_shapes_and_values(param, shape):
    x = np.random.default_rng(0).normal(size=(2, 4, 5, 4)).astype(np.float32)
    top, = run(f'type: "Crop" crop_param {{ {param} offset: 0 }}', [x, np.zeros((2, 3, 4, 2), np.float32)])
    assert top.shape == shape
    off, = run('type: "Crop" crop_param { axis: 2 offset: 1 offset: 2 }', [x, np.zeros((2, 3, 4, 2), np.float32)])
    assert np.array_equal(off, x[:, :, 1:5, 2:4])


def test_im2col_spp_embed_shapes_and_values():
    x = np.random.default_rng(1).normal(size=(2, 3, 6, 5)).astype(np.float32)
    top, = run('type: "Im2col" convolution_param { kernel_size: 3 stride: 2 }', [x])
    assert top.shape == (2, 27, 2, 2)
    assert all(top[0, c, 0, 0] == x[0, c // 9, (c // 3) % 3, c % 3] for c in range(27))
    assert run('type: "Im2col" convolution_param { kernel_size: 3 stride: 2 dilation: 3 }',
               [np.zeros((2, 3, 10, 11), np.float32)])[0].shape == (2, 27, 2, 3)
    assert run('type: "SPP" spp_param { pyramid_height: 3 }', [np.zeros((2, 3, 9, 8), np.float32)])[0].shape == (2, 63)
    assert run('type: "SPP" spp_param { pyramid_height: 3 }', [np.zeros((10, 3, 7, 7), np.float32)])[0].shape == (10, 63)
    net = one_layer_net('type: "Embed" embed_param { num_output: 10 input_dim: 5 bias_term: false '
                        'weight_filler { type: "uniform" min: -10 max: 10 } }', [(4, 1, 1, 1)], dtype=np.float32)
    net.blobs["b0"].data[...] = np.array([1, 4, 0, 4]).reshape(4, 1, 1, 1)
    top = net.forward()["t0"]
    assert top.shape == (4, 1, 1, 1, 10)
    assert np.array_equal(top.reshape(4, 10), net.params["under_test"][0].data[[1, 4, 0, 4]])


def test_eltwise_max_and_argmax_ties():
    a = np.array([[1, 5, 3]], np.float32)
    b = np.array([[1, 2, 3]], np.float32)
    top, = run('type: "Eltwise" eltwise_param { operation: MAX }', [a, b])
    assert np.array_equal(top, [[1, 5, 3]])
    top, = run('type: "ArgMax" argmax_param { top_k: 2 }', [np.array([[3, 1, 3, 2]], np.float32)])
    assert np.array_equal(top.reshape(-1), [2, 0])          # equal values: the larger index first
    top, = run('type: "ArgMax" argmax_param { out_max_val: true }', [np.array([[3, 1, 3, 2]], np.float32)])
    assert top.shape == (1, 2, 1) and np.array_equal(top.reshape(-1), [2, 3])
    top, = run('type: "ArgMax" argmax_param { axis: 1 }', [np.zeros((10, 4, 3), np.float32)])
    assert top.shape == (10, 1, 3) and np.all(top == 3)


def test_accuracy_top_k_ties_ignore_and_per_class():
    scores = np.array([[1, 1, 1], [0, 5, 1], [2, 1, 0], [0, 0, 9]], np.float32)
    labels = np.array([0, 1, 1, 2], np.float32)
    acc, = run('type: "Accuracy"', [scores, labels])
    assert acc == pytest.approx(0.5)                         # row 0 ties count against, row 2 wrong
    acc, = run('type: "Accuracy" accuracy_param { top_k: 2 }', [scores, labels])
    assert acc == pytest.approx(0.75)
    acc, per_class = run('type: "Accuracy" accuracy_param { ignore_label: 0 }', [scores, labels], n_tops=2)
    assert acc == pytest.approx(2 / 3) and np.allclose(per_class, [0, 0.5, 1])


def test_dummy_data_fills():
    from cgvm.frontends.caffe.pycaffe import Net

    text = ('layer { name: "d" type: "DummyData" top: "a" top: "b" top: "c" dummy_data_param { '
            'num: 5 channels: 3 height: 2 width: 4 data_filler { type: "constant" value: 7 } '
            'data_filler { type: "gaussian" } data_filler { type: "constant" } } }')
    net = Net(text, 1)
    first = {k: net.blobs[k].data.copy() for k in "abc"}
    net.forward()
    assert np.all(net.blobs["a"].data == 7) and np.all(net.blobs["c"].data == 0)
    assert not np.array_equal(first["b"], net.blobs["b"].data) and net.blobs["b"].shape == (5, 3, 2, 4)


def test_lrn_matches_caffe_formulas():
    x = np.random.default_rng(2).normal(size=(2, 7, 3, 3)).astype(np.float64)
    top, = run('type: "LRN" lrn_param { local_size: 5 alpha: 0.3 beta: 0.75 k: 2 }', [x])
    padded = np.pad(x ** 2, ((0, 0), (2, 2), (0, 0), (0, 0)))
    scale = 2 + 0.3 / 5 * sum(padded[:, i:i + 7] for i in range(5))
    np.testing.assert_allclose(top, x * scale ** -0.75, rtol=1e-5)
    top, = run('type: "LRN" lrn_param { local_size: 3 norm_region: WITHIN_CHANNEL k: 5 }', [x])
    padded = np.pad(x ** 2, ((0, 0), (0, 0), (1, 1), (1, 1)))
    window = sum(padded[:, :, i:i + 3, j:j + 3] for i in range(3) for j in range(3))
    np.testing.assert_allclose(top, x * (1 + window / 9) ** -0.75, rtol=1e-5)   # k unused within a channel


def test_losses_match_references():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(10, 5, 2, 3)).astype(np.float32)
    lab = rng.integers(0, 5, size=(10, 1, 2, 3)).astype(np.float32)
    full, = run('type: "SoftmaxWithLoss" loss_param { normalize: false }', [x, lab])
    ignored = sum(run(f'type: "SoftmaxWithLoss" loss_param {{ normalize: false ignore_label: {k} }}', [x, lab])[0]
                  for k in range(5))
    assert ignored == pytest.approx(4 * full, rel=1e-5)
    a, b = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4, 3)).astype(np.float32)
    assert run('type: "EuclideanLoss"', [a, b])[0] == pytest.approx(((a - b) ** 2).sum() / 8, rel=1e-5)
    t = rng.random((4, 3)).round().astype(np.float32)
    p = 1 / (1 + np.exp(-a))
    expected = -(t * np.log(p) + (1 - t) * np.log(1 - p)).sum() / 4
    assert run('type: "SigmoidCrossEntropyLoss"', [a, t])[0] == pytest.approx(expected, rel=1e-5)
