"""Keras layers against plain NumPy references (channels_last, Keras weight layouts), and numeric
gradients of the scan-based recurrent layers."""
from __future__ import annotations

import numpy as np
import pytest

import cgvm
import cgvm.keras as keras
from cgvm.keras import layers

rng = np.random.default_rng(0)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def conv2d_ref(x, k, b, stride, pads):
    """NHWC x, HWIO k, pads ((top, bottom), (left, right))."""
    x = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    kh, kw, _, o = k.shape
    H = (x.shape[1] - kh) // stride + 1
    W = (x.shape[2] - kw) // stride + 1
    y = np.zeros((x.shape[0], H, W, o))
    for i in range(H):
        for j in range(W):
            patch = x[:, i * stride:i * stride + kh, j * stride:j * stride + kw, :]
            y[:, i, j] = np.tensordot(patch, k, axes=([1, 2, 3], [0, 1, 2]))
    return y + b


def test_dense_matches_numpy():
    x = rng.random((4, 3, 5), dtype=np.float32)
    d = layers.Dense(6, activation="tanh")
    d(x)
    d.bias.assign(rng.random(6))
    k, b = d.get_weights()
    np.testing.assert_allclose(d(x), np.tanh(x @ k + b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("padding,stride", [("valid", 1), ("same", 1), ("same", 2), ("valid", 2)])
def test_conv2d_matches_numpy(padding, stride):
    x = rng.random((2, 7, 6, 3), dtype=np.float32)
    c = layers.Conv2D(4, (3, 2), strides=stride, padding=padding)
    c(x)
    c.bias.assign(rng.random(4))
    k, b = c.get_weights()
    if padding == "same":  # TensorFlow's rule: the odd pixel at the end
        pads = []
        for n, kk in zip((7, 6), (3, 2)):
            total = max((-(-n // stride) - 1) * stride + kk - n, 0)
            pads.append((total // 2, total - total // 2))
    else:
        pads = [(0, 0), (0, 0)]
    np.testing.assert_allclose(c(x), conv2d_ref(x, k, b, stride, pads), rtol=1e-4, atol=1e-5)


def test_conv1d_causal_and_depthwise():
    x = rng.random((2, 9, 3), dtype=np.float32)
    c = layers.Conv1D(2, 3, padding="causal", dilation_rate=2)
    y = c(x)
    k, b = c.get_weights()
    xp = np.pad(x, ((0, 0), (4, 0), (0, 0)))
    ref = sum(xp[:, 2 * t:2 * t + 9, :] @ k[t] for t in range(3)) + b
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    img = rng.random((1, 5, 5, 3), dtype=np.float32)
    dw = layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same")
    out = dw(img)
    kd = dw.get_weights()[0]  # (3, 3, in, mult): output channel c*mult + m
    full = np.zeros((3, 3, 3, 6))
    for ch in range(3):
        for m in range(2):
            full[:, :, ch, ch * 2 + m] = kd[:, :, ch, m]
    np.testing.assert_allclose(out, conv2d_ref(img, full, 0, 1, [(1, 1), (1, 1)]), rtol=1e-5, atol=1e-6)


def test_conv2d_transpose_is_adjoint_of_conv():
    x = rng.random((1, 3, 3, 2), dtype=np.float32)
    t = layers.Conv2DTranspose(4, 3, strides=2, padding="same", use_bias=False)
    y = t(x)
    assert y.shape == (1, 6, 6, 4)
    k = t.get_weights()[0]  # (kh, kw, out, in)
    # <conv_transpose(x), g> == <x, conv(g)> for the "same" conv from 6x6 to 3x3 with stride 2
    g = rng.random(y.shape)
    conv_g = conv2d_ref(g, k, 0, 2, [(0, 1), (0, 1)])
    np.testing.assert_allclose((y * g).sum(), (x * conv_g).sum(), rtol=1e-4)


@pytest.mark.parametrize("cls,padding", [(layers.MaxPooling2D, "valid"), (layers.MaxPooling2D, "same"),
                                         (layers.AveragePooling2D, "same"), (layers.AveragePooling2D, "valid")])
def test_pooling_matches_numpy(cls, padding):
    x = rng.random((2, 5, 5, 3), dtype=np.float32)
    y = cls(2, padding=padding)(x)
    n = 3 if padding == "same" else 2
    ref = np.zeros((2, n, n, 3))
    for i in range(n):
        for j in range(n):
            win = x[:, 2 * i:2 * i + 2, 2 * j:2 * j + 2, :]  # "same" windows are clipped: padding excluded
            ref[:, i, j] = win.max(axis=(1, 2)) if cls is layers.MaxPooling2D else win.mean(axis=(1, 2))
    np.testing.assert_allclose(y, ref, rtol=1e-6)
    np.testing.assert_allclose(layers.GlobalAveragePooling2D()(x), x.mean(axis=(1, 2)), rtol=1e-6)
    np.testing.assert_allclose(layers.GlobalMaxPooling1D()(x[:, 0]), x[:, 0].max(axis=1), rtol=1e-6)


def test_normalizations_match_numpy():
    x = rng.random((4, 3, 5), dtype=np.float32)
    bn = layers.BatchNormalization()
    bn(x)
    g, b, mm, mv = rng.random(5), rng.random(5), rng.random(5), rng.random(5) + 0.5
    bn.set_weights([g, b, mm, mv])
    np.testing.assert_allclose(bn(x), (x - mm) / np.sqrt(mv + 1e-3) * g + b, rtol=1e-5)
    ln = layers.LayerNormalization()
    ln(x)
    ln.set_weights([g, b])
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(ln(x), (x - mu) / np.sqrt(var + 1e-3) * g + b, rtol=1e-4, atol=1e-5)


def test_shape_and_merge_layers():
    x = rng.random((2, 3, 4), dtype=np.float32)
    z = rng.random((2, 3, 4), dtype=np.float32)
    np.testing.assert_array_equal(layers.Flatten()(x), x.reshape(2, -1))
    np.testing.assert_array_equal(layers.Reshape((4, 3))(x), x.reshape(2, 4, 3))
    np.testing.assert_array_equal(layers.Permute((2, 1))(x), x.transpose(0, 2, 1))
    np.testing.assert_allclose(layers.Add()([x, z]), x + z)
    np.testing.assert_allclose(layers.Multiply()([x, z]), x * z)
    np.testing.assert_allclose(layers.Average()([x, z]), (x + z) / 2, rtol=1e-6)
    np.testing.assert_array_equal(layers.Concatenate()([x, z]), np.concatenate([x, z], -1))
    np.testing.assert_array_equal(layers.Dropout(0.5)(x), x)  # the identity at inference
    np.testing.assert_allclose(layers.Activation("relu")(x - 0.5), np.maximum(x - 0.5, 0))
    emb = layers.Embedding(10, 3)
    idx = np.array([[1, 9], [0, 0]])
    np.testing.assert_array_equal(emb(idx), emb.get_weights()[0][idx])


def _rnn_ref(kind, x, weights, units, go_backwards=False, reset_after=True):
    k, rk, b = weights
    h = np.zeros((x.shape[0], units))
    c = np.zeros_like(h)
    seq = []
    steps = range(x.shape[1])[::-1] if go_backwards else range(x.shape[1])
    for t in steps:
        xt = x[:, t]
        if kind == "simple":
            h = np.tanh(xt @ k + h @ rk + b)
        elif kind == "lstm":
            z = xt @ k + h @ rk + b
            i, f, g, o = (z[:, n * units:(n + 1) * units] for n in range(4))
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
        else:
            u = units
            if reset_after:
                xw, rec = xt @ k + b[0], h @ rk + b[1]
                zg, r = sigmoid(xw[:, :u] + rec[:, :u]), sigmoid(xw[:, u:2 * u] + rec[:, u:2 * u])
                hh = np.tanh(xw[:, 2 * u:] + r * rec[:, 2 * u:])
            else:
                xw = xt @ k + b
                zg = sigmoid(xw[:, :u] + h @ rk[:, :u])
                r = sigmoid(xw[:, u:2 * u] + h @ rk[:, u:2 * u])
                hh = np.tanh(xw[:, 2 * u:] + (r * h) @ rk[:, 2 * u:])
            h = zg * h + (1 - zg) * hh
        seq.append(h)
    return np.stack(seq, 1), h, c


@pytest.mark.parametrize("kind,cls,extra", [("simple", layers.SimpleRNN, {}), ("lstm", layers.LSTM, {}),
                                            ("gru", layers.GRU, {}), ("gru", layers.GRU, {"reset_after": False}),
                                            ("lstm", layers.LSTM, {"go_backwards": True})])
def test_recurrent_layers_match_numpy(kind, cls, extra):
    x = rng.random((2, 5, 3), dtype=np.float32)
    layer = cls(4, return_sequences=True, return_state=True, **extra)
    layer(x)
    layer.set_weights([w + rng.normal(0, 0.3, w.shape) for w in layer.get_weights()])
    out = layer(x)
    seq, h, c = _rnn_ref(kind, x, layer.get_weights(), 4, extra.get("go_backwards", False),
                         extra.get("reset_after", True))
    np.testing.assert_allclose(out[0], seq, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out[1], h, rtol=1e-4, atol=1e-5)
    if kind == "lstm":
        np.testing.assert_allclose(out[2], c, rtol=1e-4, atol=1e-5)


def test_bidirectional_matches_numpy():
    x = rng.random((2, 4, 3), dtype=np.float32)
    bi = layers.Bidirectional(layers.SimpleRNN(2, return_sequences=True))
    y = bi(x)
    w = bi.get_weights()
    fw, _, _ = _rnn_ref("simple", x, w[:3], 2)
    bw, _, _ = _rnn_ref("simple", x, w[3:], 2, go_backwards=True)
    np.testing.assert_allclose(y, np.concatenate([fw, bw[:, ::-1]], -1), rtol=1e-5, atol=1e-6)
    td = layers.TimeDistributed(layers.Dense(3))
    np.testing.assert_allclose(td(x), x @ td.get_weights()[0] + td.get_weights()[1], rtol=1e-5)


@pytest.mark.parametrize("cls", [layers.LSTM, layers.GRU])
def test_recurrent_gradients_numerically(cls):
    """d(sum of outputs)/d(kernel, recurrent_kernel) through scan's BPTT, against central differences (float64)."""
    x = rng.random((2, 4, 3))
    layer = cls(3, return_sequences=True, dtype="float64")
    inp = keras.Input((4, 3), dtype="float64")
    out = layer(inp)
    cost = cgvm.ops.reduce.sum(cgvm.ops.elementwise.square(out.__cgvm_value__()))
    params = [w.value for w in layer.weights]
    grads = cgvm.grad(cost, params)
    ws = keras.backend.get_workspace()
    fn = cgvm.compile([inp.__cgvm_value__()], [cost] + grads, workspace=ws)
    results = fn(x)
    for var, g in zip(layer.weights, results[1:]):
        base = var.numpy()
        for idx in [(0, 0), (1, 2)] if base.ndim == 2 else [(0,)]:
            plus, minus = base.copy(), base.copy()
            plus[idx] += 1e-6
            minus[idx] -= 1e-6
            var.assign(plus)
            fp = float(fn(x)[0])
            var.assign(minus)
            fm = float(fn(x)[0])
            var.assign(base)
            np.testing.assert_allclose(np.asarray(g)[idx], (fp - fm) / 2e-6, rtol=1e-5, atol=1e-7)
