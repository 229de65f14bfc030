"""Models: ``Model`` (subclassing), ``Functional`` (``Model(inputs, outputs)``) and ``Sequential``.

A functional model keeps the layer calls (nodes) recorded between its inputs and outputs and
replays them on fresh input Values whenever a graph is needed: once for inference, once for the
training step (dropout active, BatchNorm on batch statistics), and whenever the model itself is
called as a layer. A subclassed model runs its own ``call`` instead.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import GraphBuildError
from ...ir.graph import Value
from ...ir.types import TensorType
from . import backend as K
from .backend import KerasTensor, flatten, map_structure, to_value
from .layers.base import InputLayer, Layer, Node, registry
from .training import TrainingMixin


class Model(TrainingMixin, Layer):
    """Base of all models; subclass it and define ``call``, or call it as ``Model(inputs, outputs)``."""

    def __new__(cls, *args: Any, **kwargs: Any):
        if cls is Model and (args or "inputs" in kwargs):
            return object.__new__(Functional)
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any):
        trainable = kwargs.pop("trainable", True)
        name = kwargs.pop("name", None)
        Layer.__init__(self, trainable=trainable, name=name or K.unique_name(K.snake_case(type(self).__name__)))
        TrainingMixin.__init__(self)

    # -- structure
    @property
    def layers(self) -> List[Layer]:
        return list(self._layers_tracked)

    def get_layer(self, name: Optional[str] = None, index: Optional[int] = None) -> Layer:
        if index is not None:
            return self.layers[index]
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise ValueError(f"no layer named {name!r} in model {self.name!r}; layers: "
                         f"{', '.join(l.name for l in self.layers)}")

    @property
    def output_names(self) -> List[str]:
        return [f"output_{i}" if i else "output" for i in range(max(1, len(getattr(self, "outputs", []) or [])))]

    # -- graphs for training and inference
    def input_types(self, arrays: Sequence[np.ndarray]) -> List[TensorType]:
        """The symbolic input types: declared inputs, or (subclassed, deferred) taken from data."""
        inputs = getattr(self, "inputs", None)
        if inputs:
            return [t.value.type.with_shape((None,) + tuple(t.shape[1:])) for t in inputs]
        return [TensorType((None,) + tuple(a.shape[1:]), _data_dtype(a)) for a in arrays]

    def forward(self, values: Sequence[Value], training: bool) -> List[Value]:
        """Output Values of the model on input Values, in the scope's mode (training or inference)."""
        return self.forward_with_masks(values, training)[0]

    def forward_with_masks(self, values: Sequence[Value], training: bool
                           ) -> Tuple[List[Value], List[Optional[Value]]]:
        """The outputs and their Keras masks (None where an output has none; losses honour them)."""
        structure = values[0] if len(values) == 1 else list(values)
        with K.inside_call():
            out = self._run((map_structure(KerasTensor, structure),), {"training": training})
        leaves = flatten(out)
        return [to_value(o) for o in leaves], [K.get_mask(o) for o in leaves]

    def build(self, input_shape: Any) -> None:
        self.built = True

    def summary(self, line_length: Optional[int] = None, positions: Any = None, print_fn: Any = None,
                expand_nested: bool = False, show_trainable: bool = False, layer_range: Any = None) -> None:
        from .summary import print_summary

        print_summary(self, line_length=line_length, print_fn=print_fn, show_trainable=show_trainable)

    def get_config(self) -> Dict[str, Any]:
        return {"name": self.name, "trainable": self.trainable}

    # -- saving (implemented in saving.py)
    def save(self, filepath: str, overwrite: bool = True, **kwargs: Any) -> None:
        from .saving import save_model

        save_model(self, filepath, overwrite=overwrite, **kwargs)

    def save_weights(self, filepath: str, overwrite: bool = True) -> None:
        from .saving import save_weights

        save_weights(self, filepath)

    def load_weights(self, filepath: str, skip_mismatch: bool = False, **kwargs: Any) -> None:
        """Keras 3's ``load_weights``: ``skip_mismatch``, and ``by_name`` for legacy ``.h5`` files."""
        from .saving import load_weights

        by_name = kwargs.pop("by_name", None)
        if kwargs:
            raise ValueError(f"Invalid keyword arguments: {kwargs}")
        load_weights(self, filepath, skip_mismatch=skip_mismatch, by_name=by_name)

    def to_json(self, **kwargs: Any) -> str:
        import json

        from .model_config import serialize_model

        return json.dumps(serialize_model(self), **kwargs)


def _data_dtype(a: np.ndarray) -> str:
    arr = np.asarray(a)
    if arr.dtype.kind == "f":
        return "float32" if arr.dtype == np.float64 else arr.dtype.name
    if arr.dtype.kind in "iu":
        return arr.dtype.name
    if arr.dtype.kind == "b":
        return "bool"
    return "float32"


def _collect_nodes(inputs: Sequence[KerasTensor], outputs: Sequence[KerasTensor]) -> List[Node]:
    """Recorded layer calls from ``inputs`` to ``outputs``, inputs before their users."""
    stop = {id(t) for t in inputs}
    order: List[Node] = []
    seen: set = set()

    def visit(t: Any) -> None:
        if not isinstance(t, KerasTensor) or id(t) in stop:
            return
        if t._keras_history is None:
            raise GraphBuildError(f"{t!r} is not the output of a layer call; build functional models from "
                                  "keras.Input and layer calls")
        layer, ni, _ = t._keras_history
        node = layer._inbound_nodes[ni]
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(layer, InputLayer):
            raise GraphBuildError(f"model input {layer.name!r} is needed to compute the outputs but is not "
                                  "among the model's inputs")
        for parent in node.input_tensors:
            visit(parent)
        order.append(node)

    for t in outputs:
        visit(t)
    return order


@registry.register()
class Functional(Model):
    """A model defined by a graph of layer calls from ``inputs`` to ``outputs``."""

    def __init__(self, inputs: Any, outputs: Any, name: Optional[str] = None, trainable: bool = True, **kwargs: Any):
        Model.__init__(self, name=name or K.unique_name("functional"), trainable=trainable)
        self._init_graph(inputs, outputs)

    def _init_graph(self, inputs: Any, outputs: Any) -> None:
        self._input_struct = inputs
        self._output_struct = outputs
        self.inputs = [_as_model_tensor(t) for t in flatten(inputs)]
        self.outputs = [_as_model_tensor(t) for t in flatten(outputs)]
        self._nodes = _collect_nodes(self.inputs, self.outputs)
        ordered: List[Layer] = [t._keras_history[0] for t in self.inputs]
        for node in self._nodes:
            if all(node.layer is not l for l in ordered):
                ordered.append(node.layer)
        self._ordered_layers = ordered
        object.__setattr__(self, "_layers_tracked", [l for l in ordered if not isinstance(l, InputLayer)])
        self.built = True

    @property
    def layers(self) -> List[Layer]:
        return list(self._ordered_layers)

    @property
    def output_names(self) -> List[str]:
        if isinstance(self._output_struct, dict):
            return list(self._output_struct)
        return [t._keras_history[0].name for t in self.outputs]

    @property
    def input_names(self) -> List[str]:
        return [t._keras_history[0].name for t in self.inputs]

    def call(self, inputs: Any, training: Any = None, mask: Any = None) -> Any:
        leaves = flatten(inputs)
        values = [to_value(v) for v in leaves]
        if len(values) != len(self.inputs):
            raise GraphBuildError(f"model {self.name!r} takes {len(self.inputs)} inputs, got {len(values)}")
        masks = flatten(mask) if mask is not None else [K.get_mask(v) for v in leaves]
        if len(masks) != len(values):
            masks = [None] * len(values)
        memo: Dict[int, Any] = {id(t): KerasTensor(v, mask=None if m is None else to_value(m))
                                for t, v, m in zip(self.inputs, values, masks)}

        def substitute(x: Any) -> Any:
            return memo.get(id(x), x) if isinstance(x, KerasTensor) else x

        for node in self._nodes:
            kwargs = map_structure(substitute, node.kwargs)
            # as in Keras, the model's mode wins over one recorded in the call (saved files record False)
            if training is not None or kwargs.get("training") is None:
                kwargs["training"] = training
            outs = flatten(node.layer._run(map_structure(substitute, node.args), kwargs))
            for old, new in zip(node.outputs, outs):
                memo[id(old)] = new
        results = [memo[id(t)] for t in self.outputs]
        if isinstance(self._output_struct, (list, tuple)):
            return results
        if isinstance(self._output_struct, dict):
            return dict(zip(self._output_struct, results))
        return results[0]

    def get_config(self) -> Dict[str, Any]:
        from .model_config import functional_config

        return functional_config(self)


def _as_model_tensor(t: Any) -> KerasTensor:
    if isinstance(t, KerasTensor):
        return t
    raise GraphBuildError(f"model inputs and outputs must be Keras tensors (from keras.Input and layer calls), "
                          f"got {type(t).__name__}")


@registry.register()
class Sequential(Functional):
    """A stack of layers, each called on the previous one's output; built at once when its input
    shape is known (``keras.Input`` first, or ``input_shape=`` on the first layer), else on first use."""

    def __init__(self, layers: Optional[Sequence[Any]] = None, name: Optional[str] = None, trainable: bool = True,
                 **kwargs: Any):
        Model.__init__(self, name=name or K.unique_name("sequential"), trainable=trainable)
        self._stack: List[Layer] = []
        self._input_layer: Optional[InputLayer] = None
        self.built = False
        self.inputs, self.outputs = [], []
        for layer in layers or ():
            self.add(layer)

    @property
    def layers(self) -> List[Layer]:
        return list(self._stack)

    def add(self, layer: Any) -> None:
        if isinstance(layer, KerasTensor) and layer._keras_history and isinstance(layer._keras_history[0], InputLayer):
            layer = layer._keras_history[0]
        if isinstance(layer, InputLayer):
            if self._stack or self._input_layer is not None:
                raise GraphBuildError(f"Sequential {self.name!r}: an Input can only come first")
            self._input_layer = layer
            return
        if not isinstance(layer, Layer):
            raise GraphBuildError(f"Sequential {self.name!r}: can only add layers, got {type(layer).__name__}")
        self._stack.append(layer)
        object.__setattr__(self, "_layers_tracked", list(self._stack))
        if self._input_layer is None and len(self._stack) == 1 and layer._batch_input_shape is not None:
            self._input_layer = InputLayer(batch_shape=layer._batch_input_shape, dtype=layer.dtype
                                           if layer.dtype != "float32" else None)
        if self._input_layer is not None:
            if self.built and self.outputs:
                with _recording():
                    out = layer(self.outputs[0])
                self._init_graph(self.inputs[0], out)
            else:
                self._build_graph()

    def pop(self) -> Layer:
        layer = self._stack.pop()
        object.__setattr__(self, "_layers_tracked", list(self._stack))
        if self._input_layer is not None:
            self._build_graph()
        return layer

    def _build_graph(self) -> None:
        x = self._input_layer._inbound_nodes[0].outputs[0]
        with _recording():
            for layer in self._stack:
                x = layer(x)
        self._init_graph(self._input_layer._inbound_nodes[0].outputs[0], x)

    def build(self, input_shape: Any = None, dtype: Any = None) -> None:
        if self._input_layer is None:
            if input_shape is None:
                raise GraphBuildError(f"Sequential {self.name!r} needs an input shape to build")
            self._input_layer = InputLayer(batch_shape=tuple(input_shape), dtype=dtype)
        self._build_graph()

    def _maybe_build(self, inputs: Any) -> None:
        if not self.built:
            v = to_value(flatten(inputs)[0])
            self.build((None,) + tuple(v.shape[1:]), dtype=v.dtype.name)

    def ensure_built(self, arrays: Sequence[np.ndarray]) -> None:
        if not self.built:
            a = np.asarray(arrays[0])
            self.build((None,) + a.shape[1:], dtype=_data_dtype(a))

    def get_config(self) -> Dict[str, Any]:
        from .model_config import sequential_config

        return sequential_config(self)


class _recording:
    """Record layer calls even when called from inside another call (building a Sequential lazily)."""

    def __enter__(self):
        self._token = K._call_depth.set(0)

    def __exit__(self, *exc):
        K._call_depth.reset(self._token)


def clone_model(model: Model) -> Model:
    """A new model of the same architecture with freshly initialized weights."""
    from .model_config import deserialize_model, serialize_model

    return deserialize_model(serialize_model(model))
