"""Attribute kinds: each converts and checks a user-given attribute value, and freezes it.

An op declares ``attrs={"axis": Ints(None), "keepdims": Bool(False)}``; the builder calls the kind
on the given value (or uses the default). Frozen values are hashable so CSE can compare nodes.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .types import DType

REQUIRED = object()


class AttrKind:
    """One attribute's kind and default. ``convert`` raises TypeError/ValueError on bad values."""

    kind = "any"

    def __init__(self, default: Any = REQUIRED, optional: bool = False):
        self.default = default
        self.optional = optional or default is None

    def __call__(self, value: Any) -> Any:
        if value is None and self.optional:
            return None
        return self.convert(value)

    def convert(self, value: Any) -> Any:
        return value

    def __repr__(self) -> str:
        return self.kind


class Int(AttrKind):
    kind = "int"

    def convert(self, value):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"expected an int, got {value!r}")
        return int(value)


class Float(AttrKind):
    kind = "float"

    def convert(self, value):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"expected a number, got {value!r}")
        return float(value)


class Bool(AttrKind):
    kind = "bool"

    def convert(self, value):
        if not isinstance(value, (bool, np.bool_, int)) or value not in (0, 1):
            raise TypeError(f"expected a bool, got {value!r}")
        return bool(value)


class Str(AttrKind):
    kind = "str"

    def __init__(self, default: Any = REQUIRED, choices: tuple = (), optional: bool = False):
        super().__init__(default, optional)
        self.choices = choices

    def convert(self, value):
        if not isinstance(value, str):
            raise TypeError(f"expected a string, got {value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"expected one of {self.choices}, got {value!r}")
        return value


class Ints(AttrKind):
    """A tuple of ints; a single int is accepted and becomes a 1-tuple."""

    kind = "ints"

    def convert(self, value):
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            return (int(value),)
        try:
            items = tuple(value)
        except TypeError:
            raise TypeError(f"expected ints, got {value!r}") from None
        for v in items:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"expected ints, got {value!r}")
        return tuple(int(v) for v in items)


class Floats(AttrKind):
    kind = "floats"

    def convert(self, value):
        if isinstance(value, (int, float, np.number)):
            return (float(value),)
        return tuple(float(v) for v in value)


class DTypeAttr(AttrKind):
    kind = "dtype"

    def convert(self, value):
        return DType(value)


class Array(AttrKind):
    """A constant NumPy array, stored read-only."""

    kind = "array"

    def convert(self, value):
        arr = np.array(value, copy=True)
        arr.flags.writeable = False
        return arr


class GraphAttr(AttrKind):
    """A sub-graph (scan body, cond branch)."""

    kind = "graph"

    def convert(self, value):
        from .graph import Graph  # same package; attrs is imported by graph

        if not isinstance(value, Graph):
            raise TypeError(f"expected a Graph, got {type(value).__name__}")
        return value


class Any_(AttrKind):
    """Any hashable value built from ints, floats, strings, None and tuples."""

    kind = "any"

    def convert(self, value):
        return freeze(value)


def freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    if isinstance(value, tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def attr_key(value: Any) -> Any:
    """A hashable, comparable key for an attribute value (arrays and graphs by content/identity)."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, tuple):
        return tuple(attr_key(v) for v in value)
    if isinstance(value, float) and value != value:
        return ("nan",)
    if hasattr(value, "nodes") and hasattr(value, "outputs"):
        return ("graph", id(value))
    return value


def check_attrs(opname: str, spec: Mapping[str, AttrKind], given: Mapping[str, Any]) -> dict:
    """Convert ``given`` against ``spec``; fill defaults; raise on unknown, missing or bad values."""
    unknown = set(given) - set(spec)
    if unknown:
        raise KeyError(f"op {opname!r} has no attribute {sorted(unknown)[0]!r}; "
                       f"it takes {sorted(spec) or 'none'}")
    out = {}
    for key, kind in spec.items():
        if key in given:
            try:
                out[key] = kind(given[key])
            except (TypeError, ValueError) as exc:
                raise ValueError(f"attribute {key!r} of op {opname!r}: {exc}") from None
        elif kind.default is REQUIRED:
            raise KeyError(f"op {opname!r} needs attribute {key!r} ({kind.kind})")
        else:
            out[key] = kind.default
    return out


Converter = Callable[[Any], Any]
