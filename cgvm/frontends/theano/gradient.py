"""``theano.grad`` and ``theano.gradient``: Theano's gradient API over ``cgvm.autodiff``.

Gradients are ordinary graph values, so ``grad`` of ``grad`` works. ``jacobian`` and ``hessian``
loop over the rows of the flattened expression with ``scan`` (as Theano does), so their cost in
the graph does not grow with the expression's size. ``Rop`` uses the double-``Lop`` identity
(J·v = ∂/∂u ⟨Jᵀu, v⟩), which needs nothing beyond reverse mode.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ... import autodiff
from ...errors import GradientError, apply_policy
from ...ir.graph import CONST, Value
from ...ops import elementwise as ew
from ...ops import grad_control
from ...ops import reduce as red
from ...ops import shape as shp
from .config import config
from .var import TensorVariable, as_tensor_variable, wrap

__all__ = ["grad", "jacobian", "hessian", "Rop", "Lop", "zero_grad", "disconnected_grad", "grad_clip",
           "grad_scale", "verify_grad", "DisconnectedInputError", "DisconnectedType", "NullTypeGradError"]


class DisconnectedInputError(GradientError, ValueError):
    """``grad`` was asked for an input that the cost does not depend on."""


class NullTypeGradError(GradientError, TypeError):
    """A gradient is undefined (Theano's NullType)."""


class DisconnectedType:
    """Marker type of a disconnected gradient (``return_disconnected='disconnected'``)."""

    def __repr__(self) -> str:
        return "DisconnectedType()"


class DisconnectedVariable:
    """The gradient of a disconnected input with ``return_disconnected='Disconnected'`` (Theano's)."""

    def __init__(self, wrt: Any):
        self.type = DisconnectedType()
        self.wrt = wrt

    def __repr__(self) -> str:
        return f"<DisconnectedType gradient of {self.wrt!r}>"


def _every_tie_grad(node: Any, g: Value) -> List[Value]:
    """Theano's max/min: the whole gradient to every entry equal to the result."""
    hit = ew.cast(ew.eq(node.inputs[0], red._keepdims_output(node)), dtype=g.dtype)
    return [ew.mul(red._keepdims_grad(node, g), hit)]


def _first_wins_grad(node: Any, g: Value) -> List[Value]:
    """Theano's maximum/minimum: the gradient to the first input where it is the result (ties
    included), else to the second."""
    a, b = node.inputs
    ga = ew.mul(g, ew.cast(ew.eq(node.outputs[0], a), dtype=g.dtype))
    return [ew._unbroadcast(ga, a), ew._unbroadcast(ew.sub(g, ga), b)]


def _switch_grad(node: Any, g: Value) -> List[Value]:
    """Theano's switch gradient: where(c, g, 0) to the first branch, where(c, 0, g) to the second.

    A branch with the result's broadcast pattern takes it as is: in Theano a dimension that is not
    broadcastable never broadcasts, so no reduction back to the branch's shape is needed, and the
    ``where`` stays visible to the switch-sinking rewrite (NaN-free ``switch(x > 0, sqrt(x), 0)``).
    """
    c, a, b = node.inputs
    out = node.outputs[0]
    zero = shp.zeros_like(g)

    def back(v: Value, gv: Value) -> Value:
        same = v.ndim == out.ndim and all((d == 1) == (o == 1) for d, o in zip(v.shape, out.shape))
        return gv if same else ew._unbroadcast(gv, v)

    return [None, back(a, ew.where(c, g, zero)), back(b, ew.where(c, zero, g))]


#: where Theano's gradients differ from cgvm's ops (which split ties equally, as PyTorch does)
THEANO_GRADIENT_RULES = {"max": _every_tie_grad, "min": _every_tie_grad,
                         "maximum": _first_wins_grad, "minimum": _first_wins_grad, "where": _switch_grad}


def _int_cast_outputs(roots: Sequence[Value], w: Value) -> List[Value]:
    """The float casts of integer ``w`` in the graph of ``roots``: Theano's gradient passes through them."""
    from ...ir.graph import toposort

    return [n.outputs[0] for n in toposort(roots) if n.op.name == "cast" and n.inputs[0] is w
            and n.outputs[0].dtype.is_float]


def _zeros_for(v: TensorVariable) -> TensorVariable:
    from . import tensor as basic

    dtype = v.dtype if v.value.dtype.is_float else config.floatX
    return basic.zeros_like(v, dtype=dtype)


def grad(cost: Any, wrt: Any, consider_constant: Optional[Sequence[Any]] = None,
         disconnected_inputs: str = "raise", add_names: bool = True, known_grads: Optional[Dict[Any, Any]] = None,
         return_disconnected: str = "zero", null_gradients: str = "raise") -> Any:
    """Symbolic gradient of a scalar ``cost`` with respect to ``wrt`` (a variable or a list).

    Also takes plain IR Values (what the other frontends hand out): gradients of a Value cost
    come back as Values, so ``cgvm.grad`` serves every frontend.
    """
    from . import tensor as basic

    plain = isinstance(cost, Value)

    if disconnected_inputs not in ("raise", "warn", "ignore"):
        raise ValueError(f"disconnected_inputs must be 'raise', 'warn' or 'ignore', got {disconnected_inputs!r}")
    if str(return_disconnected).lower() not in ("zero", "none", "disconnected"):
        raise ValueError(f"return_disconnected must be 'zero', 'None' or 'Disconnected', got {return_disconnected!r}")
    return_disconnected = str(return_disconnected).lower()
    if cost is not None:
        cost = as_tensor_variable(cost)
        if cost.ndim != 0:
            raise TypeError(f"cost must be a scalar (0-d tensor), got {cost.ndim} dimensions"
                            + (f" (built at {cost.value.source})" if cost.value.source else "")
                            + "; reduce it first, e.g. with .sum() or .mean()")
        if not cost.value.dtype.is_float:
            cost = basic.cast(cost, config.floatX)
    elif not known_grads:
        raise ValueError("grad: cost is None and no known_grads were given")
    single = not isinstance(wrt, (list, tuple))
    wrt_list = [as_tensor_variable(w) if isinstance(w, Value) else w for w in ([wrt] if single else wrt)]
    for w in wrt_list:
        if not isinstance(w, TensorVariable):
            raise TypeError(f"grad: wrt must be symbolic variables, got {type(w).__name__}")
    float_wrt = [w.value for w in wrt_list if w.value.dtype.is_float and w.value.kind != CONST]
    known = {as_tensor_variable(k).value: as_tensor_variable(g).value for k, g in (known_grads or {}).items()}
    blocked = [as_tensor_variable(v).value for v in (consider_constant or [])]
    roots = ([] if cost is None else [cost.value]) + list(known)
    # an integer wrt gets the gradient of its float casts (Theano's Cast passes it; other integer ops block it)
    casts = {id(w.value): _int_cast_outputs(roots, w.value) for w in wrt_list
             if not w.value.dtype.is_float and w.value.kind != CONST}
    targets = float_wrt + [c for cs in casts.values() for c in cs]
    got: Dict[int, Any] = {}
    if targets:
        # Theano's conventions for Theano variables; plain IR values (cgvm.grad from other frontends) keep cgvm's
        with autodiff.gradient_rules({} if plain else THEANO_GRADIENT_RULES):
            res = autodiff.grad(None if cost is None else cost.value, targets, consider_constant=blocked,
                                known_grads=known, disconnected_inputs="ignore", return_disconnected="none")
        got = {id(t): g for t, g in zip(targets, res)}
    for wid, cs in casts.items():
        parts = [got[id(c)] for c in cs if got.get(id(c)) is not None]
        if parts:
            total = parts[0]
            for p in parts[1:]:
                total = ew.add(total, p)
            got[wid] = ew.cast(total, dtype=config.floatX)
    out: List[Any] = []
    for w in wrt_list:
        g = got.get(id(w.value))
        if g is not None:
            gv = wrap(g)
            if add_names and cost is not None and cost.name and w.name:
                gv.name = f"(d{cost.name}/d{w.name})"
            out.append(gv)
            continue
        if cost is not None and w.value is cost.value:
            out.append(basic.ones_like(w, dtype=config.floatX if not w.value.dtype.is_float else w.dtype))
            continue
        if not w.value.dtype.is_float:
            out.append(_zeros_for(w))  # integer inputs: Theano's gradient is zero, not an error
            continue
        msg = (f"grad: the cost does not depend on {w!r} ({w.value.type!r}); it is disconnected from the "
               "cost. Pass disconnected_inputs='ignore' to get a zero gradient instead")
        apply_policy(disconnected_inputs, msg, DisconnectedInputError, stacklevel=2)
        out.append(_zeros_for(w) if return_disconnected == "zero" else
                   DisconnectedVariable(w) if return_disconnected == "disconnected" else None)
    if plain:
        out = [o.value if isinstance(o, TensorVariable) else o for o in out]
    return out[0] if single else out


def Lop(f: Any, wrt: Any, eval_points: Any, consider_constant: Optional[Sequence[Any]] = None,
        disconnected_inputs: str = "raise") -> Any:
    """vᵀ·J: the gradient of ``f`` seeded with ``eval_points`` (same structure as ``f``)."""
    fs = f if isinstance(f, (list, tuple)) else [f]
    vs = eval_points if isinstance(eval_points, (list, tuple)) else [eval_points]
    known = {as_tensor_variable(a): as_tensor_variable(b) for a, b in zip(fs, vs)}
    return grad(None, wrt, consider_constant=consider_constant, known_grads=known,
                disconnected_inputs=disconnected_inputs)


def Rop(f: Any, wrt: Any, eval_points: Any, disconnected_outputs: str = "raise",
        return_disconnected: str = "zero") -> Any:
    """J·v: the directional derivative of ``f`` along ``eval_points`` (one per ``wrt``)."""
    from . import tensor as basic

    single_f = not isinstance(f, (list, tuple))
    fs = [as_tensor_variable(x) for x in ([f] if single_f else f)]
    ws = wrt if isinstance(wrt, (list, tuple)) else [wrt]
    vs = eval_points if isinstance(eval_points, (list, tuple)) else [eval_points]
    # u is a placeholder computed from f (so no new input appears); J·v = d<Jᵀu, v>/du
    us = [basic.zeros_like(x) for x in fs]
    jt_u = grad(None, list(ws), known_grads=dict(zip(fs, us)), disconnected_inputs="ignore")
    inner = None
    for g, v in zip(jt_u, vs):
        term = basic.sum(g * as_tensor_variable(v))
        inner = term if inner is None else inner + term
    res = grad(inner, us, disconnected_inputs="ignore", return_disconnected=return_disconnected)
    return res[0] if single_f else res


def jacobian(expression: Any, wrt: Any, consider_constant: Optional[Sequence[Any]] = None,
             disconnected_inputs: str = "raise", vectorize: bool = False) -> Any:
    """d expression[i] / d wrt, stacked over i (expression flattened to a vector)."""
    from . import tensor as basic
    from .scan_module import scan

    expression = as_tensor_variable(expression)
    single = not isinstance(wrt, (list, tuple))
    wrts = [wrt] if single else list(wrt)
    if expression.ndim == 0:
        res = grad(expression, wrts, consider_constant=consider_constant,
                   disconnected_inputs=disconnected_inputs)
        return res[0] if single else res
    flat = basic.flatten(expression)

    def row(i, *_):
        return grad(flat[i], wrts, consider_constant=consider_constant, disconnected_inputs=disconnected_inputs)

    rows, _ = scan(row, sequences=basic.arange(flat.shape[0]), non_sequences=[flat] + wrts)
    rows = rows if isinstance(rows, list) else [rows]
    return rows[0] if single else rows


def hessian(cost: Any, wrt: Any, consider_constant: Optional[Sequence[Any]] = None,
            disconnected_inputs: str = "raise") -> Any:
    """The matrix of second derivatives of a scalar ``cost`` for each (vector) ``wrt``."""
    single = not isinstance(wrt, (list, tuple))
    wrts = [wrt] if single else list(wrt)
    out = []
    for w in wrts:
        if w.ndim != 1:
            raise TypeError(f"hessian: wrt must be a vector, {w!r} has {w.ndim} dimensions")
        g = grad(cost, w, consider_constant=consider_constant, disconnected_inputs=disconnected_inputs)
        out.append(jacobian(g, w, consider_constant=consider_constant, disconnected_inputs=disconnected_inputs))
    return out[0] if single else out


def zero_grad(x: Any) -> TensorVariable:
    """``x`` in the forward pass; its gradient is zero."""
    return wrap(grad_control.stop_gradient(as_tensor_variable(x).value))


def disconnected_grad(x: Any) -> TensorVariable:
    """``x`` in the forward pass; gradients do not flow through it."""
    return wrap(grad_control.stop_gradient(as_tensor_variable(x).value))


def grad_clip(x: Any, lower_bound: float, upper_bound: float) -> TensorVariable:
    """``x`` in the forward pass; the gradient flowing back is clipped to [lower, upper]."""
    return wrap(grad_control.grad_clip(as_tensor_variable(x).value, lower=float(lower_bound),
                                       upper=float(upper_bound)))


def grad_scale(x: Any, multiplier: float) -> TensorVariable:
    """``x`` in the forward pass; the gradient flowing back is multiplied by ``multiplier``."""
    return wrap(grad_control.grad_scale(as_tensor_variable(x).value, scale=float(multiplier)))


def consider_constant(x: Any) -> TensorVariable:
    return zero_grad(x)


def verify_grad(fun: Any, pt: Sequence[np.ndarray], n_tests: int = 2, rng: Any = None, eps: Optional[float] = None,
                out_type: Any = None, abs_tol: Optional[float] = None, rel_tol: Optional[float] = None,
                mode: Any = None, cast_to_output_type: bool = False, no_debug_ref: bool = True) -> None:
    """Check ``grad`` of ``sum(fun(*inputs) * random)`` against central differences; raises on mismatch."""
    from . import tensor as basic
    from .function import function

    rng = rng if rng is not None else np.random.RandomState(0)
    pt = [np.array(p) for p in pt]
    syms = [_sym_like(p) for p in pt]
    out = as_tensor_variable(fun(*syms))
    probe = function(syms, out, on_unused_input="ignore")
    shape = np.shape(probe(*pt))
    dtype = np.result_type(*[p.dtype for p in pt])
    eps = eps if eps is not None else (1e-4 if dtype == np.float64 else 1e-2)
    tol = abs_tol if abs_tol is not None else (1e-4 if dtype == np.float64 else 1e-2)
    rtol = rel_tol if rel_tol is not None else tol
    for _ in range(n_tests):
        proj = rng.rand(*shape).astype(out.dtype)
        cost = basic.sum(out * proj)
        gs = grad(cost, syms, disconnected_inputs="ignore")
        f = function(syms, [cost] + gs, on_unused_input="ignore")
        analytic = f(*pt)[1:]
        cost_f = function(syms, cost, on_unused_input="ignore")
        for k, p in enumerate(pt):
            num = np.zeros_like(p, dtype=np.float64)
            flat = p.reshape(-1)
            for j in range(flat.size):
                old = flat[j]
                flat[j] = old + eps
                plus = float(cost_f(*pt))
                flat[j] = old - eps
                minus = float(cost_f(*pt))
                flat[j] = old
                num.reshape(-1)[j] = (plus - minus) / (2 * eps)
            if not np.allclose(analytic[k], num, atol=tol, rtol=rtol):
                err = np.max(np.abs(analytic[k] - num))
                raise AssertionError(f"verify_grad: gradient of input {k} differs from the numeric one "
                                     f"by up to {err:g}")


def _sym_like(p: np.ndarray) -> TensorVariable:
    from .var import TensorType

    return TensorType(p.dtype, shape=(None,) * p.ndim)()
