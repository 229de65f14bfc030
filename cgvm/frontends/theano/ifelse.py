"""``theano.ifelse.ifelse``: a lazy choice between two expressions, lowered onto cgvm's ``cond`` node.

Only the taken branch runs. A branch's graph holds the nodes that only that branch needs: work
shared with the other branch or with the condition is computed once, before the choice, and
passed in. ``T.switch`` is the eager, elementwise alternative.
"""
from __future__ import annotations

from typing import Any, List

import numpy as np

from ...ir.graph import toposort
from ...ops import control
from . import basic
from . import subgraph
from .var import TensorVariable, as_tensor_variable, wrap

__all__ = ["ifelse", "IfElse"]


def _match(a: TensorVariable, b: TensorVariable, k: int) -> TensorVariable:
    """``b`` in ``a``'s dtype where that loses nothing (Theano's filter_variable), else TypeError."""
    if a.ndim != b.ndim:
        raise TypeError(f"ifelse: output {k} has {a.ndim} dimensions in the then-branch and {b.ndim} in the "
                        "else-branch")
    if a.dtype != b.dtype:
        if np.can_cast(np.dtype(b.dtype), np.dtype(a.dtype), "safe") or b.value.kind == "const":
            return basic.cast(b, a.dtype)
        raise TypeError(f"ifelse: output {k} is {a.dtype} in the then-branch and {b.dtype} in the else-branch; "
                        "cast one of them")
    return b


def ifelse(condition: Any, then_branch: Any, else_branch: Any, name: Any = None) -> Any:
    """``then_branch`` if the scalar ``condition`` is true, else ``else_branch``; lists give lists."""
    cond = as_tensor_variable(condition)
    if cond.ndim != 0:
        raise TypeError(f"ifelse: the condition must be a scalar, got {cond.ndim} dimensions")
    single = not isinstance(then_branch, (list, tuple))
    thens = [as_tensor_variable(t) for t in ([then_branch] if single else then_branch)]
    elses = [as_tensor_variable(e) for e in ([else_branch] if single else else_branch)]
    if len(thens) != len(elses):
        raise ValueError(f"ifelse: {len(thens)} then-outputs but {len(elses)} else-outputs")
    elses = [_match(t, e, k) for k, (t, e) in enumerate(zip(thens, elses))]
    t_vals = [t.value for t in thens]
    e_vals = [e.value for e in elses]
    # nodes each branch needs that neither the other branch nor the condition needs
    cond_nodes = {id(n) for n in toposort([cond.value])}
    t_nodes = toposort(t_vals)
    e_nodes = toposort(e_vals)
    t_ids = {id(n) for n in t_nodes}
    e_ids = {id(n) for n in e_nodes}
    t_own = [n for n in t_nodes if id(n) not in e_ids and id(n) not in cond_nodes]
    e_own = [n for n in e_nodes if id(n) not in t_ids and id(n) not in cond_nodes]
    t_graph, t_caps, _ = subgraph.extract(t_vals, [], t_own, name="then")
    e_graph, e_caps, _ = subgraph.extract(e_vals, [], e_own, name="else")
    # both branch graphs take the same operand list: then's captures, then else's
    operands: List[Any] = list(t_caps) + [v for v in e_caps if all(v is not c for c in t_caps)]
    t_graph = _widen(t_graph, t_caps, operands)
    e_graph = _widen(e_graph, e_caps, operands)
    res = control.cond(cond.value, *operands, then_graph=t_graph, else_graph=e_graph)
    res = res if isinstance(res, tuple) else (res,)
    outs = [wrap(r) for r in res]
    return outs[0] if single else outs


def _widen(graph: Any, caps: List[Any], operands: List[Any]) -> Any:
    """The branch graph over the full operand list (inputs it does not read are ignored)."""
    from ...ir.graph import Graph, input_value

    by_id = {id(c): inp for c, inp in zip(caps, graph.inputs)}
    inputs = [by_id.get(id(v)) or input_value(v.type, f"unused{k}") for k, v in enumerate(operands)]
    return Graph(inputs, list(graph.outputs), name=graph.name)


class IfElse:
    """Theano's op class, for code that builds ``IfElse(n_outs)(cond, *thens, *elses)``."""

    def __init__(self, n_outs: int, as_view: bool = False, gpu: bool = False, name: Any = None):
        self.n_outs = n_outs

    def __call__(self, condition: Any, *branches: Any) -> Any:
        thens, elses = list(branches[:self.n_outs]), list(branches[self.n_outs:])
        return ifelse(condition, thens, elses)
