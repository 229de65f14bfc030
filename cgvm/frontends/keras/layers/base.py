"""The Layer base class, InputLayer/Input, and the recorded layer calls (nodes) of functional models.

``Layer.__call__`` takes KerasTensors, cgvm Values or anything with ``__cgvm_value__`` (a
Theano-style variable, a Caffe blob's value), builds the layer's weights on first use, runs
``call`` on KerasTensor wrappers, and returns KerasTensors that wrap the output Values and expose
``__cgvm_value__``. Masks travel as in Keras 3: a KerasTensor's ``_keras_mask`` (a bool Value,
usually (batch, time)) is handed to ``call(mask=...)`` when ``call`` takes ``mask`` and the call has
one tensor argument, and layers that support masking set their outputs' masks from
``compute_mask(inputs, mask)`` (by default: the input mask, unchanged). At top level it also records a ``Node`` (inputs, kwargs, outputs) so that a
functional ``Model`` can replay the calls later in training or inference mode; called on NumPy
arrays it runs eagerly and returns arrays.
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ....errors import GraphBuildError
from ....ir.graph import Value, input_value, source_scope
from ....ir.types import DType, TensorType
from .. import backend as K
from .. import constraints as constraints_mod
from .. import initializers as initializers_mod
from .. import regularizers as regularizers_mod
from ..backend import KerasTensor, Variable, flatten, map_structure, to_value
from ..load_limits import reserve
from ..serialization import Registry

registry = Registry("layer")

# constructor arguments every Keras layer accepts and this frontend has no use for
_IGNORED_KWARGS = {"autocast", "input_dim", "input_length", "batch_size", "weights", "dynamic", "build_config",
                   "compile_config", "module", "registered_name", "shared_object_id", "synchronized",
                   "quantization_config", "lora_rank", "lora_alpha", "lora_enabled"}


class Node:
    """One recorded call of a layer: the argument structure with KerasTensor leaves, and the outputs."""

    def __init__(self, layer: "Layer", args: Tuple[Any, ...], kwargs: Dict[str, Any], outputs: List[KerasTensor]):
        self.layer = layer
        self.args = args
        self.kwargs = kwargs
        self.outputs = outputs

    @property
    def input_tensors(self) -> List[KerasTensor]:
        return [t for t in flatten([list(self.args), self.kwargs]) if isinstance(t, KerasTensor)]


class Layer:
    """Base of all layers. Subclasses define ``build(input_shape)`` (weights via ``add_weight``) and ``call``.

    ``supports_masking``: the layer passes a mask on to its outputs (through ``compute_mask``); a
    layer that overrides ``compute_mask`` supports masking without saying so, as in Keras.
    """

    supports_masking = False

    def __init__(self, trainable: bool = True, name: Optional[str] = None, dtype: Any = None, **kwargs: Any):
        self._layers_tracked: List[Layer] = []
        self._weights: List[Variable] = []
        self.built = False
        self.trainable = trainable
        self.name = name or K.unique_name(K.snake_case(type(self).__name__))
        self.dtype = _dtype_name(dtype)
        self._inbound_nodes: List[Node] = []
        self._batch_input_shape = None
        shape = kwargs.pop("input_shape", None)
        batch_shape = kwargs.pop("batch_input_shape", None) or kwargs.pop("batch_shape", None)
        if shape is not None:
            self._batch_input_shape = (None,) + tuple(shape)
        elif batch_shape is not None:
            self._batch_input_shape = tuple(batch_shape)
        if "input_dim" in kwargs and kwargs["input_dim"] is not None and shape is None:
            self._batch_input_shape = (None, int(kwargs["input_dim"]))
        self._extra_losses: List[Any] = []
        unknown = set(kwargs) - _IGNORED_KWARGS - {"activity_regularizer"}
        if unknown:
            raise TypeError(f"{type(self).__name__}: unexpected arguments {sorted(unknown)}")
        self.activity_regularizer = regularizers_mod.get(kwargs.get("activity_regularizer"))

    # -- attribute tracking: sub-layers assigned as attributes own weights too
    def __setattr__(self, key: str, value: Any) -> None:
        if key != "_layers_tracked" and hasattr(self, "_layers_tracked"):
            for item in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(item, Layer) and item is not self and all(item is not l for l in self._layers_tracked):
                    self._layers_tracked.append(item)
        object.__setattr__(self, key, value)

    # -- weights
    def add_weight(self, shape: Sequence[int] = (), initializer: Any = "glorot_uniform", dtype: Any = None,
                   trainable: bool = True, regularizer: Any = None, constraint: Any = None,
                   name: Optional[str] = None, **_: Any) -> Variable:
        init = initializers_mod.get(initializer if initializer is not None else "zeros")
        dtype = _dtype_name(dtype) if dtype is not None else self.dtype
        wname = name or f"variable_{len(self._weights)}"
        reserve(tuple(shape), dtype, f"layer {self.name!r} weight {wname!r}")  # before the initializer allocates
        shape = tuple(int(s) for s in shape)
        var = Variable(init(shape, dtype), name=wname, path=f"keras/{self.name}/{wname}", trainable=trainable,
                       regularizer=regularizers_mod.get(regularizer), constraint=constraints_mod.get(constraint))
        self._weights.append(var)
        return var

    @property
    def weights(self) -> List[Variable]:
        """Own weights in add_weight order, then those of sub-layers (Keras' ``layer.weights``)."""
        out = list(self._weights)
        for sub in self._layers_tracked:
            out.extend(w for w in sub.weights if all(w is not o for o in out))
        return out

    @property
    def trainable_weights(self) -> List[Variable]:
        if not self.trainable:
            return []
        own = [w for w in self._weights if w.trainable]
        for sub in self._layers_tracked:
            own.extend(w for w in sub.trainable_weights if all(w is not o for o in own))
        return own

    @property
    def non_trainable_weights(self) -> List[Variable]:
        trainable = self.trainable_weights
        return [w for w in self.weights if all(w is not t for t in trainable)]

    trainable_variables = trainable_weights
    variables = weights

    def get_weights(self) -> List[np.ndarray]:
        return [w.numpy() for w in self.weights]

    def set_weights(self, weights: Sequence[Any]) -> None:
        mine = self.weights
        if len(weights) != len(mine):
            raise ValueError(f"layer {self.name!r} has {len(mine)} weights, got {len(weights)} arrays")
        for var, arr in zip(mine, weights):
            if tuple(np.shape(arr)) != var.shape:
                raise ValueError(f"layer {self.name!r}: weight {var.name!r} has shape {var.shape}, "
                                 f"got an array of shape {tuple(np.shape(arr))}")
        for var, arr in zip(mine, weights):
            var.assign(arr)

    def count_params(self) -> int:
        return int(sum(int(np.prod(w.shape)) for w in self.weights))

    # -- building and calling
    def build(self, input_shape: Any) -> None:
        self.built = True

    def call(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        raise GraphBuildError(f"layer {self.name!r} ({type(self).__name__}) does not define call()")

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        """The mask of the outputs given the first input and its mask (Keras: the mask unchanged)."""
        return mask

    def _propagates_mask(self) -> bool:
        if "supports_masking" in vars(self) or type(self).supports_masking:
            return bool(self.supports_masking)
        return type(self).compute_mask is not Layer.compute_mask

    def add_loss(self, loss: Any) -> None:
        """A loss term (a tensor built in ``call``) added to the training loss."""
        K.current_scope().losses.append(to_value(loss))

    def _maybe_build(self, inputs: Any) -> None:
        if not self.built:
            shape = K.shape_of(inputs)
            with source_scope(f"keras layer {self.name!r} ({type(self).__name__})"):
                self.build(shape)
            self.built = True

    def _call_params(self) -> Sequence[str]:
        try:
            return tuple(inspect.signature(self.call).parameters)
        except (TypeError, ValueError):
            return ()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves = flatten([list(args), kwargs])
        if not any(K.is_symbolic(x) for x in leaves) and any(isinstance(x, np.ndarray) for x in leaves):
            return _call_eagerly(self, args, kwargs)
        record = K.recording()
        wrapped_args = map_structure(_as_tensor, args)
        wrapped_kwargs = map_structure(_as_tensor, kwargs)
        outputs = self._run(wrapped_args, wrapped_kwargs)
        if not record:
            return outputs
        node_index = len(self._inbound_nodes)
        outs = flatten(outputs)
        for i, t in enumerate(outs):
            t._keras_history = (self, node_index, i)
        self._inbound_nodes.append(Node(self, tuple(args), dict(kwargs), outs))
        return outputs

    def _run(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        """Build if needed and run ``call`` on KerasTensors; returns fresh KerasTensors (no history)
        carrying the output masks."""
        if not args:
            raise GraphBuildError(f"layer {self.name!r} called without inputs")
        self._maybe_build(args[0])
        params = self._call_params()
        kwargs = dict(kwargs)
        if "training" in params:
            if kwargs.get("training") is None:
                kwargs["training"] = K.current_scope().training
        else:
            kwargs.pop("training", None)
        previous_mask = _fill_mask_argument(args, kwargs, "mask" in params)
        if "mask" not in params:
            kwargs.pop("mask", None)
        with K.inside_call(), source_scope(f"keras layer {self.name!r} ({type(self).__name__})"):
            out = self.call(*args, **kwargs)
            if self.activity_regularizer is not None:
                for o in flatten(out):
                    K.current_scope().losses.append(
                        _divide_by_batch(self.activity_regularizer(o), to_value(o)))
            result = map_structure(lambda o: KerasTensor(to_value(o), mask=K.get_mask(o)), out)
            if self._propagates_mask():
                _set_output_masks(result, self.compute_mask(args[0], previous_mask))
        return result

    # -- introspection of recorded calls
    def _node_tensor(self, which: str, index: int = 0) -> Any:
        if not self._inbound_nodes:
            raise AttributeError(f"layer {self.name!r} has never been called, so it has no {which}")
        node = self._inbound_nodes[index]
        items = node.input_tensors if which == "input" else node.outputs
        return items[0] if len(items) == 1 else items

    @property
    def input(self) -> Any:
        return self._node_tensor("input")

    @property
    def output(self) -> Any:
        return self._node_tensor("output")

    @property
    def output_shape(self) -> Any:
        out = self.output
        return [o.shape for o in out] if isinstance(out, list) else out.shape

    @property
    def input_shape(self) -> Any:
        inp = self.input
        return [i.shape for i in inp] if isinstance(inp, list) else inp.shape

    # -- config
    def get_config(self) -> Dict[str, Any]:
        config: Dict[str, Any] = {"name": self.name, "trainable": self.trainable, "dtype": self.dtype}
        if self._batch_input_shape is not None:
            config["batch_input_shape"] = list(self._batch_input_shape)
        return config

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "Layer":
        return cls(**config)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name}, built={self.built}>"


def _dtype_name(dtype: Any) -> str:
    """A dtype name from a string, a NumPy dtype or a Keras 3 DTypePolicy dict."""
    if dtype is None:
        return K.floatx()
    if isinstance(dtype, dict):
        config = dtype.get("config", {})
        dtype = config.get("name", K.floatx())
    if isinstance(dtype, str) and dtype.startswith("mixed_"):
        return K.floatx()
    return DType(dtype).name


def _divide_by_batch(term: Value, like: Value) -> Value:
    """Keras divides activity-regularization terms by the batch size."""
    from ....ops import elementwise as ew
    from ....ops import shape as shp
    from ....ops import indexing

    batch = indexing.slice(shp.shape_of(like), starts=[0], stops=[1])
    return ew.div(term, ew.cast(shp.squeeze(batch, axis=[0]), dtype=term.dtype))


def _fill_mask_argument(args: Tuple[Any, ...], kwargs: Dict[str, Any], takes_mask: bool) -> Any:
    """Put the input's mask into ``kwargs["mask"]`` as Keras does (only when ``call`` takes ``mask``,
    none was given and the call has exactly one tensor argument); returns the mask the outputs
    inherit: the given or filled-in one, else that of the first argument."""
    if takes_mask and kwargs.get("mask") is None:
        tensor_args = [a for a in list(args) + [v for k, v in kwargs.items() if k not in ("mask", "training")]
                       if any(K.is_symbolic(leaf) for leaf in flatten(a))]
        if len(tensor_args) == 1:
            found = map_structure(K.get_mask, tensor_args[0])
            if any(m is not None for m in flatten(found)):
                kwargs["mask"] = found
    if kwargs.get("mask") is not None:
        return kwargs["mask"]
    return map_structure(K.get_mask, args[0])


def _set_output_masks(outputs: Any, masks: Any) -> None:
    """Attach ``masks`` (one, or a structure matching the outputs) to outputs that have none yet."""
    if masks is None:
        return
    flat_out = flatten(outputs)
    if all(t._keras_mask is not None for t in flat_out):
        return
    flat_masks = flatten(masks) if isinstance(masks, (list, tuple, dict)) else [masks]
    for t, m in zip(flat_out, flat_masks):
        if t._keras_mask is None and m is not None:
            t._keras_mask = to_value(m)


def _as_tensor(x: Any) -> Any:
    if isinstance(x, KerasTensor):
        return x
    if isinstance(x, Value) or hasattr(x, "__cgvm_value__"):
        return KerasTensor(to_value(x))
    return x


def _call_eagerly(layer: Layer, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """``layer(ndarray)``: build a one-off graph over input Values, run it, return arrays."""
    from ....compiled import compile as cg_compile

    arrays: List[np.ndarray] = []
    inputs: List[Value] = []

    def placeholder(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            arr = np.asarray(x, dtype=K.floatx()) if x.dtype == np.float64 else x
            arrays.append(arr)
            v = input_value(TensorType(arr.shape, arr.dtype), f"eager{len(inputs)}")
            inputs.append(v)
            return KerasTensor(v)
        return x

    with K.inside_call():
        out = layer._run(map_structure(placeholder, args), map_structure(placeholder, kwargs))
    leaves = flatten(out)
    fn = cg_compile(inputs, [to_value(o) for o in leaves], workspace=K.get_workspace())
    results = iter(K.as_array(r) for r in fn(*arrays))
    return map_structure(lambda _: next(results), out)


# --------------------------------------------------------------------------- inputs

@registry.register()
class InputLayer(Layer):
    """The layer behind ``Input``: it only hands out its input Value."""

    def __init__(self, shape: Any = None, batch_size: Optional[int] = None, dtype: Any = None,
                 sparse: bool = False, name: Optional[str] = None, batch_shape: Any = None,
                 input_tensor: Any = None, **kwargs: Any):
        legacy = kwargs.pop("batch_input_shape", None) or kwargs.pop("input_shape", None)
        kwargs.pop("ragged", None)
        kwargs.pop("optional", None)
        super().__init__(name=name or K.unique_name("input_layer"), dtype=dtype, **kwargs)
        if batch_shape is None:
            batch_shape = legacy if legacy is not None else (batch_size,) + tuple(shape or ())
        self.batch_shape = tuple(None if d is None else int(d) for d in batch_shape)
        self.built = True
        if input_tensor is not None:
            value = to_value(input_tensor)
        else:
            value = input_value(TensorType(self.batch_shape, self.dtype), self.name)
        tensor = KerasTensor(value, history=(self, 0, 0), name=self.name)
        self._inbound_nodes.append(Node(self, (), {}, [tensor]))

    def call(self, inputs: Any) -> Any:
        return inputs

    def get_config(self) -> Dict[str, Any]:
        return {"batch_shape": list(self.batch_shape), "dtype": self.dtype, "sparse": False, "name": self.name}


def Input(shape: Any = None, batch_size: Optional[int] = None, dtype: Any = None, name: Optional[str] = None,
          batch_shape: Any = None, tensor: Any = None, **kwargs: Any) -> KerasTensor:
    """A symbolic model input of shape ``(batch_size, *shape)``; ``tensor=`` adopts an existing Value."""
    if shape is not None and not isinstance(shape, (tuple, list)):
        shape = (shape,)
    layer = InputLayer(shape=shape, batch_size=batch_size, dtype=dtype, name=name, batch_shape=batch_shape,
                       input_tensor=tensor, **kwargs)
    return layer._inbound_nodes[0].outputs[0]


# --------------------------------------------------------------------------- operations on tensors

class OperationLayer(Layer):
    """A Python operator or cgvm op applied to KerasTensors in a functional model (not serializable)."""

    def __init__(self, fn: Any, **kwargs: Any):
        super().__init__(name=K.unique_name(getattr(fn, "name", getattr(fn, "__name__", "operation")).strip("<>")),
                         **kwargs)
        self.fn = fn
        self.built = True

    def call(self, *inputs: Any) -> Any:
        return self.fn(*[to_value(i) if K.is_symbolic(i) else i for i in inputs])


def apply_operation(fn: Any, *inputs: Any) -> KerasTensor:
    """``fn(*values)`` as a recorded operation in functional models, directly inside a layer's call."""
    if not K.recording():
        return KerasTensor(to_value(fn(*[to_value(i) if K.is_symbolic(i) else i for i in inputs])))
    return OperationLayer(fn)(*inputs)
