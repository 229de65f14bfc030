"""``load_weights`` with ``by_name`` and ``skip_mismatch`` does what real Keras 3 does on the same
files: legacy ``.h5`` loads by order unless ``by_name``; what does not fit is skipped only when
asked, and the rest still loads. Each case runs in real Keras and in cgvm from the same starting
weights and compares every weight after. Skipped without keras."""
from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "torch")
keras = pytest.importorskip("keras")
pytest.importorskip("torch")
pytest.importorskip("h5py")

import cgvm.keras as ckeras  # noqa: E402


def _saved(tmp_path, ext):
    """A real Keras model (layers a, b, c) saved as ``ext``, with random biases."""
    src = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, name="a"), keras.layers.Dense(5, name="b"),
                            keras.layers.Dense(2, name="c")])
    rng = np.random.default_rng(0)
    src.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in src.get_weights()])
    path = tmp_path / f"src{ext}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # Keras warns that .h5 is a legacy format
        src.save(path) if ext == ".h5" else src.save_weights(path)
    return path


def _pair(spec):
    """The same target architecture in real Keras and in cgvm, with the same starting weights."""
    def build(k):
        return k.Sequential([k.Input((3,))] + [k.layers.Dense(units, name=name, use_bias=bias)
                                               for name, units, bias in spec])
    real, ours = build(keras), build(ckeras)
    rng = np.random.default_rng(1)
    start = [rng.standard_normal(w.shape).astype(np.float32) for w in real.get_weights()]
    real.set_weights(start)
    ours.set_weights(start)
    return real, ours


def _same_after(real, ours, path, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real.load_weights(path, **kwargs)
        ours.load_weights(path, **kwargs)
    got, want = ours.get_weights(), real.get_weights()
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_legacy_h5_loads_by_order_whatever_the_names(tmp_path):
    path = _saved(tmp_path, ".h5")
    real, ours = _pair([("x", 4, True), ("y", 5, True), ("z", 2, True)])
    start = ours.get_weights()
    _same_after(real, ours, path)
    assert not any(np.array_equal(a, b) for a, b in zip(start, ours.get_weights())), "nothing was loaded"


def test_legacy_h5_by_name_leaves_unmatched_layers(tmp_path):
    path = _saved(tmp_path, ".h5")
    real, ours = _pair([("c", 4, True), ("q", 5, True), ("a", 2, True)])   # a and c swapped shapes, q unknown
    for model in (real, ours):   # shapes differ and nothing says skip: both refuse (cgvm's error is a ValueError)
        with pytest.raises(ValueError, match="[Ss]hape"):
            model.load_weights(path, by_name=True)
    real, ours = _pair([("a", 4, True), ("q", 5, True), ("c", 2, True)])
    _same_after(real, ours, path, by_name=True)


def test_legacy_h5_skip_mismatch_skips_only_what_does_not_fit(tmp_path):
    path = _saved(tmp_path, ".h5")
    real, ours = _pair([("a", 4, True), ("b", 6, True), ("c", 2, True)])   # b: other shapes, so c too
    _same_after(real, ours, path, by_name=True, skip_mismatch=True)
    real, ours = _pair([("a", 4, True), ("b", 5, False), ("c", 2, True)])  # b: other weight count
    _same_after(real, ours, path, by_name=True, skip_mismatch=True)


def test_weights_h5_skip_mismatch_skips_the_layer(tmp_path):
    path = _saved(tmp_path, ".weights.h5")
    real, ours = _pair([("a", 4, True), ("b", 5, False), ("c", 2, True)])
    _same_after(real, ours, path, skip_mismatch=True)


def test_mismatch_without_skip_fails_and_changes_nothing(tmp_path):
    for ext in (".h5", ".weights.h5"):
        path = _saved(tmp_path, ext)
        _, ours = _pair([("a", 4, True), ("b", 6, True), ("c", 2, True)])
        before = [w.copy() for w in ours.get_weights()]
        with pytest.raises(Exception, match="shape"):
            ours.load_weights(path)
        for b, w in zip(before, ours.get_weights()):
            np.testing.assert_array_equal(b, w)


def test_by_name_only_for_legacy_files(tmp_path):
    path = _saved(tmp_path, ".weights.h5")
    real, ours = _pair([("a", 4, True), ("b", 5, True), ("c", 2, True)])
    for model in (real, ours):
        with pytest.raises(ValueError, match="by_name"):
            model.load_weights(path, by_name=True)
        with pytest.raises(ValueError, match="Invalid keyword"):
            model.load_weights(path, by_nam=True)
