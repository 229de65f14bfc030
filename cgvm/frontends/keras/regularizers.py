"""Weight regularizers: terms added to the training loss (Keras 3: L2 is ``l2 * sum(w**2)``, no 1/2)."""
from __future__ import annotations

from typing import Any, Dict

from ...ir.graph import Value
from ...ops import elementwise as ew
from ...ops import reduce as red
from .backend import to_value
from .serialization import Registry

registry = Registry("regularizer")


class Regularizer:
    def __call__(self, x: Any) -> Value:
        return ew.mul(red.sum(to_value(x)), 0.0)

    def get_config(self) -> Dict[str, Any]:
        return {}

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "Regularizer":
        return cls(**config)


@registry.register("l1_l2")
class L1L2(Regularizer):
    def __init__(self, l1: float = 0.0, l2: float = 0.0):
        self.l1, self.l2 = float(l1), float(l2)

    def __call__(self, x: Any) -> Value:
        v = to_value(x)
        terms = []
        if self.l1:
            terms.append(ew.mul(red.sum(ew.abs(v)), self.l1))
        if self.l2:
            terms.append(ew.mul(red.sum(ew.square(v)), self.l2))
        if not terms:
            return ew.mul(red.sum(v), 0.0)
        return terms[0] if len(terms) == 1 else ew.add(terms[0], terms[1])

    def get_config(self):
        return {"l1": self.l1, "l2": self.l2}


@registry.register("l1")
class L1(L1L2):
    def __init__(self, l1: float = 0.01):
        super().__init__(l1=l1)

    def get_config(self):
        return {"l1": self.l1}


@registry.register("l2")
class L2(L1L2):
    def __init__(self, l2: float = 0.01):
        super().__init__(l2=l2)

    def get_config(self):
        return {"l2": self.l2}


def l1_l2(l1: float = 0.01, l2: float = 0.01) -> L1L2:
    return L1L2(l1, l2)


def get(identifier: Any) -> Any:
    return registry.get(identifier)


def serialize(obj: Any) -> Any:
    return registry.serialize(obj, "keras.regularizers")
