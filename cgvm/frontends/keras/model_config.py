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


_load_context: Dict[str, Any] = {"safe_mode": True, "custom_objects": None, "file": None, "at": []}


def _where() -> str:
    """Where the config being read is: the file and the layer / call under way (for error messages)."""
    parts = ([f"in {_load_context['file']}"] if _load_context["file"] else []) + list(_load_context["at"])
    return (" " + ", ".join(parts)) if parts else ""


class _at:
    """Within it, errors say they are about ``what`` (a layer, a call, a config key)."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self) -> None:
        _load_context["at"].append(self.what)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is None:  # on errors the stack stays, so the top-level handler can say where it was
            _load_context["at"].pop()


def _expect(value: Any, types: Any, what: str) -> Any:
    """``value`` if it is of ``types`` (bools are not ints), else a KerasConfigError naming ``what``."""
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in (
        types if isinstance(types, tuple) else (types,)))
    if not ok:
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise KerasConfigError(f"{what} should be {names}, got {type(value).__name__} {_short(value)}{_where()}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _shape_list(value: Any, what: str) -> Optional[List[Optional[int]]]:
    if value is None:
        return None
    _expect(value, (list, tuple), what)
    for d in value:
        if d is not None:
            _expect(d, int, f"{what} item")
            if d < 0:
                raise KerasConfigError(f"{what} {_short(value)} has a negative size{_where()}")
    return list(value)


def deserialize_layer(config: Dict[str, Any]) -> Layer:
    _expect(config, dict, "a layer entry")
    class_name = _expect(config.get("class_name"), str, "a layer's class_name")
    registered = _expect(config.get("registered_name"), (str, type(None)), "a layer's registered_name")
    layer_config = dict(_expect(config.get("config") or {}, dict, f"the config of a {class_name}"))
    if class_name in ("Functional", "Model", "Sequential") or registered in ("Functional", "Model", "Sequential"):
        return deserialize_model(config)
    name = _expect(layer_config.get("name", "?"), str, f"the name of a {class_name}")
    where = f" in {_load_context['file']}" if _load_context["file"] else ""
    try:
        cls = _layer_class(class_name if class_name in registry.classes else registered or class_name,
                           _load_context["custom_objects"])
    except KerasConfigError:
        raise KerasConfigError(f"layer {name!r}{where} has the unknown type {class_name!r}; "
                               "pass it in custom_objects or register it with register_keras_serializable") from None
    with _at(f"layer {_short(name)} ({class_name})"):
        if cls is Lambda:
            return Lambda.from_config(layer_config, safe_mode=_load_context["safe_mode"])
        return cls.from_config(layer_config)


def _ref_from(obj: Any) -> Optional[Tuple[str, int, int]]:
    if isinstance(obj, dict) and obj.get("class_name") == "__keras_tensor__":
        cfg = _expect(obj.get("config"), dict, "a __keras_tensor__ config")
        return _history(cfg.get("keras_history"), "a keras_history")
    return None


def _history(h: Any, what: str) -> Tuple[str, int, int]:
    """A ``[layer name, node index, tensor index]`` reference, checked."""
    _expect(h, (list, tuple), what)
    if len(h) < 3:
        raise KerasConfigError(f"{what} should be [layer name, node index, tensor index], got {_short(h)}{_where()}")
    name = _expect(h[0], str, f"{what}'s layer name")
    ni, ti = _expect(h[1], int, f"{what}'s node index"), _expect(h[2], int, f"{what}'s tensor index")
    if ni < 0 or ti < 0:
        raise KerasConfigError(f"{what} {_short(h)} has a negative index{_where()}")
    return (name, ni, ti)


def _tensor_at(outputs: Dict[Tuple[str, int], List[KerasTensor]], ref: Tuple[str, int, int], what: str) -> Any:
    tensors = outputs.get((ref[0], ref[1]))
    if tensors is None:
        raise KerasConfigError(f"{what} reads node {ref[1]} of layer {ref[0]!r}, which no layer entry "
                               f"produces{_where()}")
    if ref[2] >= len(tensors):
        raise KerasConfigError(f"{what} reads output {ref[2]} of layer {ref[0]!r} (node {ref[1]}), which has "
                               f"{len(tensors)}{_where()}")
    return tensors[ref[2]]


def _substitute(obj: Any, outputs: Dict[Tuple[str, int], List[KerasTensor]]) -> Any:
    ref = _ref_from(obj)
    if ref is not None:
        return _tensor_at(outputs, ref, "a layer call")
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
        _expect(node.get("args", []), list, "a node's args")
        _expect(node.get("kwargs", {}), dict, "a node's kwargs")
        return node
    _expect(node, list, "an inbound node")
    refs = []
    kwargs: Dict[str, Any] = {}
    for item in node:
        name, ni, ti = _history(item, "an inbound node's tensor")
        if len(item) > 3 and item[3]:
            kwargs.update(_expect(item[3], dict, "an inbound node's kwargs"))
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
    _expect(config, dict, "a functional model's config")
    for k, entry in enumerate(_expect(config.get("layers"), list, "a functional model's layers")):
        _expect(entry, dict, f"layers[{k}]")
        _expect(entry.get("class_name"), str, f"layers[{k}].class_name")
        lname = entry.get("name") or _expect(entry.get("config") or {}, dict, f"layers[{k}].config").get("name")
        _expect(lname, str, f"layers[{k}]'s name")
        if lname in created:
            raise KerasConfigError(f"two layers are named {lname!r}{_where()}")
        nodes = _expect(entry.get("inbound_nodes", []), list, f"layer {lname!r}'s inbound_nodes")
        if is_operation_entry(entry):  # e.g. the not_equal(ids, 0) mask of an Embedding(mask_zero=True)
            layer = KerasOperation(entry["class_name"], dict(entry.get("config") or {}, name=lname),
                                   module=entry.get("module") or "keras.src.ops.numpy")
            pending.extend((layer, _normalize_node(n)) for n in nodes)
        elif entry["class_name"] == "InputLayer":
            layer = _input_layer(entry, lname)
            outputs[(lname, 0)] = layer._inbound_nodes[0].outputs
        else:
            layer = deserialize_layer(entry)
            pending.extend((layer, _normalize_node(n)) for n in nodes)
        created[lname] = layer
        order.append(layer)
    node_counts: Dict[str, int] = {}
    while pending:
        progressed = False
        for item in list(pending):
            layer, node = item
            if not all((r[0], r[1]) in outputs for r in _refs_in(node)):
                continue
            with _at(f"the call of layer {layer.name!r}"):
                args = _substitute(node.get("args", []), outputs)
                # explicit masks (Keras saves the masks it passed, e.g. mask=not_equal(ids, 0)) are kept
                kwargs = dict(_substitute(node.get("kwargs", {}), outputs))
                if not all(isinstance(k, str) and k.isidentifier() for k in kwargs):
                    raise KerasConfigError(f"a call's kwargs have a key that is not a name{_where()}")
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

    def pick(spec: Any, what: str) -> Any:
        if isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str):
            return _tensor_at(outputs, _history(spec, what), what)
        if isinstance(spec, dict):
            return {k: pick(v, f"{what}[{k!r}]") for k, v in spec.items()}
        if isinstance(spec, list) and spec:
            return [pick(s, f"{what}[{i}]") for i, s in enumerate(spec)]
        raise KerasConfigError(f"{what} should be [layer name, node index, tensor index] or a list or dict of "
                               f"them, got {_short(spec)}{_where()}")

    ins, outs = pick(config.get("input_layers"), "input_layers"), pick(config.get("output_layers"), "output_layers")
    _expect(config.get("name"), (str, type(None)), "a model's name")
    _expect(config.get("trainable", True), bool, "a model's trainable")
    model = Functional(ins, outs, name=config.get("name"), trainable=config.get("trainable", True))
    model._ordered_layers = order
    return model


def _input_layer(entry: Dict[str, Any], name: Optional[str]) -> InputLayer:
    c = _expect(entry.get("config"), dict, "an InputLayer's config")
    shape = _shape_list(c.get("batch_shape") or c.get("batch_input_shape"), f"InputLayer {name!r}'s batch_shape")
    if shape is None:
        raise KerasConfigError(f"InputLayer {name!r} has no batch_shape{_where()}")
    _expect(name, (str, type(None)), "an InputLayer's name")
    with _at(f"InputLayer {_short(name)}"):
        return InputLayer(batch_shape=shape, dtype=c.get("dtype"), name=name)


def deserialize_model(config: Any) -> Any:
    from .models import Sequential

    if isinstance(config, list):  # Keras 2.2 Sequential: a bare list of layers
        config = {"class_name": "Sequential", "config": {"layers": config}}
    _expect(config, dict, "a model config")
    class_name = _expect(config.get("class_name"), str, "a model's class_name")
    inner = config.get("config") or {}
    build = _expect(config.get("build_config") or {}, dict, "a model's build_config")
    if class_name == "Sequential":
        _expect(inner, (dict, list), "a Sequential model's config")
        layer_list = _expect(inner.get("layers") if isinstance(inner, dict) else inner, list,
                             "a Sequential model's layers")
        name = _expect(inner.get("name") if isinstance(inner, dict) else None, (str, type(None)), "a model's name")
        model = Sequential(name=name)
        for k, entry in enumerate(layer_list):
            _expect(entry, dict, f"layers[{k}]")
            if entry.get("class_name") == "InputLayer":
                model.add(_input_layer(entry, (entry.get("config") or {}).get("name")))
            else:
                layer = deserialize_layer(entry)
                with _at(f"adding layer {layer.name!r}"):
                    model.add(layer)
        shape = _shape_list(build.get("input_shape"), "build_config.input_shape")
        if not model.built and shape:
            with _at("building the model"):
                model.build(tuple(shape))
        return model
    if class_name in ("Functional", "Model"):
        return _functional_from_config(inner)
    registered = _expect(config.get("registered_name"), (str, type(None)), "a model's registered_name")
    cls = (_load_context["custom_objects"] or {}).get(class_name) or custom_objects().get(
        registered or "") or custom_objects().get(class_name)
    if cls is None:
        where = f" in {_load_context['file']}" if _load_context["file"] else ""
        raise KerasConfigError(f"model class {class_name!r}{where} is unknown; pass it in custom_objects")
    _expect(inner, dict, f"the config of model class {class_name!r}")
    with _at(f"model {class_name!r}"):
        model = cls.from_config(inner) if hasattr(cls, "from_config") else cls(**inner)
        shape = _shape_list(build.get("input_shape"), "build_config.input_shape")
        if shape:
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
        self.new = {"file": path, "custom_objects": objects, "safe_mode": safe_mode, "at": []}

    def __enter__(self):
        self.old = dict(_load_context)
        _load_context.update(self.new)

    def __exit__(self, *exc):
        _load_context.update(self.old)
