"""Simplification: algebraic identities, numerically stable forms, and folding into convolutions.

Two walks over the graph (``rewrite``), each rule looking at a node and its rewritten inputs:

1. Local rules, true for every value (no use counts needed):
   * algebra: ``x*1``, ``x+0``, ``x-0``, ``x/1``, ``neg(neg x)``, ``log(exp x)`` -> x (the 0 or 1 a
     constant or a zeros_like/ones_like, as autodiff makes for zero gradients);
     ``exp(log x)`` -> x only where x cannot be negative (an exp, sqrt, square, abs, relu,
     sigmoid, softplus or softmax output); ``transpose(transpose x)`` -> one transpose (or x),
     ``reshape(reshape x)`` -> one reshape (or x); a cast to x's own dtype and identity views
     (stop_gradient and friends, reshape/flatten/broadcast/sum_to_like to x's own static shape, identity transpose,
     squeeze of expand_dims on the same axes) -> x. A constant only counts as the identity
     element when it neither widens x's shape nor changes its dtype.
   * stability (Theano's "stabilize"): ``log(softmax x)`` -> log_softmax; ``log(sigmoid x)`` ->
     -softplus(-x); ``log(1 - sigmoid x)`` -> -softplus(x); ``log(1 + x)`` -> log1p;
     ``exp(x) - 1`` -> expm1; ``exp(x) / sum(exp(x), axis, keepdims)`` -> softmax;
     ``binary_crossentropy(sigmoid x, t)`` -> softplus(x) - x t;
     ``categorical_crossentropy(softmax x, t)`` -> -sum(t log_softmax(x)).
2. Rules that consume a node's only reader (use counts taken at the start of the walk):
   * ``-sum/mean(onehot(labels) * log_softmax(x))`` over every axis -> ``softmax_cross_entropy``
     (normalization NONE, FULL or BATCH_SIZE as the reductions say). Labels outside the class
     range give a zero term in the pattern but an indexing error in the fused op.
   * a conv followed by inference batch_norm, a per-channel multiply (Caffe's Scale) or a
     per-channel add (Bias, or a bias add) -> one conv with folded weight and bias.

BatchNorm folding, the choice made: when the weight, bias and statistics are all constants the
folded arrays are computed here, once. When any is a parameter (or computed), the folding is
emitted as small graph nodes (``w * gain`` per output channel), evaluated on every call because a
workspace tensor may change between calls; that costs one pass over the weight instead of two
over the activation, so it is done only when the weight has no more elements than one sample's
activation (always true for the first layers of a CNN, false for the last layers of a ResNet).

Rewrites never turn a graph output into a graph input, parameter or constant (the caller would
be handed its own array back).
"""
from __future__ import annotations

from contextvars import ContextVar
from typing import Callable, Dict, Optional, Sequence

import numpy as np

from ..ir.builder import apply
from ..ir.graph import CONST, NODE, Graph, Node, Value, const_value, source_scope
from ..ops import conv as cv
from ..ops import elementwise as ew
from ..ops import loss as ls
from ..ops import nn
from ..ops import reduce as red
from ..ops import shape as shp
from ..ops.rules import normalize_axes, normalize_axis, prod_dims
from .rewrite import rewrite

Rule = Callable[[Node, Sequence[Value]], Optional[Value]]


# --------------------------------------------------------------------------- helpers

# ids of the graph's inputs while a walk runs: a value fed from outside is a leaf, even when a
# node computed it before the graph was cut there (prune's ``given``)
_CUT: ContextVar[frozenset] = ContextVar("cgvm_simplify_cut", default=frozenset())


def _made(v: Value) -> Optional[Node]:
    """The node computing ``v`` inside this graph (None for inputs, parameters and constants)."""
    return None if id(v) in _CUT.get() else v.node


def _producer(v: Value, *names: str) -> Optional[Node]:
    """The node computing ``v`` if its op is one of ``names``."""
    n = _made(v)
    return n if n is not None and n.op.name in names else None


_FILLS = {"zeros_like": 0.0, "ones_like": 1.0}   # ops whose result holds one value everywhere


def _is_const(v: Value, value: float) -> bool:
    """``v`` surely holds ``value`` everywhere: a constant, or a zeros_like/ones_like (autodiff's zero gradients)."""
    if v.kind == CONST:
        return v.data.size > 0 and bool(np.all(v.data == value))
    n = _made(v)
    return n is not None and _FILLS.get(n.op.name) == value


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


_NON_NEGATIVE = {"exp", "sqrt", "square", "abs", "sigmoid", "softplus", "softmax"}


def _non_negative(v: Value) -> bool:
    n = _made(v)
    if n is None:
        return False
    if n.op.name == "relu":
        return n.attrs["negative_slope"] == 0.0
    return n.op.name in _NON_NEGATIVE


def _build(op, inputs, attrs, node: Node) -> Value:
    """A node of ``op`` carrying the rewritten node's name and source."""
    return apply(op, list(inputs), attrs, name=node.name, source=node.source)


# --------------------------------------------------------------------------- algebra

def _mul(node, inputs):
    return _identity_operand(node, inputs, 1.0, (0, 1))


def _add(node, inputs):
    return _identity_operand(node, inputs, 0.0, (0, 1))


def _sub(node, inputs):
    x = _identity_operand(node, inputs, 0.0, (1,))
    if x is not None:
        return x
    e = _producer(inputs[0], "exp")
    if e is not None and _is_const(inputs[1], 1.0) and _passes_through(inputs[0], inputs[1], node.outputs[0]):
        return _build(ew.expm1, e.inputs, {}, node)
    return None


def _div(node, inputs):
    x = _identity_operand(node, inputs, 1.0, (1,))
    if x is not None:
        return x
    return _manual_softmax(node, inputs)


def _neg(node, inputs):
    inner = _producer(inputs[0], "neg")
    return inner.inputs[0] if inner is not None else None


def _exp(node, inputs):
    inner = _producer(inputs[0], "log")
    if inner is not None and _non_negative(inner.inputs[0]) and inner.inputs[0].type == node.outputs[0].type:
        return inner.inputs[0]
    return None


def _log(node, inputs):
    x = inputs[0]
    out = node.outputs[0]
    inner = _made(x)
    if inner is None:
        return None
    name = inner.op.name
    if name == "exp" and inner.inputs[0].type == out.type:
        return inner.inputs[0]
    if name == "softmax":
        return _build(nn.log_softmax, inner.inputs, dict(inner.attrs), node)
    if name == "sigmoid" and inner.inputs[0].type == out.type:
        return _build(ew.neg, [ew.softplus(ew.neg(inner.inputs[0]))], {}, node)
    if name == "sub" and _is_const(inner.inputs[0], 1.0) and _within(inner.inputs[0].shape, x.shape):
        s = _producer(inner.inputs[1], "sigmoid")
        if s is not None and s.inputs[0].type == out.type:
            return _build(ew.neg, [ew.softplus(s.inputs[0])], {}, node)
    if name == "add":
        a, b = inner.inputs
        for one, y in ((a, b), (b, a)):
            if _is_const(one, 1.0) and _passes_through(y, one, x) and y.dtype.is_float:
                return _build(ew.log1p, [y], {}, node)
    return None


def _manual_softmax(node, inputs):
    """exp(x) / sum(exp(x), axis=a, keepdims=True) -> softmax(x, axis=a)."""
    e, s = inputs
    en = _producer(e, "exp")
    sn = _producer(s, "sum")
    if en is None or sn is None or sn.inputs[0] is not e or not sn.attrs["keepdims"]:
        return None
    x = en.inputs[0]
    if not x.dtype.is_float or x.ndim == 0 or x.type != node.outputs[0].type:
        return None
    axes = normalize_axes(sn.attrs["axis"], x.ndim)
    if len(axes) != 1:
        return None
    return _build(nn.softmax, [x], {"axis": axes[0]}, node)


def _compose_perm(perm, ndim: int):
    return tuple(range(ndim - 1, -1, -1)) if perm is None else tuple(normalize_axis(p, ndim) for p in perm)


def _transpose(node, inputs):
    x = inputs[0]
    outer = _compose_perm(node.attrs["perm"], x.ndim)
    if outer == tuple(range(x.ndim)):
        return x
    inner = _producer(x, "transpose")
    if inner is None:
        return None
    src = inner.inputs[0]
    first = _compose_perm(inner.attrs["perm"], src.ndim)
    perm = tuple(first[p] for p in outer)
    if perm == tuple(range(src.ndim)):
        return src
    return _build(shp.transpose, [src], {"perm": perm}, node)


def _same_shape_view(x: Value, out: Value) -> bool:
    """A reshape-like view whose result surely has x's own shape (at most one unknown dimension)."""
    return out.type == x.type and sum(d is None for d in x.shape) <= 1


def _reshape(node, inputs):
    x = inputs[0]
    out = node.outputs[0]
    inner = _producer(x, "reshape")
    if inner is not None:
        src = inner.inputs[0]
        if _same_shape_view(src, out):
            return src
        if 0 not in node.attrs["shape"]:  # a 0 would copy a dimension of the inner result, not of src
            return _build(shp.reshape, [src], {"shape": node.attrs["shape"]}, node)
    return x if _same_shape_view(x, out) else None


def _shape_view(node, inputs):
    """flatten, reshape_like, broadcast_to, broadcast_like, expand_dims, squeeze, sum_to_like: identity when
    shape-preserving."""
    x = inputs[0]
    out = node.outputs[0]
    name = node.op.name
    if name == "squeeze":
        inner = _producer(x, "expand_dims")
        axis = node.attrs["axis"]
        if inner is not None and axis is not None and \
                normalize_axes(axis, x.ndim) == normalize_axes(inner.attrs["axis"], x.ndim):
            return inner.inputs[0]
    if name == "squeeze" and node.attrs["axis"] is None and not _fully_known(x.shape):
        return None  # an unknown dimension may be 1 at run time, and then it is squeezed
    if name in ("flatten", "squeeze", "expand_dims"):
        return x if out.type == x.type else None
    return x if out.type == x.type and _fully_known(x.shape) else None


def _identity(node, inputs):
    return inputs[0]


def _cast(node, inputs):
    return inputs[0] if node.attrs["dtype"] is inputs[0].dtype else None


# --------------------------------------------------------------------------- losses

def _binary_crossentropy(node, inputs):
    p, t = inputs
    s = _producer(p, "sigmoid")
    if s is None or node.attrs["eps"] != 0.0:
        return None
    x = s.inputs[0]
    if not x.dtype.is_float or x.dtype is not p.dtype:
        return None
    tf = t if t.dtype is x.dtype else ew.cast(t, dtype=x.dtype)
    return _build(ew.sub, [ew.softplus(x), ew.mul(x, tf)], {}, node)


def _categorical_crossentropy(node, inputs):
    p, t = inputs
    s = _producer(p, "softmax")
    if s is None or node.attrs["eps"] != 0.0:
        return None
    x = s.inputs[0]
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
    return _build(ew.neg, [red.sum(ew.mul(target, logp), axis=(a,))], {}, node)


# --------------------------------------------------------------------------- the local walk

LOCAL_RULES: Dict[str, Rule] = {
    "mul": _mul, "add": _add, "sub": _sub, "div": _div, "neg": _neg, "exp": _exp, "log": _log,
    "transpose": _transpose, "reshape": _reshape, "cast": _cast,
    "flatten": _shape_view, "reshape_like": _shape_view, "broadcast_to": _shape_view,
    "broadcast_like": _shape_view, "expand_dims": _shape_view, "squeeze": _shape_view, "sum_to_like": _shape_view,
    "stop_gradient": _identity, "grad_scale": _identity, "grad_clip": _identity,
    "binary_crossentropy": _binary_crossentropy, "categorical_crossentropy": _categorical_crossentropy,
}


def _guarded(graph: Graph, rules: Dict[str, Rule], on_replace=None) -> Callable:
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
    n = _made(v)
    if n is None or v.type != x.type:
        return None
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
        n = _made(v)
        if n is None or not sole(v):
            return None
        ins = list(n.inputs)
        if n.op.name == "mul":
            break
    if sign != -1 or not sole(v):
        return None
    for logp, onehot in ((ins[0], ins[1]), (ins[1], ins[0])):
        ln = _producer(logp, "log_softmax")
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
        return _build(ls.softmax_cross_entropy, [x, labels], {"axis": axis, "normalization": norm}, node)
    return None


# --------------------------------------------------------------------------- folding into convolutions

def _per_channel(v: Value, out: Value) -> Optional[int]:
    """The channel count when ``v`` broadcasts against the NCHW ``out`` as one value per channel."""
    c = out.shape[1]
    k = v.ndim - (out.ndim - 1)   # v's dimension that lines up with the channel axis
    if c is None or k < 0 or v.shape[k] != c or v.dtype is not out.dtype:
        return None
    if any(d != 1 for i, d in enumerate(v.shape) if i != k):
        return None
    return c


def _channel_vector(v: Value, c: int) -> Value:
    """``v`` (one value per channel) as a (c,) vector, looking through reshapes that made it."""
    while v.shape != (c,):
        inner = _producer(v, "reshape")
        if inner is None or inner.inputs[0].type.size != c:
            return shp.reshape(v, shape=(c,))
        v = inner.inputs[0]
    return v


def _cheap_to_scale(w: Value, out: Value) -> bool:
    """Scaling the weight every call costs less than one pass over a sample's activation."""
    per_sample = prod_dims(out.shape[1:])
    return w.type.size is not None and per_sample is not None and w.type.size <= per_sample


def _rebuilt_conv(conv: Node, node: Node, w: Value, b: Optional[Value]) -> Value:
    x = conv.inputs[0]
    return _build(cv.conv, [x, w] + ([b] if b is not None else []), dict(conv.attrs), node)


def _fold_scale_shift(conv: Node, node: Node, scale: Optional[Value], shift: Optional[Value]) -> Optional[Value]:
    """conv(x, w, b) * scale + shift (per output channel, (C,) values) as one conv."""
    w = conv.inputs[1]
    b = conv.inputs[2] if len(conv.inputs) > 2 else None
    y = conv.outputs[0]
    if w.shape[0] is None:
        return None
    parts = [w, scale, shift] + ([b] if b is not None else [])
    if all(p is None or p.kind == CONST for p in parts):
        dt = w.dtype.np
        c = w.shape[0]
        s = np.ones(c) if scale is None else scale.data.astype(np.float64)
        new_w = w.data.astype(np.float64) * s.reshape((c,) + (1,) * (w.ndim - 1))
        new_b = (np.zeros(c) if b is None else b.data.astype(np.float64)) * s
        if shift is not None:
            new_b = new_b + shift.data
        return _rebuilt_conv(conv, node, const_value(new_w.astype(dt)), const_value(new_b.astype(dt)))
    if scale is not None and not _cheap_to_scale(w, y):
        return None
    new_w, new_b = w, b
    if scale is not None:
        new_w = ew.mul(w, shp.reshape(scale, shape=(w.shape[0],) + (1,) * (w.ndim - 1)))
        new_b = None if b is None else ew.mul(b, scale)
    if shift is not None:
        new_b = shift if new_b is None else ew.add(new_b, shift)
    return _rebuilt_conv(conv, node, new_w, new_b)


def _conv_input(v: Value, sole: Callable[[Value], bool]) -> Optional[Node]:
    conv = _producer(v, "conv")
    return conv if conv is not None and sole(v) and v.ndim >= 3 else None


def _fold_batch_norm(node, inputs, sole):
    if node.attrs["training"] or len(node.outputs) != 1:
        return None
    conv = _conv_input(inputs[0], sole)
    if conv is None or normalize_axis(node.attrs["axis"], inputs[0].ndim) != 1:
        return None
    mean, var = inputs[1], inputs[2]
    gamma = inputs[3] if len(inputs) > 3 else None
    beta = inputs[4] if len(inputs) > 4 else None
    stats = [mean, var] + [v for v in (gamma, beta) if v is not None]
    eps = node.attrs["eps"]
    if all(v.kind == CONST for v in stats):
        gain = 1.0 / np.sqrt(var.data.astype(np.float64) + eps)
        if gamma is not None:
            gain = gain * gamma.data
        shift = -mean.data * gain + (0.0 if beta is None else beta.data)
        dt = var.dtype.np
        return _fold_scale_shift(conv, node, const_value(gain.astype(dt)), const_value(shift.astype(dt)))
    gain = ew.rsqrt(ew.add(var, eps))
    if gamma is not None:
        gain = ew.mul(gain, gamma)
    shift = ew.neg(ew.mul(mean, gain))
    if beta is not None:
        shift = ew.add(shift, beta)
    return _fold_scale_shift(conv, node, gain, shift)


def _fold_channel_op(node, inputs, sole):
    """conv * per-channel scale, conv + per-channel shift (either operand order) -> conv."""
    out = node.outputs[0]
    for k in (0, 1):
        conv = _conv_input(inputs[k], sole)
        other = inputs[1 - k]
        if conv is None or out.type != inputs[k].type:
            continue
        c = _per_channel(other, out)
        if c is None:
            continue
        vec = const_value(other.data.reshape(c)) if other.kind == CONST else _channel_vector(other, c)
        if node.op.name == "mul":
            return _fold_scale_shift(conv, node, vec, None)
        return _fold_scale_shift(conv, node, None, vec)
    return None


_COUNTED_ANCHORS = ("conv", "log_softmax")   # every counted rule needs one of these in the graph
COUNTED_RULES = {"neg": _cross_entropy, "sum": _cross_entropy, "mean": _cross_entropy,
                 "batch_norm": _fold_batch_norm, "mul": _fold_channel_op, "add": _fold_channel_op}


# --------------------------------------------------------------------------- the pass

def simplify(graph: Graph) -> Graph:
    """Algebraic simplification and stable forms, then the rewrites that take over a node's only reader."""
    token = _CUT.set(frozenset(id(v) for v in graph.inputs))
    try:
        return _simplify(graph)
    finally:
        _CUT.reset(token)


def _simplify(graph: Graph) -> Graph:
    graph = rewrite(graph, _guarded(graph, LOCAL_RULES))
    if not any(n.op.name in _COUNTED_ANCHORS for n in graph.nodes):
        return graph
    counts = {k: len(v) for k, v in graph.consumers().items()}
    outputs = {id(v) for v in graph.outputs}
    origin: Dict[int, int] = {}   # id(rewritten value) -> id(the value it replaces), for use counts

    def sole(v: Value) -> bool:
        key = origin.get(id(v), id(v))
        return _made(v) is not None and key not in outputs and counts.get(key, 0) == 1

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

