"""Where a model's weights live in HDF5 files: ``model.weights.h5`` / ``.weights.h5`` (Keras 3) and legacy
``.h5`` files (Keras 3 and tf.keras 2 writers).

In ``model.weights.h5`` a layer's group is ``layers/<key>`` where the key is the snake_case class
name made unique in ``model.layers`` order (``conv2d``, ``conv2d_1``); recurrent layers keep their
variables under ``cell/``, Bidirectional under ``forward_layer/`` then ``backward_layer/``, nested
models under ``layers/``. Readers work on an ``h5_guard`` snapshot of the file: they check every weight's shape and dtype
against the model from the file's headers, then read, cast and return (variable, array) pairs;
``assign_all`` assigns them only once all are read, so a bad file leaves the model untouched.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from . import backend as K
from .layers.base import Layer
from .layers.recurrent import RNNBase
from .layers.wrappers import Bidirectional, TimeDistributed
from .h5_guard import H5Node, H5Snapshot
from .serialization import KerasConfigError


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


def has_weights(model: Any) -> bool:
    """Whether ``model`` has any weight a weights file would hold."""
    return bool(_model_weight_groups(model))


def read_weights_h5(model: Any, snap: H5Snapshot) -> List[Tuple[Any, np.ndarray]]:
    """(variable, array) for every weight of ``model`` in a Keras 3 weights file, all checked."""
    wanted = []
    for group, lname, variables in _model_weight_groups(model):
        g = snap.root.get(group)
        if g is None or g.kind != "group":
            raise KerasConfigError(f"{snap.name}: no weights for layer {lname!r} (expected group {group!r})")
        if len(g.keys()) != len(variables):
            raise KerasConfigError(f"{snap.name}: layer {lname!r} has {len(variables)} weights, the file "
                                   f"{len(g.keys())} (in {group!r})")
        for i, var in enumerate(variables):
            node = g.get(str(i))
            if node is None:
                raise KerasConfigError(f"{snap.name}: layer {lname!r} weight {var.name!r}: no dataset "
                                       f"{group}/{i} in the file")
            wanted.append((var, node, lname))
    return _checked(wanted, snap)


def _checked(wanted: List[Tuple[Any, H5Node, str]], snap: H5Snapshot) -> List[Tuple[Any, np.ndarray]]:
    """Shapes and dtypes checked against the variables, then the data read and cast (nothing assigned)."""
    for var, node, lname in wanted:
        label = f"layer {lname!r} weight {var.name!r}"
        if node.kind != "dataset":
            raise KerasConfigError(f"{snap.name}: {label}: {node.path!r} is a {node.kind}, not a dataset")
        if node.shape is None or tuple(node.shape) != tuple(var.shape):
            raise KerasConfigError(f"{snap.name}: {label} has shape {node.shape} in the file (dataset "
                                   f"{node.path!r}), the model expects {var.shape}")
        if node.dtype is None or node.dtype.kind not in "biuf":
            raise KerasConfigError(f"{snap.name}: {label}: dataset {node.path!r} has dtype "
                                   f"{node.dtype_text.replace('unsupported:', '')}; weights are numbers")
    arrays = snap.read([n for _, n, _ in wanted], [f"layer {l!r} weight {v.name!r}" for v, _, l in wanted])
    pairs = []
    for (var, node, lname), arr in zip(wanted, arrays):
        with np.errstate(all="ignore"):
            cast = np.array(arr, dtype=np.dtype(var.dtype), copy=True)
        if tuple(cast.shape) != tuple(var.shape):
            raise KerasConfigError(f"{snap.name}: layer {lname!r} weight {var.name!r} has shape {cast.shape} "
                                   f"in the file, the model expects {var.shape}")
        pairs.append((var, cast))
    return pairs


def assign_all(pairs: List[Tuple[Any, np.ndarray]]) -> None:
    """Assign arrays already read, checked and cast (so no assignment can fail halfway)."""
    for var, arr in pairs:
        var.assign(arr)


def write_weights_h5(model: Any, h5: Any) -> None:
    h5.create_group("vars").attrs["name"] = model.name
    for group, lname, variables in _model_weight_groups(model):
        g = h5.require_group(group)
        g.parent.attrs["name"] = lname
        for i, var in enumerate(variables):
            g.create_dataset(str(i), data=var.numpy())


# --------------------------------------------------------------------------- legacy .h5

def legacy_layer_weights(layer: Layer) -> List[Any]:
    """Trainable then non-trainable, as Keras' legacy writer orders them."""
    weights = layer.weights
    train = [w for w in weights if w.trainable and layer.trainable]
    return train + [w for w in weights if all(w is not t for t in train)]


def read_legacy_weights(model: Any, snap: H5Snapshot) -> List[Tuple[Any, np.ndarray]]:
    """(variable, array) for every weight of ``model`` in a legacy ``.h5`` file, all checked."""
    root = snap.root.get("model_weights") if "model_weights" in snap.root else snap.root
    if root is None or root.kind != "group":
        raise KerasConfigError(f"{snap.name}: 'model_weights' is not a group")
    wanted = []
    for layer in model.layers:
        variables = legacy_layer_weights(layer)
        if not variables:
            continue
        g = root.children.get(layer.name)
        if g is None or g.kind != "group":
            raise KerasConfigError(f"{snap.name}: no weights for layer {layer.name!r}")
        raw_names = g.attrs.get("weight_names", [])
        if isinstance(raw_names, (str, bytes)):
            raw_names = [raw_names]
        if not isinstance(raw_names, list) or not all(isinstance(n, (str, bytes)) for n in raw_names):
            raise KerasConfigError(f"{snap.name}: layer {layer.name!r}: attribute weight_names of {g.path!r} is "
                                   f"not a list of names")
        names = [n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in raw_names]
        if len(names) != len(variables):
            raise KerasConfigError(f"{snap.name}: layer {layer.name!r} has {len(variables)} weights, the file "
                                   f"{len(names)}")
        for var, n in zip(variables, names):
            node = g.get(n)
            if node is None:
                raise KerasConfigError(f"{snap.name}: layer {layer.name!r} weight {var.name!r}: the file names "
                                       f"dataset {n!r}, which {g.path!r} does not hold")
            wanted.append((var, node, layer.name))
    return _checked(wanted, snap)
