"""Where a model's weights live in HDF5 files: ``model.weights.h5`` / ``.weights.h5`` (Keras 3) and legacy
``.h5`` files (Keras 3 and tf.keras 2 writers).

In ``model.weights.h5`` a layer's group is ``layers/<key>`` where the key is the snake_case class
name made unique in ``model.layers`` order (``conv2d``, ``conv2d_1``); recurrent layers keep their
variables under ``cell/``, Bidirectional under ``forward_layer/`` then ``backward_layer/``, nested
models under ``layers/``. Readers check every weight's shape and return (variable, array) pairs;
``assign_all`` assigns them only once all are read, so a bad file leaves the model untouched.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from . import backend as K
from .layers.base import Layer
from .layers.recurrent import RNNBase
from .layers.wrappers import Bidirectional, TimeDistributed
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


def read_weights_h5(model: Any, h5: Any, path: str) -> List[Tuple[Any, np.ndarray]]:
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


def assign_all(pairs: List[Tuple[Any, np.ndarray]]) -> None:
    for var, arr in pairs:
        var.assign(arr.astype(var.dtype, copy=False))


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


def read_legacy_weights(model: Any, h5: Any, path: str) -> List[Tuple[Any, np.ndarray]]:
    root = h5["model_weights"] if "model_weights" in h5 else h5
    pairs = []
    for layer in model.layers:
        variables = legacy_layer_weights(layer)
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

