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


def read_weights_h5(model: Any, snap: H5Snapshot, skip_mismatch: bool = False) -> List[Tuple[Any, np.ndarray]]:
    """(variable, array) for every weight of ``model`` in a Keras 3 weights file, all checked.

    ``skip_mismatch`` leaves, with a warning, a layer whose group is missing or holds other counts
    or shapes than the layer's weights (Keras skips the object whose variables fail to load)."""
    wanted = []
    for group, lname, variables in _model_weight_groups(model):
        g = snap.root.get(group)
        if g is None or g.kind != "group":
            problem = f"no weights for layer {lname!r} (expected group {group!r})"
        elif len(g.keys()) != len(variables):
            problem = f"layer {lname!r} has {len(variables)} weights, the file {len(g.keys())} (in {group!r})"
        else:
            problem = ""
            nodes = []
            for i, var in enumerate(variables):
                node = g.get(str(i))
                if node is None:
                    problem = f"layer {lname!r} weight {var.name!r}: no dataset {group}/{i} in the file"
                    break
                if skip_mismatch and node.shape is not None and tuple(node.shape) != tuple(var.shape):
                    problem = (f"layer {lname!r} weight {var.name!r} has shape {tuple(node.shape)} in the file, "
                               f"the model expects {tuple(var.shape)}")
                    break
                nodes.append((var, node, lname))
        if problem and skip_mismatch:
            _skipped(problem)
            continue
        if problem:
            raise KerasConfigError(f"{snap.name}: {problem}")
        wanted += nodes
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


def _names_attr(g: H5Node, attr: str, snap: H5Snapshot, what: str) -> List[str]:
    """A list-of-names attribute, whole or in the chunks (``attr0``, ``attr1``, ...) Keras writes when it is large."""
    if attr in g.attrs:
        raw = g.attrs[attr]
    else:
        raw, k = [], 0
        while f"{attr}{k}" in g.attrs:
            chunk = g.attrs[f"{attr}{k}"]
            raw += chunk if isinstance(chunk, list) else [chunk]
            k += 1
    if isinstance(raw, (str, bytes)):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(n, (str, bytes)) for n in raw):
        raise KerasConfigError(f"{snap.name}: {what}: attribute {attr} of {g.path!r} is not a list of names")
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in raw]


def _skipped(message: str) -> None:
    import warnings

    warnings.warn(f"Skipping loading of weights: {message}", stacklevel=4)


def read_legacy_weights(model: Any, snap: H5Snapshot, *, by_name: bool = False,
                        skip_mismatch: bool = False) -> List[Tuple[Any, np.ndarray]]:
    """(variable, array) for the weights of ``model`` in a legacy ``.h5`` file, all checked.

    As Keras does: the file's layers with weights (in its ``layer_names`` order) go to the model's
    layers with weights in order, whatever their names, and their counts must agree; with
    ``by_name`` each saved layer goes to the model's layers of that name and the rest are left.
    ``skip_mismatch`` leaves (with a warning) a weight whose shape differs, and with ``by_name`` a
    layer whose weight count differs; everything else read is still assigned."""
    root = snap.root.get("model_weights") if "model_weights" in snap.root else snap.root
    if root is None or root.kind != "group":
        raise KerasConfigError(f"{snap.name}: 'model_weights' is not a group")
    saved = []
    for name in _names_attr(root, "layer_names", snap, "the saved layers"):
        g = root.children.get(name)
        if g is None or g.kind != "group":
            raise KerasConfigError(f"{snap.name}: layer_names lists {name!r}, which {root.path!r} holds no group for")
        weight_names = _names_attr(g, "weight_names", snap, f"layer {name!r}")
        if weight_names:
            saved.append((name, g, weight_names))
    with_weights = [layer for layer in model.layers if legacy_layer_weights(layer)]
    if by_name:
        pairs = [(layer, entry) for entry in saved for layer in with_weights if layer.name == entry[0]]
    else:
        if len(saved) != len(with_weights):
            raise KerasConfigError(f"{snap.name}: layer count mismatch: the model has {len(with_weights)} layers "
                                   f"with weights, the file {len(saved)} ({', '.join(n for n, _, _ in saved)})")
        pairs = list(zip(with_weights, saved))
    wanted = []
    for layer, (name, g, weight_names) in pairs:
        variables = legacy_layer_weights(layer)
        where = f"layer {layer.name!r}" + ("" if name == layer.name else f" (saved as {name!r})")
        if len(weight_names) != len(variables):
            if by_name and skip_mismatch:
                _skipped(f"{where} has {len(variables)} weights, the file {len(weight_names)}")
                continue
            raise KerasConfigError(f"{snap.name}: {where} has {len(variables)} weights, the file "
                                   f"{len(weight_names)}")
        for var, n in zip(variables, weight_names):
            node = g.get(n)
            if node is None:
                raise KerasConfigError(f"{snap.name}: {where} weight {var.name!r}: the file names "
                                       f"dataset {n!r}, which {g.path!r} does not hold")
            if skip_mismatch and node.kind == "dataset" and node.shape is not None \
                    and tuple(node.shape) != tuple(var.shape):
                _skipped(f"{where} weight {var.name!r} has shape {tuple(node.shape)} in the file, the model "
                         f"expects {tuple(var.shape)}")
                continue
            wanted.append((var, node, layer.name))
    return _checked(wanted, snap)
