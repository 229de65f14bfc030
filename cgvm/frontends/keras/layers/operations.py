"""Keras 3 tensor operations that appear as entries of saved functional models.

Keras records the ops it runs while building a functional graph as config entries of their own
(``{"module": "keras.src.ops.numpy", "class_name": "NotEqual", ...}``): above all the mask an
``Embedding(mask_zero=True)`` computes (``not_equal(ids, 0)``) or a ``Masking`` layer computes
(``any(not_equal(x, v), axis=-1)``), which later layers then receive as their ``mask=`` argument.
``KerasOperation`` rebuilds such an entry as a weightless layer, and writes it back the same way.
"""
from __future__ import annotations

from functools import reduce
from typing import Any, Callable, Dict

from ....errors import GraphBuildError
from ....ir.graph import Value
from ....ops import elementwise as ew
from ....ops import reduce as red
from ....ops import shape as shp
from .. import backend as K
from ..backend import to_value
from .base import OperationLayer


def _axes(x: Value, axis: Any) -> list:
    if axis is None:
        return list(range(x.ndim))
    return [a % x.ndim for a in (axis if isinstance(axis, (list, tuple)) else [axis])]


def _any(x: Value, axis: Any = None, keepdims: bool = False) -> Value:
    as_float = ew.cast(ew.ne(x, 0) if x.dtype.name != "bool" else x, dtype="float32")
    return ew.gt(red.max(as_float, axis=_axes(x, axis), keepdims=keepdims), 0.0)


def _all(x: Value, axis: Any = None, keepdims: bool = False) -> Value:
    as_float = ew.cast(ew.ne(x, 0) if x.dtype.name != "bool" else x, dtype="float32")
    return ew.gt(red.min(as_float, axis=_axes(x, axis), keepdims=keepdims), 0.0)


def _squeeze(x: Value, axis: Any = None) -> Value:
    if axis is None:
        return shp.squeeze(x, axis=[i for i, d in enumerate(x.shape) if d == 1])
    return shp.squeeze(x, axis=_axes(x, axis))


# Keras op class name -> (function of the call's positional values, config keys it takes)
OPERATIONS: Dict[str, Callable[..., Value]] = {
    "NotEqual": lambda a, b: ew.ne(a, b),
    "Equal": lambda a, b: ew.eq(a, b),
    "Any": _any,
    "All": _all,
    "LogicalAnd": lambda *xs: reduce(ew.logical_and, xs),
    "LogicalOr": lambda *xs: reduce(ew.logical_or, xs),
    "LogicalNot": lambda x: ew.logical_not(x),
    "ExpandDims": lambda x, axis: shp.expand_dims(x, axis=[axis % (x.ndim + 1)]),
    "Squeeze": _squeeze,
}
_CONFIG_KEYS = {"Any": ("axis", "keepdims"), "All": ("axis", "keepdims"), "ExpandDims": ("axis",),
                "Squeeze": ("axis",)}


class KerasOperation(OperationLayer):
    """One saved Keras op (``OPERATIONS``) as a weightless layer; its config is Keras' own."""

    def __init__(self, class_name: str, config: Dict[str, Any], module: str = "keras.src.ops.numpy"):
        if class_name not in OPERATIONS:
            raise GraphBuildError(f"the Keras operation {class_name!r} is not supported")
        options = {k: config[k] for k in _CONFIG_KEYS.get(class_name, ()) if k in config}
        fn = OPERATIONS[class_name]

        def run(*values: Any) -> Value:
            return fn(*[to_value(v) if K.is_symbolic(v) else v for v in values], **options)

        run.__name__ = config.get("name") or K.snake_case(class_name)
        super().__init__(run)
        self.name = config.get("name") or self.name
        self.op_class_name, self.op_module, self.op_config = class_name, module, dict(config)

    def serialize(self) -> Dict[str, Any]:
        return {"module": self.op_module, "class_name": self.op_class_name, "config": dict(self.op_config),
                "registered_name": self.op_class_name}


def is_operation_entry(entry: Dict[str, Any]) -> bool:
    """Whether a functional-config entry is a Keras op rather than a layer (legacy .h5 configs
    leave out the module, so there the op's class name decides)."""
    module = str(entry.get("module") or "")
    return entry.get("class_name") in OPERATIONS and (not module or module.startswith(("keras.src.ops", "keras.ops")))
