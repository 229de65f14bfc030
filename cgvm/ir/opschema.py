"""What the IR knows of an op: its name, arity, attribute spec and type rule.

``cgvm.ops.registry.OpDef`` extends this with kernels, gradient rules, fusion pattern and
in-place options. The table here lets the IR resolve op names (deserialization) without
importing ``cgvm.ops``.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .attrs import AttrKind, check_attrs
from .types import TensorType

InferFn = Callable[..., Any]  # infer(in_types, **attrs) -> TensorType | sequence of TensorType

OPS: Dict[str, "OpSchema"] = {}


class OpSchema:
    """Name, arity, attributes and shape/dtype rule of an op."""

    def __init__(self, name: str, *, attrs: Optional[Mapping[str, AttrKind]] = None,
                 num_inputs: Tuple[int, Optional[int]] | int = (1, 1),
                 num_outputs: int | Callable[[Mapping[str, Any], int], int] = 1,
                 infer: Optional[InferFn] = None, doc: str = ""):
        if name in OPS:
            raise ValueError(f"op {name!r} is already registered")
        self.name = name
        self.attr_spec: Dict[str, AttrKind] = dict(attrs or {})
        self.num_inputs = (num_inputs, num_inputs) if isinstance(num_inputs, int) else num_inputs
        self._num_outputs = num_outputs
        self.infer_fn = infer
        self.doc = doc
        OPS[name] = self

    def check_attrs(self, given: Mapping[str, Any]) -> dict:
        return check_attrs(self.name, self.attr_spec, given)

    def check_arity(self, n: int) -> None:
        lo, hi = self.num_inputs
        if n < lo or (hi is not None and n > hi):
            want = str(lo) if lo == hi else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
            raise TypeError(f"op {self.name!r} takes {want} inputs, got {n}")

    def num_outputs(self, attrs: Mapping[str, Any], n_inputs: int) -> int:
        n = self._num_outputs
        return n if isinstance(n, int) else n(attrs, n_inputs)

    def infer(self, in_types: Sequence[TensorType], attrs: Mapping[str, Any]) -> List[TensorType]:
        if self.infer_fn is None:
            raise TypeError(f"op {self.name!r} has no type rule")
        out = self.infer_fn(list(in_types), **attrs)
        return [out] if isinstance(out, TensorType) else list(out)

    def __repr__(self) -> str:
        return f"<op {self.name}>"


def get_op(name: str) -> OpSchema:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None
