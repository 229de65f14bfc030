"""Weight constraints, applied to a weight after each optimizer step (as graph nodes of the update)."""
from __future__ import annotations

from typing import Any, Dict

from ...ir.graph import Value
from ...ops import elementwise as ew
from ...ops import elementwise_math as em
from ...ops import reduce as red
from .backend import to_value
from .serialization import Registry

registry = Registry("constraint")


class Constraint:
    def __call__(self, w: Any) -> Value:
        return to_value(w)

    def get_config(self) -> Dict[str, Any]:
        return {}

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "Constraint":
        return cls(**config)


def _norms(w: Value, axis: Any) -> Value:
    return em.sqrt(red.sum(ew.square(w), axis=axis, keepdims=True))


@registry.register("max_norm")
class MaxNorm(Constraint):
    def __init__(self, max_value: float = 2.0, axis: Any = 0):
        self.max_value, self.axis = float(max_value), axis

    def __call__(self, w: Any) -> Value:
        v = to_value(w)
        norms = _norms(v, self.axis)
        desired = ew.clip(norms, lo=0.0, hi=self.max_value)
        return ew.mul(v, ew.div(desired, ew.add(norms, 1e-7)))

    def get_config(self):
        return {"max_value": self.max_value, "axis": self.axis}


@registry.register("non_neg")
class NonNeg(Constraint):
    def __call__(self, w: Any) -> Value:
        v = to_value(w)
        return ew.mul(v, ew.cast(ew.ge(v, 0.0), dtype=v.dtype))


@registry.register("unit_norm")
class UnitNorm(Constraint):
    def __init__(self, axis: Any = 0):
        self.axis = axis

    def __call__(self, w: Any) -> Value:
        v = to_value(w)
        return ew.div(v, ew.add(_norms(v, self.axis), 1e-7))

    def get_config(self):
        return {"axis": self.axis}


@registry.register("min_max_norm")
class MinMaxNorm(Constraint):
    def __init__(self, min_value: float = 0.0, max_value: float = 1.0, rate: float = 1.0, axis: Any = 0):
        self.min_value, self.max_value, self.rate, self.axis = float(min_value), float(max_value), float(rate), axis

    def __call__(self, w: Any) -> Value:
        v = to_value(w)
        norms = _norms(v, self.axis)
        clipped = ew.clip(norms, lo=self.min_value, hi=self.max_value)
        desired = ew.add(ew.mul(clipped, self.rate), ew.mul(norms, 1.0 - self.rate))
        return ew.mul(v, ew.div(desired, ew.add(norms, 1e-7)))

    def get_config(self):
        return {"min_value": self.min_value, "max_value": self.max_value, "rate": self.rate, "axis": self.axis}


def get(identifier: Any) -> Any:
    return registry.get(identifier)


def serialize(obj: Any) -> Any:
    return registry.serialize(obj, "keras.constraints")
