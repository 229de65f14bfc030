"""Simplification: algebraic identities, numerically stable forms, and folding into convolutions.

Two walks over the graph (``rewrite``), each rule looking at a node and its rewritten inputs:

1. Local rules, true for every value (no use counts needed):
   * algebra: ``x*1``, ``x+0``, ``x-0``, ``x/1``, ``x**1``, ``neg(neg x)``, ``log(exp x)`` -> x, ``x**2`` -> square(x) (the 0 or 1 a
     constant or a zeros_like/ones_like, as autodiff makes for zero gradients);
     ``exp(log x)`` -> x only where x cannot be negative (an exp, sqrt, square, abs, relu,
     sigmoid, softplus or softmax output); ``transpose(transpose x)`` -> one transpose (or x),
     ``reshape(reshape x)`` -> one reshape (or x); a cast to x's own dtype and identity views
     (stop_gradient and friends, reshape/flatten/broadcast/sum_to_like to x's own static shape,
     identity transpose, squeeze of expand_dims on the same axes) -> x. A constant only counts as the identity
     element when it neither widens x's shape nor changes its dtype.
   * stability (Theano's "stabilize"): ``log(softmax x)`` -> log_softmax; ``log(sigmoid x)`` ->
     -softplus(-x); ``log(1 - sigmoid x)`` -> -softplus(x); ``log(1 + exp x)`` and ``log1p(exp x)``
     -> softplus(x); ``log(1 + x)`` -> log1p;
     ``exp(x) - 1`` -> expm1; ``exp(x) / sum(exp(x), axis, keepdims)`` -> softmax;
     ``binary_crossentropy(sigmoid x, t)`` -> softplus(x) - x t;
     ``categorical_crossentropy(softmax x, t)`` -> -sum(t log_softmax(x));
     ``where(c, a, 0) * y`` and ``where(c, a, 0) / y`` -> ``where(c, a * y, 0)`` (Theano's switch
     sinking: NaN-free gradients of ``switch(x > 0, sqrt(x), 0)``).
   * updates: ``c ± [s *] broadcast_like(p, c)`` -> ``c ± [s *] p`` (the add broadcasts p itself;
     a loop's summed gradient, whose SGD step then becomes one gemm_accumulate), and
     ``c ± [s *] take_grad(g, c, i)`` -> ``take_add(c, ±[s *] g, i)`` (an embedding's SGD step
     adds to the rows it read, not a zero matrix the size of c to all of it).
2. Rules that consume a node's only reader (use counts taken at the start of the walk):
   * ``-sum/mean(onehot(labels) * log_softmax(x))`` over every axis -> ``softmax_cross_entropy``
     (normalization NONE, FULL or BATCH_SIZE as the reductions say). Labels outside the class
     range give a zero term in the pattern but an indexing error in the fused op.
   * a conv followed by inference batch_norm, a per-channel multiply (Caffe's Scale) or a
     per-channel add (Bias, or a bias add) -> one conv with folded weight and bias (see
     fold_conv for when a non-constant fold is worth it).

Rewrites never turn a graph output into a graph input, parameter or constant (the caller would
be handed its own array back).
"""
from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import numpy as np

from ..ir.graph import CONST, NODE, Graph, Node, Value, source_scope
from ..ops import elementwise as ew
from ..ops import indexing
from ..ops import loss as ls
from ..ops import nn
from ..ops import reduce as red
from ..ops import shape as shp
from ..ops.rules import normalize_axes, normalize_axis
from .fold_conv import fold_batch_norm, fold_channel_op
from .patterns import CUT, build, made, producer
from .rewrite import Rule, rewrite

# a local simplification: (node, new inputs) -> the one value replacing the node's only output, or
# None; ``_guarded`` turns a table of them into one rewrite Rule (cgvm.compiler.rewrite.Rule)
Simplification = Callable[[Node, Sequence[Value]], Optional[Value]]


# --------------------------------------------------------------------------- helpers

def _is_const(v: Value, value: float) -> bool:
    """``v`` surely holds ``value`` everywhere: a constant, or a zeros_like/ones_like (autodiff's zero gradients)."""
    if v.kind == CONST:
        return v.data.size > 0 and bool(np.all(v.data == value))
    n = made(v)
    return n is not None and n.op.fill is not None and n.op.fill == value


def _within(inner: Sequence, outer: Sequence) -> bool:
    """``inner`` surely broadcasts into ``outer`` without growing it."""
    return len(inner) <= len(outer) and all(a == 1 or (a is not None and a == b)
                                            for a, b in zip(inner[::-1], outer[::-1]))


def _passes_through(x: Value, const: Value, out: Value) -> bool:
    """Whether ``out`` (computed from x and an identity constant) is x itself: same dtype and shape."""
    return out.dtype is x.dtype and out.shape == x.shape and _within(const.shape, x.shape)


def _identity_operand(node: Node, inputs: Sequence[Value], value: float, positions: Sequence[int]) -> Optional[Value]:
    """The other operand when the one at a position in ``positions`` is the constant ``value``."""
    out = node.outputs[0]
    for k in positions:
        x, c = inputs[1 - k], inputs[k]
        if _is_const(c, value) and _passes_through(x, c, out):
            return x
    return None


def _fully_known(shape: Sequence) -> bool:
    return None not in shape


def _non_negative(v: Value) -> bool:
    n = made(v)
    return n is not None and n.op.is_nonnegative(n)


# --------------------------------------------------------------------------- algebra

def _mul(node, inputs):
    x = _identity_operand(node, inputs, 1.0, (0, 1))
    return x if x is not None else _sink_where(node, inputs, (0, 1))


def _sink_where(node, inputs, positions):
    """``where(c, a, 0) * y`` -> ``where(c, a * y, 0)`` (also ``/ y``), Theano's switch sinking.

    The untaken branch then stays an exact 0 even where ``y`` is inf or NaN: the gradient of
    ``switch(x > 0, sqrt(x), 0)`` is 0, not NaN, at x <= 0 (autodiff's where-gradient is such a
    where, multiplied by the derivative of sqrt there).
    """
    out = node.outputs[0]
    for k in positions:
        w = producer(inputs[k], "where")
        if w is None:
            continue
        c, a, b = w.inputs
        for kept, zero_at in ((a, 2), (b, 1)):
            if not _is_const(w.inputs[zero_at], 0.0) or kept.dtype is not w.outputs[0].dtype:
                continue
            args = list(inputs)
            args[k] = kept
            inner = build(node.op, args, dict(node.attrs), node)
            zero = w.inputs[zero_at]  # kept: its shape takes part in the broadcast
            new = build(ew.where, [c, inner, zero] if zero_at == 2 else [c, zero, inner], {}, node)
            if new.type == out.type:
                return new
    return None


def _add(node, inputs):
    x = _identity_operand(node, inputs, 0.0, (0, 1))
    return x if x is not None else _update_against(node, inputs, (0, 1))


def _scaled(t: Value):
    """``t`` as ``(s, inner, mul node)`` when it is ``s * inner`` with s a scalar, else ``(None, t, None)``."""
    m = producer(t, "mul")
    if m is not None:
        for k in (0, 1):
            if m.inputs[k].ndim == 0 and m.inputs[1 - k].ndim > 0:
                return m.inputs[k], m.inputs[1 - k], m
    return None, t, None


def _update_against(node, inputs, positions) -> Optional[Value]:
    """Adding a gradient to the value it is shaped after (an SGD step ``c - s * g``):

    * ``c ± [s *] broadcast_like(p, c)`` -> ``c ± [s *] p``: adding to c broadcasts p to c's
      shape anyway. A loop's summed gradient arrives so (cgvm.compiler.loop_pushout), and its SGD
      step then becomes one GEMM adding into c (cgvm.compiler.accumulate).
    * ``c ± [s *] take_grad(g, c, i)`` -> ``take_add(c, ±[s *] g, i)``: only the rows the indices
      name change (an embedding's), not a zero matrix the size of c added to all of it.
    """
    out = node.outputs[0]
    for k in positions:
        c, t = inputs[1 - k], inputs[k]
        s, inner, m = _scaled(t)
        b = producer(inner, "broadcast_like", "take_grad")
        if b is None or b.inputs[1] is not c:
            continue
        p = b.inputs[0]
        if b.op.name == "take_grad" and (b.attrs["axis"] is None or p.dtype is not c.dtype or out.dtype is not c.dtype):
            continue
        if s is not None:
            p = build(ew.mul, [p, s] if m.inputs[1] is s else [s, p], {}, m)
        if b.op.name == "broadcast_like":
            args = list(inputs)
            args[k] = p
            new = build(node.op, args, dict(node.attrs), node)
        else:
            if node.op.name == "sub":
                p = build(ew.neg, [p], {}, node)
            new = build(indexing.take_add, [c, p, b.inputs[2]], {"axis": b.attrs["axis"]}, node)
        if new.type == out.type:
            return new
    return None


def _sub(node, inputs):
    x = _identity_operand(node, inputs, 0.0, (1,))
    if x is not None:
        return x
    x = _update_against(node, inputs, (1,))
    if x is not None:
        return x
    e = producer(inputs[0], "exp")
    if e is not None and _is_const(inputs[1], 1.0) and _passes_through(inputs[0], inputs[1], node.outputs[0]):
        return build(ew.expm1, e.inputs, {}, node)
    return None


def _div(node, inputs):
    x = _identity_operand(node, inputs, 1.0, (1,))
    if x is not None:
        return x
    x = _sink_where(node, inputs, (0,))
    return x if x is not None else _manual_softmax(node, inputs)


def _pow(node, inputs):
    """``x ** 1`` -> x and ``x ** 2`` -> square(x) for float x (a weight decay's ``(W ** 2).sum()`` and its
    gradient ``2 * W ** 1``: the generic power costs several times a multiply, per element)."""
    x, c = inputs
    if c.kind != CONST or c.data.size != 1 or not x.dtype.is_float or not _passes_through(x, c, node.outputs[0]):
        return None
    if _is_const(c, 1.0):
        return x
    if _is_const(c, 2.0):
        return build(ew.square, [x], {}, node)
    return None


def _neg(node, inputs):
    inner = producer(inputs[0], "neg")
    return inner.inputs[0] if inner is not None else None


def _exp(node, inputs):
    inner = producer(inputs[0], "log")
    if inner is not None and _non_negative(inner.inputs[0]) and inner.inputs[0].type == node.outputs[0].type:
        return inner.inputs[0]
    return None


def _log(node, inputs):
    x = inputs[0]
    out = node.outputs[0]
    inner = made(x)
    if inner is None:
        return None
    name = inner.op.name
    if name == "exp" and inner.inputs[0].type == out.type:
        return inner.inputs[0]
    if name == "softmax":
        return build(nn.log_softmax, inner.inputs, dict(inner.attrs), node)
    if name == "sigmoid" and inner.inputs[0].type == out.type:
        return build(ew.neg, [ew.softplus(ew.neg(inner.inputs[0]))], {}, node)
    if name == "sub" and _is_const(inner.inputs[0], 1.0) and _within(inner.inputs[0].shape, x.shape):
        s = producer(inner.inputs[1], "sigmoid")
        if s is not None and s.inputs[0].type == out.type:
            return build(ew.neg, [ew.softplus(s.inputs[0])], {}, node)
    if name == "add":
        a, b = inner.inputs
        for one, y in ((a, b), (b, a)):
            if _is_const(one, 1.0) and _passes_through(y, one, x) and y.dtype.is_float:
                e = producer(y, "exp")
                if e is not None and e.inputs[0].type == out.type:
                    return build(ew.softplus, e.inputs, {}, node)  # log(1 + exp z): stable for large z
                return build(ew.log1p, [y], {}, node)
    return None


def _log1p(node, inputs):
    """log1p(exp z) -> softplus(z) (what log(1 + exp z) became, or was written as)."""
    e = producer(inputs[0], "exp")
    if e is not None and e.inputs[0].type == node.outputs[0].type:
        return build(ew.softplus, e.inputs, {}, node)
    return None


def _manual_softmax(node, inputs):
    """exp(x) / sum(exp(x), axis=a, keepdims=True) -> softmax(x, axis=a)."""
    e, s = inputs
    en = producer(e, "exp")
    sn = producer(s, "sum")
    if en is None or sn is None or sn.inputs[0] is not e or not sn.attrs["keepdims"]:
        return None
    x = en.inputs[0]
    if not x.dtype.is_float or x.ndim == 0 or x.type != node.outputs[0].type:
        return None
    axes = normalize_axes(sn.attrs["axis"], x.ndim)
    if len(axes) != 1:
        return None
    return build(nn.softmax, [x], {"axis": axes[0]}, node)


def _compose_perm(perm, ndim: int):
    return tuple(range(ndim - 1, -1, -1)) if perm is None else tuple(normalize_axis(p, ndim) for p in perm)


def _transpose(node, inputs):
    x = inputs[0]
    outer = _compose_perm(node.attrs["perm"], x.ndim)
    if outer == tuple(range(x.ndim)):
        return x
    inner = producer(x, "transpose")
    if inner is None:
        return None
    src = inner.inputs[0]
    first = _compose_perm(inner.attrs["perm"], src.ndim)
    perm = tuple(first[p] for p in outer)
    if perm == tuple(range(src.ndim)):
        return src
    return build(shp.transpose, [src], {"perm": perm}, node)


def _same_shape_view(x: Value, out: Value) -> bool:
    """A reshape-like view whose result surely has x's own shape (at most one unknown dimension)."""
    return out.type == x.type and sum(d is None for d in x.shape) <= 1


def _reshape(node, inputs):
    x = inputs[0]
    out = node.outputs[0]
    inner = producer(x, "reshape")
    if inner is not None:
        src = inner.inputs[0]
        if _same_shape_view(src, out):
            return src
        if 0 not in node.attrs["shape"]:  # a 0 would copy a dimension of the inner result, not of src
            return build(shp.reshape, [src], {"shape": node.attrs["shape"]}, node)
    return x if _same_shape_view(x, out) else None


def _shape_view(node, inputs):
    """flatten, reshape_like, broadcast_to, broadcast_like, expand_dims, squeeze, sum_to_like: identity when
    shape-preserving."""
    x = inputs[0]
    out = node.outputs[0]
    name = node.op.name
    if name == "squeeze":
        inner = producer(x, "expand_dims")
        axis = node.attrs["axis"]
        if inner is not None and axis is not None and \
                normalize_axes(axis, x.ndim) == normalize_axes(inner.attrs["axis"], x.ndim):
            return inner.inputs[0]
    if name == "squeeze" and node.attrs["axis"] is None and not _fully_known(x.shape):
        return None  # an unknown dimension may be 1 at run time, and then it is squeezed
    if name in ("flatten", "squeeze", "expand_dims"):
        return x if out.type == x.type else None
    if name == "broadcast_like":
        filled = _broadcast_fill(x, inputs[1], out, node)
        if filled is not None:
            return filled
    return x if out.type == x.type and _fully_known(x.shape) else None


def _broadcast_fill(x: Value, like: Value, out: Value, node: Node) -> Optional[Value]:
    """broadcast_like(one value everywhere, like) -> a fill shaped like ``like`` (autodiff's seeds:
    ``ones_like(cost)`` expanded and broadcast), so no broadcast view is made at run time."""
    src = x
    while producer(src, "expand_dims") is not None:
        src = src.node.inputs[0]
    n = made(src)
    if n is None or any(d != 1 for d in x.shape) or like.ndim != out.ndim or like.shape != out.shape:
        return None
    if n.op.fill is not None:   # ones_like, zeros_like (ops declaring the one value they hold)
        op = {1.0: shp.ones_like, 0.0: shp.zeros_like}.get(n.op.fill)
        if op is not None:
            return build(op, [like], {"dtype": x.dtype}, node)
        return build(shp.full_like, [like], {"value": n.op.fill, "dtype": x.dtype}, node)
    if n.op.name == "full_like":   # its value is an attribute, not a fact of the op
        return build(shp.full_like, [like], {"value": n.attrs["value"], "dtype": x.dtype}, node)
    return None


def _identity(node, inputs):
    return inputs[0]


def _cast(node, inputs):
    return inputs[0] if node.attrs["dtype"] is inputs[0].dtype else None


# --------------------------------------------------------------------------- losses

def _loss_of_activation(node, inputs, activation: str):
    """(p, t, the activation's node, its input x) when the loss reads p = activation(x) unclipped
    (eps 0): the pattern both rewrites below start from."""
    p, t = inputs
    s = producer(p, activation)
    if s is None or node.attrs["eps"] != 0.0:
        return None
    return p, t, s, s.inputs[0]


def _binary_crossentropy(node, inputs):
    found = _loss_of_activation(node, inputs, "sigmoid")
    if found is None:
        return None
    p, t, _, x = found
    if not x.dtype.is_float or x.dtype is not p.dtype:
        return None
    tf = t if t.dtype is x.dtype else ew.cast(t, dtype=x.dtype)
    return build(ew.sub, [ew.softplus(x), ew.mul(x, tf)], {}, node)


def _categorical_crossentropy(node, inputs):
    found = _loss_of_activation(node, inputs, "softmax")
    if found is None:
        return None
    p, t, s, x = found
    a = normalize_axis(node.attrs["axis"], p.ndim)
    if normalize_axis(s.attrs["axis"], x.ndim) != a:
        return None
    if t.dtype.is_float:
        if t.dtype is not x.dtype or t.shape != x.shape:
            return None
        target = t
    else:
        target = ls.one_hot_like(t, x, axis=a)
    logp = nn.log_softmax(x, axis=a)
    return build(ew.neg, [red.sum(ew.mul(target, logp), axis=(a,))], {}, node)


# --------------------------------------------------------------------------- the local walk

LOCAL_RULES: Dict[str, Simplification] = {
    "mul": _mul, "add": _add, "sub": _sub, "div": _div, "neg": _neg, "pow": _pow, "exp": _exp, "log": _log, "log1p": _log1p,
    "transpose": _transpose, "reshape": _reshape, "cast": _cast,
    "flatten": _shape_view, "reshape_like": _shape_view, "broadcast_to": _shape_view,
    "broadcast_like": _shape_view, "expand_dims": _shape_view, "squeeze": _shape_view, "sum_to_like": _shape_view,
    "stop_gradient": _identity, "grad_scale": _identity, "grad_clip": _identity,
    "binary_crossentropy": _binary_crossentropy, "categorical_crossentropy": _categorical_crossentropy,
}


def _guarded(graph: Graph, rules: Dict[str, Simplification], on_replace=None) -> Rule:
    """The rewrite rule dispatching on op name; graph outputs never become leaves."""
    outputs = {id(v) for v in graph.outputs}

    def rule(node, inputs):
        fn = rules.get(node.op.name)
        if fn is None or len(node.outputs) != 1:
            return None
        with source_scope(node.source):   # nodes a rule builds point where the user wrote the original
            repl = fn(node, inputs)
        if repl is None or repl is node.outputs[0]:
            return None
        if repl.kind != NODE and id(node.outputs[0]) in outputs:
            return None
        if on_replace is not None:
            on_replace(node, repl)
        return [repl]
    return rule


# --------------------------------------------------------------------------- softmax cross-entropy

def _one_hot_labels(v: Value, x: Value, axis: int) -> Optional[Value]:
    """The integer labels when ``v`` is their one-hot encoding along ``axis`` of the logits x."""
    n = made(v)
    if n is None or v.type != x.type:
        return None
    # the rewrite's pattern: the two one-hot encoders whose labels softmax_cross_entropy can take
    if n.op.name == "one_hot_like" and normalize_axis(n.attrs["axis"], x.ndim) == axis:
        return n.inputs[0]
    if n.op.name == "one_hot" and axis == x.ndim - 1 and n.attrs["depth"] == x.shape[-1]:
        return n.inputs[0]
    return None


def _normalization(kinds: Dict[int, str], axis: int, ndim: int) -> Optional[str]:
    """softmax_cross_entropy's normalization for these reductions per axis (class axis summed)."""
    if kinds.get(axis) != "sum" or len(kinds) != ndim:
        return None
    others = [kinds[a] for a in range(ndim) if a != axis]
    if all(k == "sum" for k in others):
        return "NONE"
    if all(k == "mean" for k in others):
        return "FULL"
    if axis == 1 and kinds[0] == "mean" and all(kinds[a] == "sum" for a in range(2, ndim)):
        return "BATCH_SIZE"
    return None


def _cross_entropy(node: Node, inputs: Sequence[Value], sole: Callable[[Value], bool]) -> Optional[Value]:
    """-(sums/means over every axis of onehot * log_softmax(x)) -> softmax_cross_entropy(x, labels)."""
    out = node.outputs[0]
    if out.ndim != 0:
        return None
    chain = []   # (op name, attrs) from the root down to the product
    sign = 1
    v = None
    n = node
    ins = list(inputs)
    while True:
        name = n.op.name
        if name == "neg":
            sign = -sign
        elif name in ("sum", "mean") and not n.attrs["keepdims"]:
            chain.append((name, n.attrs["axis"]))
        else:
            return None
        v = ins[0]
        n = made(v)
        if n is None or not sole(v):
            return None
        ins = list(n.inputs)
        if n.op.name == "mul":   # the pattern: -sum(mul(log p, onehot)) (negations and sums above it)
            break
    if sign != -1 or not sole(v):
        return None
    for logp, onehot in ((ins[0], ins[1]), (ins[1], ins[0])):
        ln = producer(logp, "log_softmax")
        if ln is None or not sole(logp):
            continue
        x = ln.inputs[0]
        axis = normalize_axis(ln.attrs["axis"], x.ndim)
        labels = _one_hot_labels(onehot, x, axis)
        if labels is None or v.type != x.type or out.dtype is not x.dtype:
            continue
        kinds: Dict[int, str] = {}
        remaining = list(range(x.ndim))
        for name, axes in reversed(chain):
            picked = normalize_axes(axes, len(remaining))
            for k in picked:
                kinds[remaining[k]] = name
            remaining = [a for k, a in enumerate(remaining) if k not in picked]
        norm = _normalization(kinds, axis, x.ndim) if not remaining else None
        if norm is None:
            continue
        return build(ls.softmax_cross_entropy, [x, labels], {"axis": axis, "normalization": norm}, node)
    return None


_COUNTED_ANCHORS = ("conv", "log_softmax")   # every counted rule needs one of these in the graph
COUNTED_RULES = {"neg": _cross_entropy, "sum": _cross_entropy, "mean": _cross_entropy,
                 "batch_norm": fold_batch_norm, "mul": fold_channel_op, "add": fold_channel_op}


# --------------------------------------------------------------------------- the pass

def simplify(graph: Graph) -> Graph:
    """Algebraic simplification and stable forms, then the rewrites that take over a node's only reader."""
    token = CUT.set(frozenset(id(v) for v in graph.inputs))
    try:
        return _simplify(graph)
    finally:
        CUT.reset(token)


def _simplify(graph: Graph) -> Graph:
    graph = rewrite(graph, _guarded(graph, LOCAL_RULES))
    if not any(n.op.name in _COUNTED_ANCHORS for n in graph.nodes):
        return graph
    counts = {k: len(v) for k, v in graph.consumers().items()}
    outputs = {id(v) for v in graph.outputs}
    origin: Dict[int, int] = {}   # id(rewritten value) -> id(the value it replaces), for use counts

    def sole(v: Value) -> bool:
        key = origin.get(id(v), id(v))
        return made(v) is not None and key not in outputs and counts.get(key, 0) == 1

    def counted(fn):
        return lambda node, inputs: fn(node, inputs, sole)

    rules = {name: counted(fn) for name, fn in COUNTED_RULES.items()}
    guarded = _guarded(graph, rules, on_replace=lambda node, repl: origin.__setitem__(id(repl), id(node.outputs[0])))

    def rule(node, inputs):
        for old, new in zip(node.inputs, inputs):
            if old is not new:
                origin[id(new)] = origin.get(id(old), id(old))
        return guarded(node, inputs)

    return rewrite(graph, rule)

