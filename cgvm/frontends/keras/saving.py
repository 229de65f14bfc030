"""Saving and loading: the Keras 3 ``.keras`` zip (config.json, model.weights.h5, metadata.json), legacy
``.h5`` files (Keras 3 and tf.keras 2 writers), ``.weights.h5`` files and JSON configs.

Loading builds the whole model and reads and checks every weight before any is assigned, so a
file with an unknown layer, a weight of the wrong shape or a damaged archive raises a
``KerasConfigError`` naming the layer and the file, and nothing is half-loaded. Lambda layers
hold Python bytecode and load only with ``safe_mode=False``.

This module handles the files; model configs are built and read in ``model_config``, and the
layout of weights in HDF5 files is in ``h5_weights``.
"""
from __future__ import annotations

import datetime
import io
import json
import os
import zipfile
from typing import Any, Dict, Optional

from .h5_weights import assign_all, legacy_layer_weights, read_legacy_weights, read_weights_h5, write_weights_h5
from .model_config import deserialize_model, loading, serialize_model
from .serialization import KerasConfigError

KERAS_VERSION = "3.15.1"


def _save_legacy_h5(model: Any, path: str) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        f.attrs["keras_version"] = KERAS_VERSION
        f.attrs["backend"] = "cgvm"
        f.attrs["model_config"] = json.dumps(serialize_model(model))
        mw = f.create_group("model_weights")
        mw.attrs["layer_names"] = [l.name.encode() for l in model.layers]
        for layer in model.layers:
            g = mw.create_group(layer.name)
            variables = legacy_layer_weights(layer)
            names = [f"{layer.name}/{v.path.split('/', 1)[-1]}" for v in variables]  # unique per variable
            g.attrs["weight_names"] = [n.encode() for n in names]
            for n, v in zip(names, variables):
                g.create_dataset(n, data=v.numpy())


# --------------------------------------------------------------------------- public API

def save_model(model: Any, filepath: Any, overwrite: bool = True, **kwargs: Any) -> None:
    path = os.fspath(filepath)
    if not overwrite and os.path.exists(path):
        raise FileExistsError(path)
    if path.endswith((".h5", ".hdf5")):
        _save_legacy_h5(model, path)
        return
    if not path.endswith(".keras"):
        raise ValueError(f"model files end in .keras (or legacy .h5), got {path!r}")
    import h5py

    config = serialize_model(model)
    if getattr(model, "compiled", False) and model.optimizer is not None:
        from .losses import loss_name

        config["compile_config"] = {"optimizer": {"module": "keras.optimizers", "class_name":
                                                  type(model.optimizer).__name__, "config":
                                                  model.optimizer.get_config(), "registered_name": None},
                                    "loss": model.loss if isinstance(model.loss, (str, dict, list)) else
                                    loss_name(model.loss), "metrics": model._metric_spec
                                    if isinstance(model._metric_spec, (list, dict, type(None))) else None,
                                    "loss_weights": model.loss_weights}
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as h5:
        write_weights_h5(model, h5)
    meta = {"keras_version": KERAS_VERSION, "date_saved": datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S")}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("metadata.json", json.dumps(meta))
        z.writestr("config.json", json.dumps(config))
        z.writestr("model.weights.h5", buffer.getvalue())


def load_model(filepath: Any, custom_objects: Optional[Dict[str, Any]] = None, compile: bool = True,
               safe_mode: bool = True) -> Any:
    """A model from a ``.keras`` or legacy ``.h5`` file (Keras 3, tf.keras 2 or cgvm)."""
    import h5py

    path = os.fspath(filepath)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no model file at {path}")
    with loading(path, custom_objects, safe_mode):
        if zipfile.is_zipfile(path):
            try:
                with zipfile.ZipFile(path) as z:
                    config = json.loads(z.read("config.json"))
                    weights = z.read("model.weights.h5")
            except (KeyError, zipfile.BadZipFile, ValueError, OSError) as exc:
                raise KerasConfigError(f"{path} is not a readable .keras archive: {exc}") from None
            model = deserialize_model(config)
            try:
                with h5py.File(io.BytesIO(weights), "r") as h5:
                    pairs = read_weights_h5(model, h5, path)
            except OSError as exc:
                raise KerasConfigError(f"{path}: model.weights.h5 cannot be read: {exc}") from None
            assign_all(pairs)
            compile_config = config.get("compile_config")
        else:
            try:
                h5 = h5py.File(path, "r")
            except OSError as exc:
                raise KerasConfigError(f"{path} is neither a .keras archive nor an HDF5 model file: {exc}") from None
            with h5:
                raw = h5.attrs.get("model_config")
                if raw is None:
                    raise KerasConfigError(f"{path} holds no model config (a weights-only file? use load_weights)")
                config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
                model = deserialize_model(config)
                assign_all(read_legacy_weights(model, h5, path))
                training = h5.attrs.get("training_config")
            compile_config = None
            if training is not None:
                t = json.loads(training.decode() if isinstance(training, bytes) else training)
                compile_config = {"optimizer": t.get("optimizer_config"), "loss": t.get("loss"),
                                  "metrics": _flat_metrics(t.get("metrics")), "loss_weights": t.get("loss_weights")}
    if compile and compile_config:
        try:
            model.compile(optimizer=compile_config.get("optimizer") or "rmsprop", loss=compile_config.get("loss"),
                          metrics=_flat_metrics(compile_config.get("metrics")),
                          loss_weights=compile_config.get("loss_weights"))
        except KerasConfigError:
            pass  # an optimizer or loss this frontend lacks: the model still predicts; compile it yourself
    return model


def _flat_metrics(metrics: Any) -> Any:
    if isinstance(metrics, list):
        out = []
        for m in metrics:
            if isinstance(m, list):
                out.extend(_flat_metrics(m))
            elif isinstance(m, dict):
                out.append((m.get("config") or {}).get("name", m.get("class_name")))
            else:
                out.append(m)
        return out
    return metrics


def save_weights(model: Any, filepath: Any) -> None:
    import h5py

    path = os.fspath(filepath)
    if not path.endswith(".weights.h5"):
        raise ValueError(f"weight files end in .weights.h5, got {path!r}")
    with h5py.File(path, "w") as h5:
        write_weights_h5(model, h5)


def load_weights(model: Any, filepath: Any, skip_mismatch: bool = False) -> None:
    import h5py

    path = os.fspath(filepath)
    if path.endswith(".keras"):
        with zipfile.ZipFile(path) as z, h5py.File(io.BytesIO(z.read("model.weights.h5")), "r") as h5:
            pairs = read_weights_h5(model, h5, path)
    else:
        with h5py.File(path, "r") as h5:
            pairs = read_weights_h5(model, h5, path) if "layers" in h5 else read_legacy_weights(model, h5, path)
    assign_all(pairs)


def model_from_json(text: str, custom_objects: Optional[Dict[str, Any]] = None) -> Any:
    with loading(None, custom_objects, True):
        return deserialize_model(json.loads(text))
