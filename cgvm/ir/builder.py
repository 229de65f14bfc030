"""Building nodes: check arity and attributes, infer output types, record the user's source.

``apply(op, inputs, attrs)`` is the one way nodes come into being; ops are callable and go
through it, so every node is checked where the user wrote it, with the error pointing there.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..errors import GraphBuildError, ShapeError, at_source
from .graph import CONST, Node, Value, const_value, current_source
from .types import float32


def as_value(x: Any, like: Optional[Value] = None) -> Value:
    """A Value for ``x``; Python and NumPy scalars become constants of a fitting dtype.

    A Python scalar is weakly typed (as in NumPy 2): it takes the dtype of ``like`` when that
    holds it (an int beside any number, a float beside a float), else int64/float32/bool.
    """
    if isinstance(x, Value):
        return x
    if hasattr(x, "__cgvm_value__"):
        return x.__cgvm_value__()
    if isinstance(x, (bool, np.bool_)):
        return const_value(bool(x), "bool")
    if isinstance(x, (int, float)):
        if like is not None:
            d = like.dtype
            if (isinstance(x, int) and (d.is_int or d.is_float)) or (isinstance(x, float) and d.is_float):
                return const_value(x, d)
        return const_value(x, "int64" if isinstance(x, int) else float32)
    if isinstance(x, (np.ndarray, np.generic, list, tuple)):
        arr = np.asarray(x)
        if arr.dtype == np.float64 and not isinstance(x, (np.ndarray, np.generic)):
            arr = arr.astype(np.float32)
        return const_value(arr)
    raise GraphBuildError(f"cannot use {type(x).__name__} {x!r} as a tensor")


def apply(op: Any, inputs: Sequence[Any], attrs: Optional[Mapping[str, Any]] = None, *,
          name: Optional[str] = None, source: Optional[str] = None) -> Union[Value, Tuple[Value, ...]]:
    """Build one node of ``op`` and return its output Value (or a tuple for several outputs)."""
    src = source if source is not None else current_source()
    like = next((v for v in inputs if isinstance(v, Value) and v.kind != CONST), None)
    if like is None:
        like = next((v for v in inputs if isinstance(v, Value)), None)
    vals = [as_value(x, like) for x in inputs]
    where = at_source(src)
    try:
        op.check_arity(len(vals))
        checked = op.check_attrs(attrs or {})
    except (TypeError, KeyError, ValueError) as exc:
        msg = exc.args[0] if exc.args else str(exc)
        raise GraphBuildError(f"{msg}{where}") from None
    try:
        out_types = op.infer([v.type for v in vals], checked)
    except ShapeError as exc:
        raise ShapeError(f"{op.name}{_describe(vals)}: {exc}{where}") from None
    except (TypeError, ValueError, IndexError) as exc:
        raise ShapeError(f"{op.name}{_describe(vals)}: {exc}{where}") from None
    node = Node(op, vals, checked, name=name, source=src)
    node.outputs = tuple(Value(t, node=node, index=i) for i, t in enumerate(out_types))
    return node.outputs[0] if len(node.outputs) == 1 else node.outputs


def _describe(vals: Sequence[Value]) -> str:
    return "(" + ", ".join(repr(v.type) for v in vals) + ")"


def clone_node(node: Node, inputs: Sequence[Value], attrs: Optional[Mapping[str, Any]] = None) -> Tuple[Value, ...]:
    """Rebuild ``node`` over new inputs (types re-inferred), keeping its name, its outputs' names (a
    Theano variable's name, which names its scope in TensorBoard) and source."""
    out = apply(node.op, inputs, dict(node.attrs if attrs is None else attrs), name=node.name, source=node.source)
    outs = out if isinstance(out, tuple) else (out,)
    for old, new in zip(node.outputs, outs):
        if old.name is not None and new.name is None:
            new.name = old.name
    return outs


def rebuild(outputs: Sequence[Value], replace: Mapping[int, Value]) -> list:
    """Outputs with the values whose ids are keys of ``replace`` swapped for new ones.

    Nodes downstream of a replacement are rebuilt (types re-inferred); others are kept.
    """
    from .graph import toposort

    memo: dict = dict(replace)
    for node in toposort(outputs):
        if all(id(o) in replace for o in node.outputs):
            continue   # a replaced value stays replaced, even where what computed it is rebuilt
        new_inputs = [memo.get(id(v), v) for v in node.inputs]
        if all(a is b for a, b in zip(new_inputs, node.inputs)):
            continue
        new_outs = clone_node(node, new_inputs)
        for old, new in zip(node.outputs, new_outs):
            if id(old) not in replace:
                memo[id(old)] = new
    return [memo.get(id(v), v) for v in outputs]
