"""Model configs: layers and models <-> the JSON-ready dicts of ``config.json`` and legacy ``.h5`` files.

Writing covers Sequential, functional (with their call graph) and custom models; reading also
accepts the node and tensor forms of Keras 2 and tf.keras 2. Reading takes its settings from the
innermost ``loading`` (by default: no file, no custom objects, safe mode): the file named in errors,
the user's ``custom_objects``, and ``safe_mode``, since Lambda layers hold Python bytecode and are
rebuilt only with ``safe_mode=False``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from .backend import KerasTensor, flatten
from .layers.base import InputLayer, Layer, registry
from .layers.core import Lambda
from .layers.operations import KerasOperation, is_operation_entry
from .serialization import KerasConfigError, custom_objects


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


class loading:
    """Within it, ``deserialize_*`` name ``path`` in errors, know ``objects`` (the user's custom_objects)
    and rebuild Lambda code only when ``safe_mode`` is False; the previous settings come back after."""

    def __init__(self, path: Optional[str], objects: Optional[Dict[str, Any]], safe_mode: bool):
        self.new = {"file": path, "custom_objects": objects, "safe_mode": safe_mode}

    def __enter__(self):
        self.old = dict(_load_context)
        _load_context.update(self.new)

    def __exit__(self, *exc):
        _load_context.update(self.old)
