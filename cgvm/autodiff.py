"""Reverse-mode differentiation as a graph transformation.

``grad(cost, wrt)`` walks the nodes between ``wrt`` and ``cost`` in reverse topological order
and asks each op's gradient rule for nodes that compute its input gradients. The result is
ordinary graph values: they are optimized and compiled like any other, and can be
differentiated again. ``None`` stands for a gradient known to be zero; integer and boolean
values never carry gradients.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

from .errors import GradientError, apply_policy
from .ir.graph import CONST, Value, toposort
from .ops import elementwise as ew
from .ops import shape as shp
from .ops.registry import install_gradient_builder

__all__ = ["grad", "grad_map", "gradient_rules"]

#: gradient rules a frontend puts in place of ops' own, by op name (Theano's conventions at ties)
_RULES: ContextVar[Mapping[str, Callable[..., Sequence[Any]]]] = ContextVar("cgvm_gradient_rules", default={})


@contextmanager
def gradient_rules(rules: Mapping[str, Callable[..., Sequence[Any]]]) -> Iterator[None]:
    """Gradients built inside (including those of loop bodies) use ``rules[op name]`` where given.

    A frontend whose reference defines a gradient differently from cgvm's op at a point (for
    example Theano's ``max`` sends the whole gradient to every tied maximum, where cgvm splits it)
    installs its convention here instead of declaring a second op.
    """
    token = _RULES.set({**_RULES.get(), **rules})
    try:
        yield
    finally:
        _RULES.reset(token)


def _is_diff(v: Value) -> bool:
    return v.dtype.is_float


def grad_map(costs: Mapping[Value, Optional[Value]], wrt: Sequence[Value], *,
             consider_constant: Iterable[Value] = ()) -> Dict[int, Value]:
    """Gradients of ``sum_i <costs_i, seed_i>`` for every value on a path from ``wrt`` to the costs.

    ``costs`` maps an output to its seed gradient (``None``: ones, for a scalar cost).
    Returns ``{id(value): gradient}`` for values with a non-zero gradient.
    """
    blocked = {id(v) for v in consider_constant}
    outs = list(costs)
    nodes = toposort(outs)
    # forward reachability: only values that depend on some wrt can carry a gradient to it
    live = {id(v) for v in wrt}
    for node in nodes:
        if any(id(v) in live and id(v) not in blocked for v in node.inputs):
            live.update(id(o) for o in node.outputs)

    pending: Dict[int, List[Value]] = {}
    for out, seed in costs.items():
        if seed is None:
            if out.ndim != 0 and any(d != 1 for d in out.shape):
                raise GradientError(f"grad: cost {out.label()} must be a scalar, has type {out.type!r}"
                                    + (f" (computed at {out.source})" if out.source else ""))
            seed = shp.ones_like(out)
        pending.setdefault(id(out), []).append(seed)

    result: Dict[int, Value] = {}
    rules = _RULES.get()

    def total(v: Value) -> Optional[Value]:
        parts = pending.pop(id(v), None)
        if not parts:
            return None
        acc = ew.add_n(parts)
        result[id(v)] = acc
        return acc

    for node in reversed(nodes):
        if not any(id(o) in live for o in node.outputs):
            continue
        gouts = [total(o) if id(o) in pending else None for o in node.outputs]
        if all(g is None for g in gouts):
            continue
        needs = [id(v) in live and id(v) not in blocked and _is_diff(v) for v in node.inputs]
        if not any(needs):
            continue
        if not all(_is_diff(o) or g is None for o, g in zip(node.outputs, gouts)):
            gouts = [g if _is_diff(o) else None for o, g in zip(node.outputs, gouts)]
        if not node.op.differentiable or not node.op.has_grad:
            if not node.op.differentiable:
                continue  # piecewise-constant or integer-valued: the gradient is zero
            raise GradientError(f"op {node.op.name!r} has no gradient rule; needed by grad through "
                                f"{node.where()}")
        rule = rules.get(node.op.name)
        gins = list(rule(node, *gouts)) if rule is not None else node.op.build_grad(node, gouts)
        if len(gins) != len(node.inputs):
            raise GradientError(f"gradient rule of {node.op.name!r} returned {len(gins)} values "
                                f"for {len(node.inputs)} inputs")
        for v, g, need in zip(node.inputs, gins, needs):
            if need and g is not None:
                if g.dtype is not v.dtype:
                    g = ew.cast(g, dtype=v.dtype)
                pending.setdefault(id(v), []).append(g)
    for v in wrt:
        if id(v) in pending:
            total(v)
    return result


def grad(cost: Value, wrt: Union[Value, Sequence[Value]], *, consider_constant: Iterable[Value] = (),
         known_grads: Optional[Mapping[Value, Value]] = None, disconnected_inputs: str = "raise",
         return_disconnected: str = "zero") -> Union[Value, List[Optional[Value]]]:
    """Symbolic gradient of a scalar ``cost`` with respect to each of ``wrt``.

    disconnected_inputs: "raise" | "warn" | "ignore" when a wrt does not influence the cost.
    return_disconnected: "zero" (zeros_like) | "none" for such inputs.
    """
    single = isinstance(wrt, Value)
    wrt_list = [wrt] if single else list(wrt)
    costs: Dict[Value, Optional[Value]] = {}
    if cost is not None:
        costs[cost] = None
    for v, g in (known_grads or {}).items():
        costs[v] = g
    if not costs:
        raise GradientError("grad needs a cost or known_grads")
    for v in wrt_list:
        if not isinstance(v, Value):
            raise GradientError(f"grad: wrt must be symbolic values, got {type(v).__name__}")
        if v.kind == CONST:
            raise GradientError(f"grad: cannot differentiate with respect to a constant {v.label()}")
    gmap = grad_map(costs, wrt_list, consider_constant=consider_constant)
    out: List[Optional[Value]] = []
    for v in wrt_list:
        g = gmap.get(id(v))
        if g is None:
            if not _is_diff(v):
                raise GradientError(f"grad: {v.label()} has integer type {v.type!r}; gradients are defined "
                                    "for float values only")
            msg = (f"grad: the cost does not depend on {v.label()} ({v.type!r}); pass "
                   "disconnected_inputs='ignore' to get a zero gradient")
            apply_policy(disconnected_inputs, msg, GradientError, stacklevel=2)
            g = shp.zeros_like(v) if return_disconnected == "zero" else None
        out.append(g)
    return out[0] if single else out


install_gradient_builder(grad_map)
