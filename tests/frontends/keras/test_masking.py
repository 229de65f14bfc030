"""Keras masks (Embedding(mask_zero), Masking; their propagation and consumers) and the RNN layers'
dropout/recurrent_dropout, checked against plain NumPy references and structurally (no real Keras)."""
from __future__ import annotations

import numpy as np
import pytest

import cgvm.keras as keras
from cgvm.compiled import compile as cg_compile
from cgvm.frontends.keras import backend as K
from cgvm.frontends.keras import losses as losses_mod
from cgvm.ir.graph import input_value
from cgvm.ir.types import TensorType
from cgvm.keras import layers

rng = np.random.default_rng(0)
IDS = np.array([[3, 5, 0, 2, 0], [0, 0, 4, 1, 7], [1, 2, 3, 4, 6]], dtype=np.int32)


def masked_rnn_ref(x, mask, k, r, b, backwards=False, zero_output=False):
    """SimpleRNN(tanh) with Keras' mask rule: a masked step keeps the state and repeats the last output."""
    n, t, _ = x.shape
    h = np.zeros((n, k.shape[1]))
    y_prev = np.zeros_like(h)
    ys = []
    for step in (range(t - 1, -1, -1) if backwards else range(t)):
        m = mask[:, step][:, None]
        h_new = np.tanh(x[:, step] @ k + h @ r + b)
        h = np.where(m, h_new, h)
        y_prev = np.where(m, h_new, 0.0 if zero_output else y_prev)
        ys.append(y_prev)
    return np.stack(ys, 1), h


def _embedding_rnn(**rnn_kwargs):
    inp = keras.Input((5,), dtype="int32")
    emb = layers.Embedding(9, 3, mask_zero=True)
    rnn = layers.SimpleRNN(4, **rnn_kwargs)
    model = keras.Model(inp, rnn(emb(inp)))
    rnn.bias.assign(rng.normal(size=4))
    return model, emb, rnn


@pytest.mark.parametrize("backwards", [False, True])
def test_simple_rnn_with_embedding_mask_matches_numpy(backwards):
    model, emb, rnn = _embedding_rnn(return_sequences=True, go_backwards=backwards)
    k, r, b = rnn.get_weights()
    x = emb.get_weights()[0][IDS]
    want, _ = masked_rnn_ref(x, IDS != 0, k, r, b, backwards=backwards)
    got = model.predict(IDS, verbose=0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # without the mask the numbers differ (so the test really checks the mask)
    assert not np.allclose(got, masked_rnn_ref(x, np.ones_like(IDS, bool), k, r, b, backwards)[0], atol=1e-3)


def test_last_output_and_states_skip_masked_tail():
    model, emb, rnn = _embedding_rnn()
    inp = model.inputs[0]
    out, h = layers.SimpleRNN(4, return_state=True)(emb(inp))
    both = keras.Model(inp, [out, h])
    x = emb.get_weights()[0][IDS]
    got_out, got_h = both.predict(IDS, verbose=0)
    k, r, b = both.layers[-1].get_weights()
    seq, h_ref = masked_rnn_ref(x, IDS != 0, k, r, b)
    np.testing.assert_allclose(got_out, seq[:, -1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_h, h_ref, rtol=1e-5, atol=1e-6)


def test_mask_propagation_rules():
    inp = keras.Input((5,), dtype="int32")
    e = layers.Embedding(9, 3, mask_zero=True)(inp)
    keeps = {"dense": layers.Dense(2)(e), "dropout": layers.Dropout(0.5)(e), "activation": layers.Activation("relu")(e),
             "layer_norm": layers.LayerNormalization()(e),
             "time_distributed": layers.TimeDistributed(layers.Dense(2))(e),
             "lstm_sequences": layers.LSTM(2, return_sequences=True)(e), "add": layers.Add()([e, e]),
             "concatenate": layers.Concatenate()([e, e])}
    drops = {"flatten": layers.Flatten()(e), "conv1d": layers.Conv1D(2, 1)(e), "lstm_last": layers.LSTM(2)(e),
             "global_average": layers.GlobalAveragePooling1D()(e), "reshape": layers.Reshape((15,))(e)}
    assert layers.Embedding(9, 3)(inp)._keras_mask is None
    for name, t in keeps.items():
        assert t._keras_mask is not None, name
        assert t._keras_mask.shape[1:] == (5,) and t._keras_mask.dtype.name == "bool", name
    for name, t in drops.items():
        assert t._keras_mask is None, name
    seq, h, c = layers.LSTM(2, return_sequences=True, return_state=True)(e)
    assert seq._keras_mask is not None and h._keras_mask is None and c._keras_mask is None


def test_masking_layer_output_and_mask():
    x = rng.normal(size=(2, 4, 3)).astype(np.float32)
    x[0, 1] = 0.5
    x[1, 3] = 0.5
    x[1, 0, 0] = 0.5  # one feature equal to the mask value does not mask the step
    inp = keras.Input((4, 3))
    masked = layers.Masking(0.5)(inp)
    model = keras.Model(inp, [masked, layers.GlobalAveragePooling1D()(masked)])
    out, mean = model.predict(x, verbose=0)
    keep = np.any(x != 0.5, axis=-1)
    np.testing.assert_allclose(out, x * keep[..., None], atol=1e-7)
    want = np.stack([x[i][keep[i]].mean(0) for i in range(2)])
    np.testing.assert_allclose(mean, want, rtol=1e-5, atol=1e-6)
    assert layers.Masking(0.5).get_config()["mask_value"] == 0.5


def test_global_max_pooling_ignores_mask_as_keras():
    inp = keras.Input((5,), dtype="int32")
    emb = layers.Embedding(9, 3, mask_zero=True)
    model = keras.Model(inp, layers.GlobalMaxPooling1D()(emb(inp)))
    np.testing.assert_allclose(model.predict(IDS, verbose=0), emb.get_weights()[0][IDS].max(1), rtol=1e-6)


def test_bidirectional_sequences_zero_at_masked_steps():
    inp = keras.Input((5,), dtype="int32")
    emb = layers.Embedding(9, 3, mask_zero=True)
    bi = layers.Bidirectional(layers.SimpleRNN(2, return_sequences=True))
    model = keras.Model(inp, bi(emb(inp)))
    got = model.predict(IDS, verbose=0)
    x = emb.get_weights()[0][IDS]
    kf, rf, bf, kb, rb, bb = bi.get_weights()
    fw, _ = masked_rnn_ref(x, IDS != 0, kf, rf, bf, zero_output=True)
    bw, _ = masked_rnn_ref(x, IDS != 0, kb, rb, bb, backwards=True, zero_output=True)
    np.testing.assert_allclose(got, np.concatenate([fw, bw[:, ::-1]], -1), rtol=1e-5, atol=1e-6)
    assert np.all(got[IDS == 0] == 0)


def test_masked_loss_is_mean_over_valid_entries():
    per = input_value(TensorType((None, 4), "float32"), "per")
    mask = input_value(TensorType((None, 4), "bool"), "mask")
    sw = input_value(TensorType((None,), "float32"), "sw")
    fn = cg_compile([per, mask, sw], [losses_mod.reduce_loss(per, sw, mask=mask),
                                      losses_mod.reduce_loss(per, sw, "sum", mask=mask)])
    v = rng.random((3, 4)).astype(np.float32)
    m = rng.random((3, 4)) > 0.4
    w = np.array([1.0, 2.0, 0.5], np.float32)
    mean, total = (K.as_array(r) for r in fn(v, m, w))
    np.testing.assert_allclose(mean, (v * m * w[:, None]).sum() / m.sum(), rtol=1e-5)
    np.testing.assert_allclose(total, (v * m * w[:, None]).sum(), rtol=1e-5)


def test_model_sequence_loss_honours_mask():
    inp = keras.Input((5,), dtype="int32")
    emb = layers.Embedding(9, 3, mask_zero=True)
    out = layers.TimeDistributed(layers.Dense(2))(layers.SimpleRNN(4, return_sequences=True)(emb(inp)))
    model = keras.Model(inp, out)
    model.compile("sgd", "mse", metrics=["mae"])
    y = rng.normal(size=(3, 5, 2)).astype(np.float32)
    p = model.predict(IDS, verbose=0)
    valid = IDS != 0
    loss, mae = model.evaluate(IDS, y, verbose=0)
    np.testing.assert_allclose(loss, ((p - y) ** 2).mean(-1)[valid].mean(), rtol=1e-5)
    np.testing.assert_allclose(mae, np.abs(p - y).mean(-1)[valid].mean(), rtol=1e-5)


def test_saved_masked_model_round_trip(tmp_path):
    model = keras.Sequential([keras.Input((5,), dtype="int32"), layers.Embedding(9, 3, mask_zero=True),
                              layers.Bidirectional(layers.GRU(3, dropout=0.2, recurrent_dropout=0.1)),
                              layers.Dense(1)])
    model.save(tmp_path / "m.keras")
    loaded = keras.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(loaded.predict(IDS, verbose=0), model.predict(IDS, verbose=0), rtol=1e-6)
    cfg = loaded.layers[1].forward_layer.get_config()
    assert cfg["dropout"] == 0.2 and cfg["recurrent_dropout"] == 0.1


# --------------------------------------------------------------------------- RNN dropout

def _training_fn(model, shape):
    """The model's outputs in training mode as a function of (x, seed)."""
    x = input_value(TensorType((None,) + shape, "float32"), "x")
    seed = input_value(TensorType((), "int64"), "seed")
    with K.build_scope(K.BuildScope(training=True, seed=seed)):
        outs = model.forward([x], training=True)
    fn = cg_compile([x, seed], outs, workspace=K.get_workspace())
    return lambda xs, s: [K.as_array(o) for o in fn(xs, np.int64(s))]


def _linear_rnn(features, **kwargs):
    model = keras.Sequential([keras.Input((6, features)),
                              layers.SimpleRNN(features, activation="linear", return_sequences=True, **kwargs)])
    return model, model.layers[0]


def test_input_dropout_one_mask_per_sequence():
    model, rnn = _linear_rnn(8, dropout=0.5)
    rnn.set_weights([np.eye(8), np.zeros((8, 8)), np.zeros(8)])  # output = the dropped-out input
    x = rng.uniform(1.0, 2.0, size=(400, 6, 8)).astype(np.float32)
    np.testing.assert_allclose(model.predict(x, verbose=0), x, rtol=1e-6)  # inference: no dropout
    (y,) = _training_fn(model, (6, 8))(x, 1)
    m = y / x
    assert np.all(np.isclose(m, 0.0) | np.isclose(m, 2.0, rtol=1e-5))  # kept entries are scaled by 1/(1-rate)
    np.testing.assert_allclose(m, np.repeat(m[:, :1], 6, axis=1), atol=1e-5)  # the same mask at every step
    assert 0.4 < (m > 0).mean() < 0.6
    assert len({tuple(r) for r in (m[:, 0] > 0)}) > 50  # each sequence draws its own mask
    (y2,) = _training_fn(model, (6, 8))(x, 2)
    assert not np.allclose(y, y2)  # a new mask per step of training
    np.testing.assert_allclose(np.mean(m), 1.0, atol=0.1)  # expectation preserved


def test_recurrent_dropout_one_mask_per_sequence():
    model, rnn = _linear_rnn(6, recurrent_dropout=0.25)
    rnn.set_weights([np.zeros((6, 6)), np.eye(6), np.ones(6)])  # h_t = h_{t-1} * mask + 1
    x = np.zeros((300, 6, 6), np.float32)
    np.testing.assert_allclose(model.predict(x, verbose=0), np.broadcast_to(np.arange(1, 7), (300, 6, 6)).transpose(
        0, 2, 1), rtol=1e-6)
    (h,) = _training_fn(model, (6, 6))(x, 5)
    mask = h[:, 1] - 1.0
    assert np.all(np.isclose(mask, 0.0) | np.isclose(mask, 1 / 0.75, rtol=1e-5))
    for t in range(1, 6):
        np.testing.assert_allclose(h[:, t], h[:, t - 1] * mask + 1.0, rtol=1e-5)
    assert 0.65 < (mask > 0).mean() < 0.85


@pytest.mark.parametrize("cls", [layers.LSTM, layers.GRU])
def test_gated_rnn_dropout_trains_and_is_off_at_inference(cls):
    inp = keras.Input((5,), dtype="int32")
    with_dropout = cls(4, dropout=0.3, recurrent_dropout=0.3)
    model = keras.Model(inp, layers.Dense(1)(with_dropout(layers.Embedding(9, 3, mask_zero=True)(inp))))
    plain_inp = keras.Input((5,), dtype="int32")
    plain = keras.Model(plain_inp, layers.Dense(1)(cls(4)(layers.Embedding(9, 3, mask_zero=True)(plain_inp))))
    plain.set_weights(model.get_weights())
    np.testing.assert_allclose(model.predict(IDS, verbose=0), plain.predict(IDS, verbose=0), rtol=1e-6)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    y = rng.normal(size=(3, 1)).astype(np.float32)
    before = [w.copy() for w in model.get_weights()]
    losses = [model.train_on_batch(IDS, y) for _ in range(3)]
    assert all(np.isfinite(losses))
    kernel_before, kernel_after = before[1], model.get_weights()[1]
    rec_before, rec_after = before[2], model.get_weights()[2]
    assert not np.allclose(kernel_before, kernel_after) and not np.allclose(rec_before, rec_after)
    # training losses are noisy (dropout), evaluation is deterministic
    assert model.evaluate(IDS, y, verbose=0) == model.evaluate(IDS, y, verbose=0)
