"""Models built and saved by real Keras 3 (torch backend) load in cgvm and predict the same; a model
trained in both from the same weights with SGD gives the same losses. Skipped without keras."""
from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
pytest.importorskip("torch")

import cgvm.keras as ckeras  # noqa: E402

layers = keras.layers


def _perturb(model) -> None:
    """Random biases and BN statistics, so that their handling is really tested."""
    rng = np.random.default_rng(1)
    new = []
    for w, v in zip(model.get_weights(), model.weights):
        if "variance" in v.path:
            w = np.abs(w + rng.normal(0, 0.2, w.shape)).astype(w.dtype) + 0.5
        elif w.ndim == 1 or (w.ndim == 2 and w.shape[0] == 2):
            w = (w + rng.normal(0, 0.2, w.shape)).astype(w.dtype)
        new.append(w)
    model.set_weights(new)


def _cnn():
    return keras.Sequential([
        keras.Input((12, 12, 2)), layers.Conv2D(4, 3, padding="same", activation="relu"),
        layers.BatchNormalization(), layers.MaxPooling2D(), layers.Conv2D(5, 2, strides=2, padding="same"),
        layers.AveragePooling2D(2, padding="same"), layers.Conv2DTranspose(3, 3, strides=2, padding="same"),
        layers.DepthwiseConv2D(3, padding="same"), layers.Flatten(), layers.Dropout(0.3),
        layers.Dense(3, activation="softmax")], name="small_cnn")


def _lstm_text():
    inp = keras.Input((7,), dtype="int32")
    e = layers.Embedding(30, 6)(inp)
    s = layers.LSTM(5, return_sequences=True)(e)
    s = layers.Bidirectional(layers.GRU(4, return_sequences=True))(s)
    s2, h, c = layers.LSTM(3, return_state=True)(s)
    s3 = layers.SimpleRNN(4, go_backwards=True)(s)
    g = layers.GRU(3, reset_after=False)(s, initial_state=[h])
    out = layers.Dense(1, activation="sigmoid")(layers.Concatenate()([s2, s3, g, c]))
    return keras.Model(inp, out, name="lstm_text")


def _multi_io():
    a, b = keras.Input((10, 3), name="a"), keras.Input((10, 3), name="b")
    shared = layers.Conv1D(4, 3, padding="causal")
    sa, sb = shared(a), shared(b)
    m = layers.Concatenate()([layers.Add()([sa, sb]), layers.Multiply()([sa, sb])])
    m = layers.LayerNormalization()(m)
    o1 = layers.Dense(2, name="o1")(layers.GlobalAveragePooling1D()(m))
    o2 = layers.Dense(1, name="o2")(layers.GlobalMaxPooling1D()(layers.Average()([sa, sb])))
    return keras.Model([a, b], [o1, o2], name="multi_io")


def _mobilenet():
    return keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), alpha=0.35,
                                          classifier_activation=None)


rng = np.random.default_rng(0)
CASES = {
    "cnn": (_cnn, [rng.random((2, 12, 12, 2), dtype=np.float32)]),
    "lstm_text": (_lstm_text, [rng.integers(0, 30, (3, 7)).astype("int32")]),
    "multi_io": (_multi_io, [rng.random((2, 10, 3), dtype=np.float32), rng.random((2, 10, 3), dtype=np.float32)]),
    "mobilenet_v2": (_mobilenet, [rng.random((1, 32, 32, 3), dtype=np.float32)]),
}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each reference model saved by Keras as .keras and .h5, with Keras' own predictions."""
    root = tmp_path_factory.mktemp("keras_models")
    keras.utils.set_random_seed(0)
    out = {}
    for name, (build, xs) in CASES.items():
        model = build()
        _perturb(model)
        model.save(root / f"{name}.keras")
        model.save(root / f"{name}.h5")
        y = model.predict(xs if len(xs) > 1 else xs[0], verbose=0)
        out[name] = (root, xs, y if isinstance(y, list) else [y])
    return out


@pytest.mark.parametrize("ext", ["keras", "h5"])
@pytest.mark.parametrize("name", list(CASES))
def test_predict_matches_keras(saved, name, ext):
    root, xs, expected = saved[name]
    model = ckeras.load_model(root / f"{name}.{ext}")
    got = model.predict(xs if len(xs) > 1 else xs[0], verbose=0)
    got = got if isinstance(got, list) else [got]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        assert np.std(e) > 0 or e.size == 1
        np.testing.assert_allclose(g, e, atol=1e-5, rtol=1e-5)


def test_sgd_training_matches_keras(tmp_path):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((6,)), layers.Dense(8, activation="tanh"),
                              layers.BatchNormalization(), layers.Dense(3, activation="softmax")])
    _perturb(model)
    model.save(tmp_path / "m.keras")
    mine = ckeras.load_model(tmp_path / "m.keras")
    data_rng = np.random.default_rng(5)
    x = data_rng.random((16, 6), dtype=np.float32)
    y = data_rng.integers(0, 3, 16)
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "sparse_categorical_crossentropy")
    mine.compile(ckeras.optimizers.SGD(0.1, momentum=0.9), "sparse_categorical_crossentropy")
    theirs_losses = [float(model.train_on_batch(x, y)) for _ in range(5)]
    my_losses = [float(mine.train_on_batch(x, y)) for _ in range(5)]
    np.testing.assert_allclose(my_losses, theirs_losses, rtol=1e-4, atol=1e-5)
    for a, b in zip(mine.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_cgvm_file_loads_in_keras(tmp_path):
    mine = ckeras.Sequential([ckeras.Input((5,)), ckeras.layers.Dense(4, activation="relu"),
                              ckeras.layers.Dense(2)])
    mine.save(tmp_path / "c.keras")
    theirs = keras.saving.load_model(tmp_path / "c.keras")
    x = np.random.default_rng(0).random((3, 5), dtype=np.float32)
    np.testing.assert_allclose(theirs.predict(x, verbose=0), mine.predict(x, verbose=0), atol=1e-6)


# --------------------------------------------------------------------------- masking

def _masked_models(lib):
    """The same four masked architectures built with real Keras (``lib=keras``) or cgvm."""
    L = lib.layers
    ids = lib.Input((6,), dtype="int32")
    emb = L.Embedding(12, 4, mask_zero=True)
    lstm = lib.Model(ids, L.Dense(2)(L.LSTM(5)(emb(ids))), name="emb_lstm")
    ids2 = lib.Input((6,), dtype="int32")
    gru = L.GRU(4, return_sequences=True)(L.Embedding(12, 4, mask_zero=True)(ids2))
    gru_gap = lib.Model(ids2, L.Dense(2)(L.GlobalAveragePooling1D()(gru)), name="emb_gru_gap")
    ids3 = lib.Input((6,), dtype="int32")
    bidi = lib.Model(ids3, L.Bidirectional(L.LSTM(3, return_sequences=True))(
        L.Embedding(12, 4, mask_zero=True)(ids3)), name="emb_bidi")
    seq = lib.Sequential([lib.Input((6, 3)), L.Masking(0.0), L.SimpleRNN(4), L.Dense(2)], name="masking_rnn")
    return {"lstm": lstm, "gru_gap": gru_gap, "bidi": bidi, "masking": seq}


def _masked_data(name):
    rng = np.random.default_rng(7)
    if name == "masking":
        x = rng.normal(size=(4, 6, 3)).astype("float32")
        x[0, 4:] = 0.0
        x[1, :2] = 0.0
        x[2, 3] = 0.0
        y = rng.normal(size=(4, 2)).astype("float32")
        return x, y
    x = rng.integers(1, 12, (4, 6)).astype("int32")
    x[0, 4:] = 0
    x[1, :3] = 0
    x[2, 2] = 0
    y = rng.normal(size=(4, 6, 6) if name == "bidi" else (4, 2)).astype("float32")
    return x, y


@pytest.mark.parametrize("name", ["lstm", "gru_gap", "bidi", "masking"])
def test_masked_models_match_keras(name, tmp_path):
    keras.utils.set_random_seed(11)
    theirs = _masked_models(keras)[name]
    mine = _masked_models(ckeras)[name]
    _perturb(theirs)
    mine.set_weights(theirs.get_weights())
    x, y = _masked_data(name)
    expected = theirs.predict(x, verbose=0)
    np.testing.assert_allclose(mine.predict(x, verbose=0), expected, atol=1e-5, rtol=1e-5)
    for ext in ("keras", "h5"):  # a file saved by Keras (its config passes mask=not_equal(ids, 0) on)
        theirs.save(tmp_path / f"m.{ext}")
        loaded = ckeras.load_model(tmp_path / f"m.{ext}")
        np.testing.assert_allclose(loaded.predict(x, verbose=0), expected, atol=1e-5, rtol=1e-5)
    # one SGD step from the same weights: same loss, same weights
    theirs.compile(keras.optimizers.SGD(0.1), "mse")
    mine.compile(ckeras.optimizers.SGD(0.1), "mse")
    lt = float(theirs.train_on_batch(x, y))
    lm = float(mine.train_on_batch(x, y))
    np.testing.assert_allclose(lm, lt, rtol=1e-5, atol=1e-6)
    for a, b in zip(mine.get_weights(), theirs.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_masked_sequence_loss_matches_keras():
    """Keras weights a sequence loss (and metrics) by the prediction's mask: the mean over valid steps."""
    def build(lib):
        ids = lib.Input((6,), dtype="int32")
        s = lib.layers.LSTM(4, return_sequences=True)(lib.layers.Embedding(12, 3, mask_zero=True)(ids))
        return lib.Model(ids, lib.layers.TimeDistributed(lib.layers.Dense(2))(s))

    keras.utils.set_random_seed(2)
    theirs, mine = build(keras), build(ckeras)
    _perturb(theirs)
    mine.set_weights(theirs.get_weights())
    x, _ = _masked_data("lstm")
    y = np.random.default_rng(3).normal(size=(4, 6, 2)).astype("float32")
    theirs.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    mine.compile(ckeras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    ev_t, ev_m = theirs.evaluate(x, y, verbose=0), mine.evaluate(x, y, verbose=0)
    np.testing.assert_allclose(ev_m, ev_t, rtol=1e-5)
    p = theirs.predict(x, verbose=0)
    unmasked = float(((p - y) ** 2).mean())
    assert abs(ev_t[0] - unmasked) > 1e-3  # the mask really changes the loss
    for _ in range(2):
        np.testing.assert_allclose(mine.train_on_batch(x, y), theirs.train_on_batch(x, y), rtol=1e-5)
    for a, b in zip(mine.get_weights(), theirs.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


