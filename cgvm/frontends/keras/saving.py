"""Saving and loading: the Keras 3 ``.keras`` zip (config.json, model.weights.h5, metadata.json), legacy
``.h5`` files (Keras 3 and tf.keras 2 writers), ``.weights.h5`` files and JSON configs.

Loading builds the whole model and reads and checks every weight before any is assigned, so a
file with an unknown layer, a weight of the wrong shape or a damaged archive raises a
``KerasConfigError`` naming the layer and the file, and nothing is half-loaded. Lambda layers
hold Python bytecode and load only with ``safe_mode=False``.

In ``model.weights.h5`` a layer's group is ``layers/<key>`` where the key is the snake_case class
name made unique in ``model.layers`` order (``conv2d``, ``conv2d_1``); recurrent layers keep their
variables under ``cell/``, Bidirectional under ``forward_layer/`` then ``backward_layer/``, nested
models under ``layers/``.
"""
from __future__ import annotations

import datetime
import io
import json
import os
import zipfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import backend as K
from .backend import KerasTensor, flatten
from .layers.base import InputLayer, Layer, registry
from .layers.core import Lambda
from .layers.recurrent import RNNBase
from .layers.operations import KerasOperation, is_operation_entry
from .layers.wrappers import Bidirectional, TimeDistributed
from .serialization import KerasConfigError, custom_objects

KERAS_VERSION = "3.15.1"


# --------------------------------------------------------------------------- configs

def serialize_layer(layer: Layer) -> Dict[str, Any]:
    from .models import Model

    if isinstance(layer, Model):
        return serialize_model(layer)
    return {"module": "keras.layers", "class_name": type(layer).__name__, "config": layer.get_config(),
            "registered_name": None}


def serialize_model(model: Any) -> Dict[str, Any]:
    from .models import Functional, Sequential

    cls = "Sequential" if isinstance(model, Sequential) else "Functional" if isinstance(model, Functional) else \
        type(model).__name__
    return {"module": "keras", "class_name": cls, "config": model.get_config(),
            "registered_name": None if cls in ("Sequential", "Functional") else f"Custom>{cls}"}


def sequential_config(model: Any) -> Dict[str, Any]:
    layers = []
    if model._input_layer is not None:
        layers.append(serialize_layer(model._input_layer))
    layers += [serialize_layer(l) for l in model.layers]
    return {"name": model.name, "trainable": model.trainable, "dtype": "float32", "layers": layers}


def _tensor_ref(t: Any) -> Any:
    if isinstance(t, KerasTensor) and t._keras_history is not None:
        layer, ni, ti = t._keras_history
        return {"class_name": "__keras_tensor__", "config": {"shape": list(t.shape), "dtype": t.dtype,
                                                             "keras_history": [layer.name, ni, ti]}}
    if isinstance(t, (list, tuple)):
        return [_tensor_ref(i) for i in t]
    if isinstance(t, dict):
        return {k: _tensor_ref(v) for k, v in t.items()}
    if isinstance(t, (int, float, str, bool)) or t is None:
        return t
    raise KerasConfigError(f"cannot serialize the layer argument {t!r}")


def functional_config(model: Any) -> Dict[str, Any]:
    from .layers.base import OperationLayer

    node_ids: Dict[int, int] = {}
    layers = []
    for layer in model.layers:
        if isinstance(layer, KerasOperation):
            entry = layer.serialize()
        elif isinstance(layer, OperationLayer):
            raise KerasConfigError(f"model {model.name!r} uses a tensor operation ({layer.name}) outside layers; "
                                   "wrap it in a Lambda or a custom layer to save the model")
        else:
            entry = serialize_layer(layer)
        entry["name"] = layer.name
        nodes = []
        for node in layer._inbound_nodes:
            if isinstance(layer, InputLayer) or any(node is n for n in model._nodes):
                node_ids[id(node)] = len(nodes)
                if not isinstance(layer, InputLayer):
                    kwargs = {k: v for k, v in node.kwargs.items() if k != "training" or v is not None}
                    nodes.append({"args": _tensor_ref(list(node.args)), "kwargs": _tensor_ref(kwargs)})
        entry["inbound_nodes"] = nodes
        layers.append(entry)

    def ref(t: KerasTensor) -> List[Any]:
        layer, ni, ti = t._keras_history
        return [layer.name, ni, ti]

    ins = [ref(t) for t in model.inputs]
    outs = [ref(t) for t in model.outputs]
    single_in = not isinstance(model._input_struct, (list, tuple, dict))
    single_out = not isinstance(model._output_struct, (list, tuple, dict))
    return {"name": model.name, "trainable": model.trainable, "layers": layers,
            "input_layers": ins[0] if single_in else ins, "output_layers": outs[0] if single_out else outs}


def _layer_class(class_name: str, extra: Optional[Dict[str, Any]]) -> Any:
    from . import models

    if class_name in ("Functional", "Model"):
        return models.Functional
    if class_name == "Sequential":
        return models.Sequential
    return registry.lookup(class_name, extra)


_load_context: Dict[str, Any] = {"safe_mode": True, "custom_objects": None, "file": None}


def deserialize_layer(config: Dict[str, Any]) -> Layer:
    class_name = config.get("registered_name") or config["class_name"]
    if class_name in ("Functional", "Model", "Sequential") or config["class_name"] in ("Functional", "Model",
                                                                                        "Sequential"):
        return deserialize_model(config)
    name = (config.get("config") or {}).get("name", "?")
    where = f" in {_load_context['file']}" if _load_context["file"] else ""
    try:
        cls = _layer_class(config["class_name"] if config["class_name"] in registry.classes else class_name,
                           _load_context["custom_objects"])
    except KerasConfigError:
        raise KerasConfigError(f"layer {name!r}{where} has the unknown type {config['class_name']!r}; "
                               "pass it in custom_objects or register it with register_keras_serializable") from None
    layer_config = dict(config.get("config") or {})
    try:
        if cls is Lambda:
            return Lambda.from_config(layer_config, safe_mode=_load_context["safe_mode"])
        return cls.from_config(layer_config)
    except KerasConfigError as exc:
        raise KerasConfigError(f"{exc}{where}") from None
    except TypeError as exc:
        raise KerasConfigError(f"layer {name!r} ({config['class_name']}){where}: {exc}") from None


def _ref_from(obj: Any) -> Optional[Tuple[str, int, int]]:
    if isinstance(obj, dict) and obj.get("class_name") == "__keras_tensor__":
        h = obj["config"]["keras_history"]
        return (h[0], int(h[1]), int(h[2]))
    return None


def _substitute(obj: Any, outputs: Dict[Tuple[str, int], List[KerasTensor]]) -> Any:
    ref = _ref_from(obj)
    if ref is not None:
        return outputs[(ref[0], ref[1])][ref[2]]
    if isinstance(obj, list):
        return [_substitute(o, outputs) for o in obj]
    if isinstance(obj, dict):
        return {k: _substitute(v, outputs) for k, v in obj.items()}
    return obj


def _refs_in(obj: Any) -> List[Tuple[str, int, int]]:
    ref = _ref_from(obj)
    if ref is not None:
        return [ref]
    if isinstance(obj, list):
        return [r for o in obj for r in _refs_in(o)]
    if isinstance(obj, dict):
        return [r for o in obj.values() for r in _refs_in(o)]
    return []


def _normalize_node(node: Any) -> Dict[str, Any]:
    """Keras 2 nodes ``[[name, node, tensor, kwargs], ...]`` into Keras 3's ``{"args", "kwargs"}``."""
    if isinstance(node, dict):
        return node
    refs = []
    kwargs: Dict[str, Any] = {}
    for item in node:
        name, ni, ti = item[0], item[1], item[2]
        if len(item) > 3 and item[3]:
            kwargs.update(item[3])
        refs.append({"class_name": "__keras_tensor__", "config": {"keras_history": [name, ni, ti]}})
    for k, v in list(kwargs.items()):  # tf.keras 2 writes tensor kwargs as [name, node, tensor] lists
        if isinstance(v, list) and v and isinstance(v[0], list) and len(v[0]) == 3 and isinstance(v[0][0], str):
            kwargs[k] = [{"class_name": "__keras_tensor__", "config": {"keras_history": list(r)}} for r in v]
    return {"args": [refs[0] if len(refs) == 1 else refs], "kwargs": kwargs}


def _functional_from_config(config: Dict[str, Any]) -> Any:
    from .models import Functional

    created: Dict[str, Layer] = {}
    order: List[Layer] = []
    pending: List[Tuple[Layer, Dict[str, Any]]] = []
    outputs: Dict[Tuple[str, int], List[KerasTensor]] = {}
    for entry in config["layers"]:
        lname = entry.get("name") or entry["config"]["name"]
        if is_operation_entry(entry):  # e.g. the not_equal(ids, 0) mask of an Embedding(mask_zero=True)
            layer = KerasOperation(entry["class_name"], dict(entry.get("config") or {}, name=lname),
                                   module=entry.get("module") or "keras.src.ops.numpy")
            pending.extend((layer, _normalize_node(n)) for n in entry.get("inbound_nodes", []))
        elif entry["class_name"] == "InputLayer":
            c = dict(entry["config"])
            layer = InputLayer(batch_shape=c.get("batch_shape") or c.get("batch_input_shape"), dtype=c.get("dtype"),
                               name=lname)
            outputs[(lname, 0)] = layer._inbound_nodes[0].outputs
        else:
            layer = deserialize_layer(entry)
            pending.extend((layer, _normalize_node(n)) for n in entry.get("inbound_nodes", []))
        created[lname] = layer
        order.append(layer)
    node_counts: Dict[str, int] = {}
    while pending:
        progressed = False
        for item in list(pending):
            layer, node = item
            if not all((r[0], r[1]) in outputs for r in _refs_in(node)):
                continue
            args = _substitute(node.get("args", []), outputs)
            # explicit masks (Keras saves the masks it passed, e.g. mask=not_equal(ids, 0)) are kept
            kwargs = dict(_substitute(node.get("kwargs", {}), outputs))
            out = layer(*args, **kwargs)
            index = node_counts.get(layer.name, 0)
            node_counts[layer.name] = index + 1
            outputs[(layer.name, index)] = flatten(out)
            pending.remove(item)
            progressed = True
            break
        if not progressed:
            names = sorted({l.name for l, _ in pending})
            raise KerasConfigError(f"model config: the calls of layers {names} read tensors no layer produces")

    def pick(spec: Any) -> Any:
        if isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str) and isinstance(spec[1], int):
            return outputs[(spec[0], spec[1])][spec[2]]
        if isinstance(spec, dict):
            return {k: pick(v) for k, v in spec.items()}
        return [pick(s) for s in spec]

    ins, outs = pick(config["input_layers"]), pick(config["output_layers"])
    model = Functional(ins, outs, name=config.get("name"), trainable=config.get("trainable", True))
    model._ordered_layers = order
    return model


def deserialize_model(config: Any) -> Any:
    from .models import Sequential

    if isinstance(config, list):  # Keras 2.2 Sequential: a bare list of layers
        config = {"class_name": "Sequential", "config": {"layers": config}}
    class_name = config.get("class_name")
    inner = config.get("config") or {}
    if class_name == "Sequential":
        layer_list = inner["layers"] if isinstance(inner, dict) else inner
        model = Sequential(name=inner.get("name") if isinstance(inner, dict) else None)
        for entry in layer_list:
            if entry["class_name"] == "InputLayer":
                c = entry["config"]
                model.add(InputLayer(batch_shape=c.get("batch_shape") or c.get("batch_input_shape"),
                                     dtype=c.get("dtype"), name=c.get("name")))
            else:
                model.add(deserialize_layer(entry))
        build = config.get("build_config") or {}
        if not model.built and build.get("input_shape"):
            model.build(tuple(build["input_shape"]))
        return model
    if class_name in ("Functional", "Model"):
        return _functional_from_config(inner)
    cls = (_load_context["custom_objects"] or {}).get(class_name) or custom_objects().get(
        config.get("registered_name") or "") or custom_objects().get(class_name)
    if cls is None:
        where = f" in {_load_context['file']}" if _load_context["file"] else ""
        raise KerasConfigError(f"model class {class_name!r}{where} is unknown; pass it in custom_objects")
    model = cls.from_config(inner) if hasattr(cls, "from_config") else cls(**inner)
    build = config.get("build_config") or {}
    if build.get("input_shape"):
        shape = build["input_shape"]
        model._maybe_build(KerasTensor(_placeholder(shape)))
        model.forward([_placeholder(shape)], training=False)
    return model


def _placeholder(shape: Sequence[Any]):
    from ...ir.graph import input_value
    from ...ir.types import TensorType

    return input_value(TensorType(tuple(shape), "float32"))


def model_from_json(text: str, custom_objects: Optional[Dict[str, Any]] = None) -> Any:
    with _loading(None, custom_objects, True):
        return deserialize_model(json.loads(text))


class _loading:
    def __init__(self, path: Optional[str], objects: Optional[Dict[str, Any]], safe_mode: bool):
        self.new = {"file": path, "custom_objects": objects, "safe_mode": safe_mode}

    def __enter__(self):
        self.old = dict(_load_context)
        _load_context.update(self.new)

    def __exit__(self, *exc):
        _load_context.update(self.old)


# --------------------------------------------------------------------------- weight groups

def _weight_key_order(layers: Sequence[Layer]) -> List[Tuple[str, Layer]]:
    counts: Dict[str, int] = {}
    out = []
    for layer in layers:
        base = K.snake_case(type(layer).__name__)
        n = counts.get(base, 0)
        counts[base] = n + 1
        out.append((base if n == 0 else f"{base}_{n}", layer))
    return out


def _own_weight_groups(layer: Layer) -> List[Tuple[str, List[Any]]]:
    """(sub-path, variables) pairs in the layout Keras 3 writes for this layer."""
    from .models import Model

    if isinstance(layer, Model):
        return [(f"layers/{key}/{sub}" if sub else f"layers/{key}", vs)
                for key, child in _weight_key_order(layer.layers) for sub, vs in _own_weight_groups(child)]
    if isinstance(layer, Bidirectional):
        return [(f"forward_layer/{p}", v) for p, v in _own_weight_groups(layer.forward_layer)] + \
               [(f"backward_layer/{p}", v) for p, v in _own_weight_groups(layer.backward_layer)]
    if isinstance(layer, TimeDistributed):
        return [(f"layer/{p}", v) for p, v in _own_weight_groups(layer.layer)]
    if isinstance(layer, RNNBase):
        return [("cell", list(layer._weights))]
    groups = [("", list(layer._weights))] if layer._weights else []
    for i, sub in enumerate(layer._layers_tracked):
        groups += [(f"{K.snake_case(type(sub).__name__)}/{p}".rstrip("/"), v) for p, v in _own_weight_groups(sub)]
    return groups


def _model_weight_groups(model: Any) -> List[Tuple[str, str, List[Any]]]:
    """(group path in the .h5, layer name, variables) for every layer with weights."""
    out = []
    for key, layer in _weight_key_order(model.layers):
        for sub, vs in _own_weight_groups(layer):
            if vs:
                out.append((f"layers/{key}/{sub}".rstrip("/") + "/vars", layer.name, vs))
    return out


def _read_weights_h5(model: Any, h5: Any, path: str) -> List[Tuple[Any, np.ndarray]]:
    pairs = []
    for group, lname, variables in _model_weight_groups(model):
        if group not in h5:
            raise KerasConfigError(f"{path}: no weights for layer {lname!r} (expected group {group!r})")
        g = h5[group]
        if len(g.keys()) != len(variables):
            raise KerasConfigError(f"{path}: layer {lname!r} has {len(variables)} weights, the file "
                                   f"{len(g.keys())}")
        for i, var in enumerate(variables):
            pairs.append((var, np.asarray(g[str(i)]), lname))
    return _checked(pairs, path)


def _checked(pairs: List[Tuple[Any, np.ndarray, str]], path: str) -> List[Tuple[Any, np.ndarray]]:
    for var, arr, lname in pairs:
        if tuple(arr.shape) != var.shape:
            raise KerasConfigError(f"{path}: layer {lname!r} weight {var.name!r} has shape {tuple(arr.shape)} in "
                                   f"the file, the model expects {var.shape}")
    return [(v, a) for v, a, _ in pairs]


def _assign_all(pairs: List[Tuple[Any, np.ndarray]]) -> None:
    for var, arr in pairs:
        var.assign(arr.astype(var.dtype, copy=False))


def _write_weights_h5(model: Any, h5: Any) -> None:
    h5.create_group("vars").attrs["name"] = model.name
    for group, lname, variables in _model_weight_groups(model):
        g = h5.require_group(group)
        g.parent.attrs["name"] = lname
        for i, var in enumerate(variables):
            g.create_dataset(str(i), data=var.numpy())


# --------------------------------------------------------------------------- legacy .h5

def _legacy_layer_weights(layer: Layer) -> List[Any]:
    """Trainable then non-trainable, as Keras' legacy writer orders them."""
    weights = layer.weights
    train = [w for w in weights if w.trainable and layer.trainable]
    return train + [w for w in weights if all(w is not t for t in train)]


def _read_legacy_weights(model: Any, h5: Any, path: str) -> List[Tuple[Any, np.ndarray]]:
    root = h5["model_weights"] if "model_weights" in h5 else h5
    pairs = []
    for layer in model.layers:
        variables = _legacy_layer_weights(layer)
        if not variables:
            continue
        if layer.name not in root:
            raise KerasConfigError(f"{path}: no weights for layer {layer.name!r}")
        g = root[layer.name]
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in g.attrs.get("weight_names", [])]
        if len(names) != len(variables):
            raise KerasConfigError(f"{path}: layer {layer.name!r} has {len(variables)} weights, the file "
                                   f"{len(names)}")
        pairs += [(var, np.asarray(g[n]), layer.name) for var, n in zip(variables, names)]
    return _checked(pairs, path)


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
            variables = _legacy_layer_weights(layer)
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
        _write_weights_h5(model, h5)
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
    with _loading(path, custom_objects, safe_mode):
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
                    pairs = _read_weights_h5(model, h5, path)
            except OSError as exc:
                raise KerasConfigError(f"{path}: model.weights.h5 cannot be read: {exc}") from None
            _assign_all(pairs)
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
                _assign_all(_read_legacy_weights(model, h5, path))
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
        _write_weights_h5(model, h5)


def load_weights(model: Any, filepath: Any, skip_mismatch: bool = False) -> None:
    import h5py

    path = os.fspath(filepath)
    if path.endswith(".keras"):
        with zipfile.ZipFile(path) as z, h5py.File(io.BytesIO(z.read("model.weights.h5")), "r") as h5:
            pairs = _read_weights_h5(model, h5, path)
    else:
        with h5py.File(path, "r") as h5:
            pairs = _read_weights_h5(model, h5, path) if "layers" in h5 else _read_legacy_weights(model, h5, path)
    _assign_all(pairs)
