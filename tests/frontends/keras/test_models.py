"""Keras models: construction styles, training (optimizer formulas, callbacks, progress bar), summary,
saving and loading, bad files, and Keras layers on symbolic values of other frontends."""
from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

import cgvm
import cgvm.keras as keras
from cgvm.frontends.keras.serialization import KerasConfigError
from cgvm.keras import layers

rng = np.random.default_rng(0)


def _blobs(n=120):
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    return x, y


def test_sequential_fit_evaluate_predict_and_history(capsys):
    x, y = _blobs()
    model = keras.Sequential()
    model.add(layers.Dense(16, activation="relu", input_shape=(4,)))
    model.add(layers.Dropout(0.1))
    model.add(layers.Dense(3, activation="softmax"))
    model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(x, y, epochs=8, batch_size=16, validation_split=0.25, verbose=1)
    assert sorted(history.history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert history.history["loss"][-1] < history.history["loss"][0]
    printed = capsys.readouterr().out
    assert "Epoch 8/8" in printed and "6/6 ━━━━━━━━━━━━━━━━━━━━" in printed and "- val_loss:" in printed
    loss, acc = model.evaluate(x, y, verbose=0)
    assert acc > 0.6
    assert model.predict(x[:5], verbose=0).shape == (5, 3)
    np.testing.assert_allclose(model.predict(x[:5], verbose=0).sum(1), 1, rtol=1e-5)


def test_functional_shared_layers_multi_output_and_loss_weights():
    a, b = keras.Input((5,), name="a"), keras.Input((5,), name="b")
    shared = layers.Dense(4, activation="tanh")
    ha, hb = shared(a), shared(b)
    o1 = layers.Dense(1, name="o1")(layers.Add()([ha, hb]))
    o2 = layers.Dense(2, activation="softmax", name="o2")(layers.Concatenate()([ha, hb]))
    model = keras.Model([a, b], [o1, o2])
    assert len(model.weights) == 6 and len(shared._inbound_nodes) == 2
    xa, xb = rng.random((32, 5), dtype=np.float32), rng.random((32, 5), dtype=np.float32)
    y1, y2 = xa.sum(1, keepdims=True), (xb[:, 0] > 0.5).astype(np.int64)
    model.compile("sgd", loss={"o1": "mse", "o2": "sparse_categorical_crossentropy"},
                  loss_weights={"o1": 0.5, "o2": 2.0}, metrics={"o2": ["accuracy"]})
    logs = model.train_on_batch([xa, xb], {"o1": y1, "o2": y2}, return_dict=True)
    assert sorted(logs) == ["loss", "o1_loss", "o2_accuracy", "o2_loss"]
    assert logs["loss"] == pytest.approx(0.5 * logs["o1_loss"] + 2.0 * logs["o2_loss"], rel=1e-5)
    out = model.predict({"a": xa, "b": xb}, verbose=0)
    assert out[0].shape == (32, 1) and out[1].shape == (32, 2)


class Scale(keras.Layer):
    """A custom layer: one trainable weight made with add_weight."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="w")

    def call(self, x):
        return x * self.w + 1.0


class TwoLayer(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = layers.Dense(8, activation="relu")
        self.scale = Scale()
        self.out = layers.Dense(1)

    def call(self, x, training=False):
        return self.out(self.scale(self.hidden(x)))


def test_subclassed_model_with_custom_layer_trains():
    x = rng.random((64, 3), dtype=np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5], np.float32))[:, None]
    model = TwoLayer()
    model.compile(keras.optimizers.Adam(0.02), "mse")
    first = model.train_on_batch(x, y)
    for _ in range(100):
        last = model.train_on_batch(x, y)
    assert last < first * 0.2
    assert [w.name for w in model.scale.weights] == ["w"]
    assert len(model.weights) == 5


def _numpy_optimizer_steps(kind, w, grads, lr):
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    acc = np.full_like(w, 0.1)
    for t, g in enumerate(grads, 1):
        if kind == "sgd":
            m = 0.9 * m - lr * g
            w = w + 0.9 * m - lr * g  # nesterov
        elif kind == "adam":
            m += (g - m) * 0.1
            v += (g * g - v) * 0.001
            w = w - lr * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(v) + 1e-7)
        elif kind == "adamw":
            w = w - w * 0.004 * lr
            m += (g - m) * 0.1
            v += (g * g - v) * 0.001
            w = w - lr * np.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(v) + 1e-7)
        elif kind == "rmsprop":
            v = 0.9 * v + 0.1 * g * g
            w = w - lr * g / np.sqrt(v + 1e-7)
        else:
            acc += g * g
            w = w - lr * g / np.sqrt(acc + 1e-7)
    return w


@pytest.mark.parametrize("kind,opt", [("sgd", lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True)),
                                      ("adam", lambda: keras.optimizers.Adam(0.1)),
                                      ("adamw", lambda: keras.optimizers.AdamW(0.1)),
                                      ("rmsprop", lambda: keras.optimizers.RMSprop(0.1)),
                                      ("adagrad", lambda: keras.optimizers.Adagrad(0.1))])
def test_optimizer_formulas(kind, opt):
    """A linear model with mse: gradient 2/n * x^T (xw - y) computed in NumPy, steps compared."""
    # fixed data and weights: Adam-type steps follow the sign of each gradient component, so a
    # component near zero could round to the other sign in float32 than in the float64 reference
    local = np.random.default_rng(21)
    x = local.random((8, 3), dtype=np.float32)
    y = local.random((8, 1), dtype=np.float32)
    model = keras.Sequential([keras.Input((3,)), layers.Dense(1, use_bias=False)])
    model.set_weights([np.array([[0.5], [-0.25], [0.75]], np.float32)])
    model.compile(opt(), "mse")
    w = model.get_weights()[0].astype(np.float64)
    grads = []
    ref = w.copy()
    for _ in range(3):
        g = 2.0 / 8 * x.T @ (x @ ref - y)
        grads.append(g)
        ref = _numpy_optimizer_steps(kind, w, grads, 0.1)
        model.train_on_batch(x, y)
        np.testing.assert_allclose(model.get_weights()[0], ref, rtol=1e-4, atol=1e-6)


def test_callbacks(tmp_path):
    x, y = _blobs(64)
    model = keras.Sequential([keras.Input((4,)), layers.Dense(3, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.5), "sparse_categorical_crossentropy", metrics=["accuracy"])
    seen = []
    cbs = [keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras"), monitor="loss", save_best_only=True),
           keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.5 / (epoch + 1)),
           keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
           keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: seen.append(logs["learning_rate"])),
           keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)]
    history = model.fit(x, y, epochs=5, batch_size=16, verbose=0, callbacks=cbs)
    assert len(history.epoch) == 2  # nothing improves by 10: stops after the second epoch
    assert seen == pytest.approx([0.5, 0.25])
    lines = (tmp_path / "log.csv").read_text().splitlines()
    assert lines[0] == "epoch,accuracy,learning_rate,loss" and len(lines) == 3
    assert keras.load_model(tmp_path / "best.keras").count_params() == model.count_params()
    model.optimizer.learning_rate = 0.5
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1, min_delta=10.0)
    model.fit(x, y, epochs=3, verbose=0, callbacks=[plateau])
    assert model.optimizer.learning_rate == pytest.approx(0.125)


def test_summary_table():
    model = keras.Sequential([keras.Input((28, 28, 1)), layers.Conv2D(8, 3, name="conv2d"),
                              layers.Flatten(name="flatten"), layers.Dense(10, name="dense")], name="demo")
    lines = []
    model.summary(print_fn=lines.append)
    text = lines[0].splitlines()
    assert text[0] == 'Model: "demo"'
    assert text[2] == "┃ Layer (type)                    ┃ Output Shape           ┃       Param # ┃"
    assert "│ conv2d (Conv2D)                 │ (None, 26, 26, 8)      │            80 │" in text
    assert " Total params: 54,170 (211.60 KB)" in text


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_save_load_round_trip(tmp_path, suffix):
    inp = keras.Input((6, 3))
    s = layers.Bidirectional(layers.LSTM(4, return_sequences=True))(inp)
    s = layers.BatchNormalization()(s)
    out = layers.Dense(2)(layers.GRU(3)(s))
    model = keras.Model(inp, out)
    model.compile("adam", "mse")
    x = rng.random((2, 6, 3), dtype=np.float32)
    model.save(tmp_path / f"m{suffix}")
    loaded = keras.load_model(tmp_path / f"m{suffix}")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    model.save_weights(tmp_path / "m.weights.h5")
    fresh = keras.models.model_from_json(model.to_json())
    fresh.load_weights(tmp_path / "m.weights.h5")
    np.testing.assert_allclose(fresh.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)


def test_bad_files_name_the_layer_and_file(tmp_path):
    model = keras.Sequential([keras.Input((3,)), layers.Dense(2, name="head")])
    path = tmp_path / "m.keras"
    model.save(path)
    with zipfile.ZipFile(path) as z:
        config, weights = json.loads(z.read("config.json")), z.read("model.weights.h5")
    config["config"]["layers"][1]["class_name"] = "Frobnicate"
    bad = tmp_path / "unknown.keras"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("config.json", json.dumps(config))
        z.writestr("model.weights.h5", weights)
    with pytest.raises(KerasConfigError, match=r"'head'.*unknown\.keras.*Frobnicate"):
        keras.load_model(bad)
    other = keras.Sequential([keras.Input((4,)), layers.Dense(2, name="head")])
    other.save(tmp_path / "other.keras")
    with zipfile.ZipFile(tmp_path / "other.keras") as z:
        other_weights = z.read("model.weights.h5")
    mismatched = tmp_path / "mismatch.keras"
    with zipfile.ZipFile(path) as z, zipfile.ZipFile(mismatched, "w") as out:
        out.writestr("config.json", z.read("config.json"))
        out.writestr("model.weights.h5", other_weights)
    with pytest.raises(KerasConfigError, match=r"mismatch\.keras.*'head'.*\(4, 2\)"):
        keras.load_model(mismatched)
    before = model.get_weights()
    with pytest.raises(KerasConfigError):
        model.load_weights(mismatched)
    for a, b in zip(model.get_weights(), before):  # nothing half-loaded
        np.testing.assert_array_equal(a, b)
    corrupt = tmp_path / "corrupt.keras"
    corrupt.write_bytes(path.read_bytes()[:200])
    with pytest.raises(KerasConfigError, match="corrupt.keras"):
        keras.load_model(corrupt)


def test_lambda_needs_safe_mode_off(tmp_path):
    model = keras.Sequential([keras.Input((3,)), layers.Lambda(lambda t: t * 2.0), layers.Dense(1)])
    model.save(tmp_path / "lam.keras")
    with pytest.raises(KerasConfigError, match="safe_mode=False"):
        keras.load_model(tmp_path / "lam.keras")
    loaded = keras.load_model(tmp_path / "lam.keras", safe_mode=False)
    x = rng.random((2, 3), dtype=np.float32)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)


def test_keras_layers_on_cgvm_values_train_with_one_grad():
    """A Keras Dense called on a plain cgvm Value: the result exposes __cgvm_value__ for other frontends."""
    x = cgvm.input_value(cgvm.TensorType((None, 4), "float32"), "x")
    hidden = layers.Dense(3, activation="tanh")(x)
    assert isinstance(hidden.__cgvm_value__(), cgvm.Value)
    out = layers.Dense(1)(hidden)
    cost = cgvm.ops.reduce.mean(cgvm.ops.elementwise.square(out.__cgvm_value__()))
    dense = out._keras_history[0]
    grads = cgvm.grad(cost, [w.value for w in dense.weights])
    fn = cgvm.compile([x], [cost] + grads, workspace=keras.backend.get_workspace())
    values = fn(rng.random((5, 4), dtype=np.float32))
    assert np.asarray(values[1]).shape == (3, 1)
