"""Keras 3 behaviours checked against real Keras (torch backend): BatchNormalization statistics
over unmasked steps only, TimeDistributed's per-step masks, stateful RNNs with reset_states, and
the Precision / Recall / AUC metrics. Skipped without keras."""
from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
pytest.importorskip("torch")

import cgvm.keras as ckeras  # noqa: E402


def _same_training(theirs, mine, x, y, steps=3, loss="mse", metrics=None):
    mine.set_weights(theirs.get_weights())
    theirs.compile(keras.optimizers.SGD(0.05), loss, metrics=metrics)
    mine.compile(ckeras.optimizers.SGD(0.05), loss, metrics=metrics and [type(m)() if not isinstance(m, str) else m
                                                                         for m in metrics])
    for _ in range(steps):
        lt, lm = float(theirs.train_on_batch(x, y)), float(mine.train_on_batch(x, y))
        np.testing.assert_allclose(lm, lt, rtol=2e-5, atol=1e-6)
    for a, b in zip(mine.get_weights(), theirs.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(mine.predict(x, verbose=0), theirs.predict(x, verbose=0), rtol=1e-4, atol=1e-5)


def _masked_sequences(shape, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape).astype("float32")
    x[0, 3:] = 0.0
    x[1, :2] = 0.0
    x[2, 1] = 0.0
    return x


def test_batch_normalization_statistics_skip_masked_steps():
    def build(lib):
        return lib.Sequential([lib.Input((6, 3)), lib.layers.Masking(0.0), lib.layers.BatchNormalization(momentum=0.5),
                               lib.layers.Dense(2)])
    keras.utils.set_random_seed(0)
    x = _masked_sequences((4, 6, 3))
    y = np.random.default_rng(1).normal(size=(4, 6, 2)).astype("float32")
    theirs, mine = build(keras), build(ckeras)
    _same_training(theirs, mine, x, y)
    # three steps on the same batch from a zero moving mean: (1 - 0.5^3) x the mean of the unmasked steps
    valid = x[np.any(x != 0, axis=-1)]
    np.testing.assert_allclose(mine.layers[1].get_weights()[2], (1 - 0.5 ** 3) * valid.mean(0), rtol=1e-4, atol=1e-6)
    assert not np.allclose(valid.mean(0), x.reshape(-1, 3).mean(0), atol=1e-2)


def test_time_distributed_passes_each_steps_mask():
    def build(lib):
        inp = lib.Input((3, 5, 2))
        masked = lib.layers.Masking(0.0)(inp)            # mask (batch, 3, 5)
        seq = lib.layers.TimeDistributed(lib.layers.LSTM(4))(masked)
        return lib.Model(inp, lib.layers.Dense(1)(lib.layers.Flatten()(seq)))
    keras.utils.set_random_seed(2)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 3, 5, 2)).astype("float32")
    x[0, 1, 2:] = 0.0
    x[1, 0, :3] = 0.0
    x[3, 2, 4] = 0.0
    y = rng.normal(size=(4, 1)).astype("float32")
    theirs, mine = build(keras), build(ckeras)
    mine.set_weights(theirs.get_weights())
    np.testing.assert_allclose(mine.predict(x, verbose=0), theirs.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    _same_training(theirs, mine, x, y)


def test_time_distributed_batch_normalization_with_a_mask():
    def build(lib):
        inp = lib.Input((4, 3))
        masked = lib.layers.Masking(0.0)(inp)
        out = lib.layers.TimeDistributed(lib.layers.BatchNormalization(momentum=0.7))(masked)
        return lib.Model(inp, lib.layers.Dense(2)(out))
    keras.utils.set_random_seed(4)
    x = _masked_sequences((5, 4, 3), seed=5)
    y = np.random.default_rng(6).normal(size=(5, 4, 2)).astype("float32")
    _same_training(build(keras), build(ckeras), x, y, steps=2)


@pytest.mark.parametrize("cell", ["LSTM", "GRU", "SimpleRNN"])
def test_stateful_rnn_carries_and_resets_its_states(cell):
    def build(lib):
        return lib.Sequential([lib.Input(batch_shape=(2, 4, 3)), getattr(lib.layers, cell)(5, stateful=True),
                               lib.layers.Dense(1)])
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(8)
    xs = [rng.normal(size=(2, 4, 3)).astype("float32") for _ in range(3)]
    theirs, mine = build(keras), build(ckeras)
    mine.set_weights(theirs.get_weights())
    first = mine.predict(xs[0], verbose=0)
    np.testing.assert_allclose(first, theirs.predict(xs[0], verbose=0), rtol=1e-5, atol=1e-6)
    for x in xs[1:]:
        np.testing.assert_allclose(mine.predict(x, verbose=0), theirs.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    assert not np.allclose(mine.predict(xs[0], verbose=0), first)    # it remembers
    mine.layers[0].reset_states()
    theirs.layers[0].reset_states()
    np.testing.assert_allclose(mine.predict(xs[0], verbose=0), first, rtol=1e-6)
    # training carries the states from batch to batch too. (Keras 3 cannot train a stateful RNN on the
    # torch backend: autograd stops on an in-place state write. So Keras gives the expected loss by
    # predicting from the same carried states with the weights before each step.)
    y = rng.normal(size=(2, 1)).astype("float32")
    mine.compile(ckeras.optimizers.SGD(0.05), "mse")
    mine.layers[0].reset_states()
    theirs.layers[0].reset_states()
    for x in xs:
        theirs.set_weights(mine.get_weights())
        expected = float(np.mean((theirs.predict(x, verbose=0) - y) ** 2))
        np.testing.assert_allclose(float(mine.train_on_batch(x, y)), expected, rtol=1e-5)
    assert not np.allclose(mine.get_weights()[0], theirs.get_weights()[0])   # it did train
    assert len(mine.get_weights()) == len(theirs.get_weights())   # the states are not weights


def test_stateful_needs_a_static_batch_size():
    with pytest.raises(ValueError, match="batch size must be static"):
        ckeras.Sequential([ckeras.Input((4, 3)), ckeras.layers.LSTM(2, stateful=True)])


def _scores(seed, n=64):
    rng = np.random.default_rng(seed)
    y = (rng.random((n, 1)) < 0.4).astype("float32")
    p = np.clip(0.35 * y + rng.random((n, 1)) * 0.65, 0, 1).astype("float32")
    return y, p


@pytest.mark.parametrize("make", [
    lambda lib: lib.metrics.Precision(), lambda lib: lib.metrics.Recall(), lambda lib: lib.metrics.Precision(0.3),
    lambda lib: lib.metrics.Recall(thresholds=0.7), lambda lib: lib.metrics.AUC(),
    lambda lib: lib.metrics.AUC(curve="PR"), lambda lib: lib.metrics.AUC(num_thresholds=17, summation_method="minoring"),
    lambda lib: lib.metrics.AUC(curve="PR", summation_method="majoring")])
def test_confusion_metrics_standalone_match_keras(make):
    theirs, mine = make(keras), make(ckeras)
    for seed in (0, 1):
        y, p = _scores(seed)
        w = np.random.default_rng(seed + 10).random(len(y)).astype("float32")
        theirs.update_state(y, p, sample_weight=w)
        mine.update_state(y, p, sample_weight=w)
    np.testing.assert_allclose(mine.result(), float(theirs.result()), rtol=1e-5, atol=1e-6)
    assert theirs.name.startswith(mine.name)   # Keras numbers later instances (precision_1)


def test_precision_recall_class_id_and_top_k_match_keras():
    rng = np.random.default_rng(3)
    y = np.eye(4, dtype="float32")[rng.integers(0, 4, 30)]
    p = rng.random((30, 4)).astype("float32")
    for kwargs in (dict(class_id=2), dict(top_k=1), dict(top_k=2, class_id=1)):
        for name in ("Precision", "Recall"):
            theirs, mine = getattr(keras.metrics, name)(**kwargs), getattr(ckeras.metrics, name)(**kwargs)
            theirs.update_state(y, p)
            mine.update_state(y, p)
            np.testing.assert_allclose(mine.result(), float(theirs.result()), rtol=1e-6, err_msg=f"{name} {kwargs}")


def test_confusion_metrics_in_fit_and_evaluate_match_keras():
    def build(lib):
        return lib.Sequential([lib.Input((5,)), lib.layers.Dense(6, activation="tanh"),
                               lib.layers.Dense(1, activation="sigmoid")])
    keras.utils.set_random_seed(9)
    rng = np.random.default_rng(9)
    x = rng.normal(size=(48, 5)).astype("float32")
    y = (x[:, :1] + 0.5 * rng.normal(size=(48, 1)) > 0).astype("float32")
    theirs, mine = build(keras), build(ckeras)
    mine.set_weights(theirs.get_weights())
    metrics = lambda lib: ["accuracy", lib.metrics.Precision(name="precision"), lib.metrics.Recall(name="recall"),  # noqa: E731
                           lib.metrics.AUC(name="auc")]
    theirs.compile(keras.optimizers.SGD(0.1), "binary_crossentropy", metrics=metrics(keras))
    mine.compile(ckeras.optimizers.SGD(0.1), "binary_crossentropy", metrics=metrics(ckeras))
    ht = theirs.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    hm = mine.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    for key in ("loss", "accuracy", "precision", "recall", "auc"):
        np.testing.assert_allclose(hm[key], ht[key], rtol=1e-4, atol=1e-5, err_msg=key)
    et = theirs.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    em = mine.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    for key in ("precision", "recall", "auc"):
        np.testing.assert_allclose(em[key], et[key], rtol=1e-4, atol=1e-5, err_msg=key)


def _multi_label_scores(seed, n=40, labels=3):
    rng = np.random.default_rng(seed)
    y = (rng.random((n, labels)) < np.array([0.3, 0.5, 0.7])[:labels]).astype("float32")
    p = np.clip(0.3 * y + rng.random((n, labels)) * 0.7, 0, 1).astype("float32")
    return y, p


@pytest.mark.parametrize("curve", ["ROC", "PR", "PRGAIN"])
@pytest.mark.parametrize("method", ["interpolation", "minoring", "majoring"])
@pytest.mark.parametrize("extra", [dict(multi_label=True), dict(multi_label=True, num_labels=3),
                                   dict(multi_label=True, label_weights=[0.2, 1.0, 0.5]),
                                   dict(label_weights=[0.2, 1.0, 0.5])])
def test_auc_multi_label_and_label_weights_match_keras(curve, method, extra):
    kwargs = dict(curve=curve, summation_method=method, num_thresholds=23, **extra)
    theirs, mine = keras.metrics.AUC(**kwargs), ckeras.metrics.AUC(**kwargs)
    for seed in (4, 5):
        y, p = _multi_label_scores(seed)
        w = np.random.default_rng(seed + 10).random(len(y)).astype("float32")
        theirs.update_state(y, p, sample_weight=w)
        mine.update_state(y, p, sample_weight=w)
    np.testing.assert_allclose(mine.result(), float(theirs.result()), rtol=1e-5, atol=1e-6)
    mine.reset_state()
    theirs.reset_state()
    y, p = _multi_label_scores(6)
    theirs.update_state(y, p)
    mine.update_state(y, p)
    np.testing.assert_allclose(mine.result(), float(theirs.result()), rtol=1e-5, atol=1e-6)


def test_multi_label_auc_in_fit_matches_keras():
    def build(lib):
        return lib.Sequential([lib.Input((5,)), lib.layers.Dense(3, activation="sigmoid")])
    keras.utils.set_random_seed(11)
    rng = np.random.default_rng(11)
    x = rng.normal(size=(40, 5)).astype("float32")
    y = (x[:, :3] + 0.7 * rng.normal(size=(40, 3)) > 0).astype("float32")
    theirs, mine = build(keras), build(ckeras)
    mine.set_weights(theirs.get_weights())
    metrics = lambda lib: [lib.metrics.AUC(name="auc", multi_label=True, curve="PR"),  # noqa: E731
                           lib.metrics.AUC(name="wauc", multi_label=True, label_weights=[1.0, 0.0, 2.0])]
    theirs.compile(keras.optimizers.SGD(0.1), "binary_crossentropy", metrics=metrics(keras))
    mine.compile(ckeras.optimizers.SGD(0.1), "binary_crossentropy", metrics=metrics(ckeras))
    ht = theirs.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    hm = mine.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    for key in ("loss", "auc", "wauc"):
        np.testing.assert_allclose(hm[key], ht[key], rtol=1e-4, atol=1e-5, err_msg=key)


def test_multi_label_auc_needs_rank_two_predictions():
    with pytest.raises(ValueError, match="rank 2"):
        ckeras.metrics.AUC(multi_label=True).update_state(np.zeros((4, 2, 2)), np.zeros((4, 2, 2)))
    with pytest.raises(ValueError, match="only when multi_label"):
        ckeras.metrics.AUC(num_labels=3)
