"""Saving and loading: the Keras 3 ``.keras`` zip (config.json, model.weights.h5, metadata.json), legacy
``.h5`` files (Keras 3 and tf.keras 2 writers), ``.weights.h5`` files and JSON configs.

Loading parses and checks everything before it changes anything: JSON nesting depth and the type
of every config value, zip member sizes, HDF5 dataset shapes and dtypes against the model, and the
bytes the weights need against ``load_limits.max_bytes``. It builds the whole model and reads,
checks and casts every weight before any is assigned, so a file with an unknown layer, a weight
of the wrong shape or dtype, a damaged archive or a corrupt HDF5 file (read in a worker process
that a hang cannot take down, ``h5_guard``) raises a ``KerasConfigError`` naming the file and
the layer, weight or dataset, with the library's error as its cause, and nothing is half-loaded:
``load_weights`` leaves the model as it was, and a failed ``load_model`` removes the variables it
had created. Lambda layers hold Python bytecode and load only with ``safe_mode=False``.

This module handles the files; model configs are built and read in ``model_config``, and the
layout of weights in HDF5 files is in ``h5_weights``.
"""
from __future__ import annotations

import datetime
import io
import json
import os
import warnings
import zipfile
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ...errors import CgvmError
from .h5_guard import open_h5
from .h5_weights import (assign_all, has_weights, legacy_layer_weights, read_legacy_weights, read_weights_h5,
                         write_weights_h5)
from .load_limits import budget, max_bytes, parse_json
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


#: what a config value of the wrong type or size makes layer code raise while the model is built
_MALFORMED = (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, ZeroDivisionError,
              RecursionError, NotImplementedError)


def _safe_mode(value: Any) -> bool:
    """``safe_mode`` as given: only an explicit ``False`` lets a file's Lambda bytecode run."""
    if value is None:
        return True
    if not isinstance(value, (bool, np.bool_)):
        raise KerasConfigError(f"safe_mode must be True or False, got {value!r}")
    return bool(value)


def _model_file(filepath: Any, what: str) -> str:
    try:
        path = os.fspath(filepath)
    except TypeError:
        raise KerasConfigError(f"{what} takes a file path, got {type(filepath).__name__}") from None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no model file at {path}")
    if os.path.isdir(path):
        raise KerasConfigError(f"{path} is a directory, not a model file (SavedModel directories are not supported)")
    return path


def _build(config: Any, what: str) -> Any:
    """The model of ``config``; any failure becomes a KerasConfigError saying where in the config."""
    from .model_config import _load_context

    try:
        return deserialize_model(config)
    except KerasConfigError as exc:
        if what in str(exc):
            raise
        raise KerasConfigError(f"{what}: {exc}") from exc
    except (CgvmError,) + _MALFORMED as exc:
        at = ", ".join(_load_context["at"]) or "the model config"
        raise KerasConfigError(f"{what}: {at}: the config does not describe a model this frontend can build "
                               f"({type(exc).__name__}: {exc})") from exc


def _read_archive(path: str) -> Tuple[bytes, Optional[bytes]]:
    """config.json and model.weights.h5 of a ``.keras`` file, their sizes checked before reading."""
    limit = max_bytes()
    try:
        with zipfile.ZipFile(path) as z:
            members = {info.filename: info for info in z.infolist()}
            for name in ("config.json", "model.weights.h5"):
                info = members.get(name)
                if info is not None and info.file_size > limit:
                    raise KerasConfigError(f"{path}: {name} claims {info.file_size} bytes, more than the limit "
                                           f"of {limit} (CGVM_MAX_BYTES)")
            if "config.json" not in members:
                raise KerasConfigError(f"{path} is a zip file without config.json: not a .keras model")
            config = z.read("config.json")
            weights = z.read("model.weights.h5") if "model.weights.h5" in members else None
    except KerasConfigError:
        raise
    except Exception as exc:  # zipfile, zlib, bz2, lzma: every way a damaged archive fails
        raise KerasConfigError(f"{path} is not a readable .keras archive: {type(exc).__name__}: {exc}") from exc
    return config, weights


def _load_archive(path: str) -> Tuple[Any, Any]:
    config_bytes, weights = _read_archive(path)
    config = parse_json(config_bytes, f"{path}: config.json")
    model = _build(config, path)
    if weights is None:
        if has_weights(model):
            raise KerasConfigError(f"{path} has no model.weights.h5, but the model has weights")
        return model, config.get("compile_config") if isinstance(config, dict) else None
    with open_h5(weights, f"{path}: model.weights.h5") as snap:
        pairs = read_weights_h5(model, snap)
    assign_all(pairs)
    return model, config.get("compile_config") if isinstance(config, dict) else None


def _attr_text(value: Any, what: str) -> Any:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, (str, bytes)):
        raise KerasConfigError(f"{what} should be JSON text, got {type(value).__name__}")
    return value


def _load_legacy(path: str) -> Tuple[Any, Any]:
    with open_h5(path, path) as snap:
        raw = snap.root.attrs.get("model_config")
        if raw is None:
            raise KerasConfigError(f"{path} holds no model config (a weights-only file? use load_weights)")
        config = parse_json(_attr_text(raw, f"{path}: attribute model_config"), f"{path}: attribute model_config")
        model = _build(config, path)
        pairs = read_legacy_weights(model, snap)
        training = snap.root.attrs.get("training_config")
    compile_config = None
    if training is not None:
        t = parse_json(_attr_text(training, f"{path}: attribute training_config"),
                       f"{path}: attribute training_config")
        if isinstance(t, dict):
            compile_config = {"optimizer": t.get("optimizer_config"), "loss": t.get("loss"),
                              "metrics": _flat_metrics(t.get("metrics")), "loss_weights": t.get("loss_weights")}
    assign_all(pairs)
    return model, compile_config


def load_model(filepath: Any, custom_objects: Optional[Dict[str, Any]] = None, compile: bool = True,
               safe_mode: bool = True) -> Any:
    """A model from a ``.keras`` or legacy ``.h5`` file (Keras 3, tf.keras 2 or cgvm).

    Everything is read and checked before the model is returned; on any failure a
    ``KerasConfigError`` names the file and what in it is wrong, and no variables are left behind.
    """
    safe = _safe_mode(safe_mode)
    path = _model_file(filepath, "load_model")
    with _rolled_back(), loading(path, custom_objects, safe), budget():
        if zipfile.is_zipfile(path):
            model, compile_config = _load_archive(path)
        else:
            model, compile_config = _load_legacy(path)
    if compile and isinstance(compile_config, dict):
        try:
            model.compile(optimizer=compile_config.get("optimizer") or "rmsprop", loss=compile_config.get("loss"),
                          metrics=_flat_metrics(compile_config.get("metrics")),
                          loss_weights=compile_config.get("loss_weights"))
        except (CgvmError,) + _MALFORMED as exc:  # an optimizer or loss this frontend lacks: the model still
            warnings.warn(f"{path}: the model is loaded but not compiled ({exc}); compile it yourself",
                          stacklevel=2)  # predicts, as Keras does
    return model


class _rolled_back:
    """On failure, drop the Workspace entries the failed load created (its layers' variables)."""

    def __enter__(self) -> None:
        from .backend import get_workspace

        self.workspace = get_workspace()
        self.before = set(self.workspace.keys())

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None:
            for name in [n for n in self.workspace.keys() if n not in self.before]:
                del self.workspace[name]


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


def load_weights(model: Any, filepath: Any, skip_mismatch: bool = False, by_name: Optional[bool] = None) -> None:
    """Weights from a ``.weights.h5``, ``.keras`` or legacy ``.h5`` file; all or nothing.

    ``skip_mismatch`` leaves, with a warning, what does not fit the model (in a Keras 3 file a
    layer's whole group, in a legacy file a weight of another shape); ``by_name`` (legacy ``.h5``
    only, as in Keras) matches layers by name instead of by order."""
    path = _model_file(filepath, "load_weights")
    legacy = not (path.endswith(".keras") or zipfile.is_zipfile(path))
    if by_name is not None and not (legacy and path.endswith((".h5", ".hdf5")) and not path.endswith(".weights.h5")):
        raise ValueError(f"`by_name` only supports loading legacy '.h5' or '.hdf5' files. Received: {path}")
    if not legacy:
        _, weights = _read_archive(path)
        if weights is None:
            raise KerasConfigError(f"{path} has no model.weights.h5")
        with open_h5(weights, f"{path}: model.weights.h5") as snap:
            pairs = read_weights_h5(model, snap, skip_mismatch=skip_mismatch)
    else:
        with open_h5(path, path) as snap:
            pairs = (read_weights_h5(model, snap, skip_mismatch=skip_mismatch) if "layers" in snap.root else
                     read_legacy_weights(model, snap, by_name=bool(by_name), skip_mismatch=skip_mismatch))
    assign_all(pairs)


def model_from_json(text: Any, custom_objects: Optional[Dict[str, Any]] = None) -> Any:
    """A model (with fresh weights) from the JSON text of ``model.to_json()``."""
    if isinstance(text, os.PathLike) or (isinstance(text, str) and not text.lstrip().startswith(("{", "[")) and
                                         (text.endswith(".json") or os.path.exists(text))):
        raise KerasConfigError(f"model_from_json takes the JSON text itself, not a file name: {text!r}; "
                               f"pass open({os.fspath(text)!r}).read()")
    with _rolled_back(), loading(None, custom_objects, True), budget():
        return _build(parse_json(text, "model_from_json"), "model_from_json")
