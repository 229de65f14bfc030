"""Fuzz targets for the Keras frontend's loaders: ``.keras`` and legacy ``.h5`` through ``load_model``,
``model_from_json``, and ``load_weights`` from ``.weights.h5`` and legacy ``.h5`` files.

Seeds are small models saved by cgvm itself and, where Keras 3 is installed (torch backend), by
real Keras. ``load_model`` and ``model_from_json`` build into a fresh Workspace that must still be
empty after a failed load; ``load_weights`` loads into one model (every weight layout: Dense,
BatchNormalization, Conv1D, Embedding, LSTM) whose weights are fingerprinted before and compared
after a failure.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable, List, Optional

import numpy as np

from fuzz.target import PartialLoad, Target


def _ckeras():
    import cgvm.keras as ckeras

    return ckeras


def _cgvm_models() -> List[Any]:
    """Small models covering the config forms: Sequential, functional with several inputs, RNNs."""
    keras = _ckeras()
    L = keras.layers
    seq = keras.Sequential([keras.Input((6,)), L.Dense(4, activation="relu"), L.BatchNormalization(),
                            L.Dropout(0.1), L.Dense(3, activation="softmax")], name="fz_seq")
    a, b = keras.Input((5, 3), name="fa"), keras.Input((5, 3), name="fb")
    conv = L.Conv1D(2, 2, padding="same")
    m = L.Concatenate()([conv(a), conv(b)])
    out = L.Dense(2)(L.GlobalAveragePooling1D()(m))
    func = keras.Model([a, b], out, name="fz_func")
    ids = keras.Input((4,), dtype="int32", name="ids")
    e = L.Embedding(10, 3, mask_zero=True)(ids)
    r = L.LSTM(2)(e)
    rnn = keras.Model(ids, L.Dense(1)(r), name="fz_rnn")
    seq.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])  # a compile_config too
    return [seq, func, rnn]


def _real_keras() -> Optional[Any]:
    os.environ.setdefault("KERAS_BACKEND", "torch")
    try:
        import keras
    except Exception:
        return None
    return keras


def _keras_models(keras: Any) -> List[Any]:
    L = keras.layers
    seq = keras.Sequential([keras.Input((6,)), L.Dense(4, activation="relu"), L.BatchNormalization(),
                            L.Dense(3, activation="softmax")], name="kz_seq")
    seq.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    x = keras.Input((8, 8, 1))
    h = L.Conv2D(2, 3, padding="same")(x)
    h = L.MaxPooling2D()(h)
    func = keras.Model(x, L.Dense(2)(L.Flatten()(h)), name="kz_cnn")
    return [seq, func]


def _saved(suffix: str, tmp: Path, save: Callable[[Any, Path], None]) -> List[bytes]:
    out = []
    for i, model in enumerate(_cgvm_models()):
        p = tmp / f"cgvm_{i}{suffix}"
        save(model, p)
        out.append(p.read_bytes())
    keras = _real_keras()
    if keras is not None and suffix != ".json":
        for i, model in enumerate(_keras_models(keras)):
            p = tmp / f"keras_{i}{suffix}"
            save(model, p)
            out.append(p.read_bytes())
    elif keras is not None:
        out += [m.to_json().encode() for m in _keras_models(keras)]
    return out


def _fresh_workspace():
    from cgvm.frontends.keras import backend as K
    from cgvm.vm import Workspace

    K.clear_session()
    ws = Workspace()
    K.set_workspace(ws)
    return ws


def _load_model(path: Path) -> Any:
    keras = _ckeras()
    ws = _fresh_workspace()
    try:
        return keras.load_model(path)
    except BaseException as exc:
        if len(ws):
            raise PartialLoad(f"the failed load left {len(ws)} workspace entries") from exc
        raise


def _model_from_json(path: Path) -> Any:
    keras = _ckeras()
    ws = _fresh_workspace()
    text = path.read_bytes()
    try:
        return keras.model_from_json(text)
    except BaseException as exc:
        if len(ws):
            raise PartialLoad(f"the failed load left {len(ws)} workspace entries") from exc
        raise


def _weights_model() -> Any:
    """One model with the weight layouts that differ: Dense, BatchNormalization, Conv1D, Embedding, LSTM."""
    keras = _ckeras()
    L = keras.layers
    ids = keras.Input((4,), dtype="int32", name="wz_ids")
    seq = L.LSTM(2)(L.Embedding(10, 3)(ids))
    x = keras.Input((5, 3), name="wz_x")
    conv = L.GlobalAveragePooling1D()(L.Conv1D(2, 2, padding="same")(x))
    h = L.BatchNormalization()(L.Dense(3, activation="relu")(L.Concatenate()([seq, conv])))
    return keras.Model([ids, x], L.Dense(1)(h), name="fz_weights")


class _WeightsTarget:
    """One model that every mutated weights file is loaded into, fingerprinted around each load."""

    def __init__(self, legacy: bool):
        self.legacy = legacy
        self.model: Optional[Any] = None

    def _model(self) -> Any:
        if self.model is None:
            from cgvm.frontends.keras import backend as K
            from cgvm.vm import Workspace

            K.set_workspace(Workspace())
            self.model = _weights_model()
        return self.model

    def seeds(self, tmp: Path) -> List[bytes]:
        model = self._model()
        p = tmp / ("w.h5" if self.legacy else "w.weights.h5")
        model.save(p) if self.legacy else model.save_weights(p)
        return [p.read_bytes()]

    def load(self, path: Path) -> Any:
        model = self._model()
        before = _fingerprint(model)
        try:
            model.load_weights(path)
            return model
        except BaseException as exc:
            if _fingerprint(model) != before:
                raise PartialLoad(f"load_weights failed after changing model {model.name!r}") from exc
            raise


def _fingerprint(model: Any) -> str:
    h = hashlib.sha256()
    for w in model.weights:
        arr = w.numpy()
        h.update(f"{w.path}{arr.dtype}{arr.shape}".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def targets() -> List[Target]:
    w3, wl = _WeightsTarget(False), _WeightsTarget(True)
    return [
        Target(".keras -> keras.load_model", ".keras", lambda tmp: _saved(".keras", tmp, lambda m, p: m.save(p)),
               _load_model),
        Target("legacy .h5 -> keras.load_model", ".h5", lambda tmp: _saved(".h5", tmp, lambda m, p: m.save(p)),
               _load_model),
        Target("JSON -> keras.model_from_json", ".json",
               lambda tmp: _saved(".json", tmp, lambda m, p: p.write_text(m.to_json())), _model_from_json),
        Target(".weights.h5 -> Model.load_weights", ".weights.h5", w3.seeds, w3.load),
        Target("legacy .h5 -> Model.load_weights", ".h5", wl.seeds, wl.load),
    ]
