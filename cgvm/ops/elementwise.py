"""Elementwise ops with NumPy broadcasting: arithmetic, comparisons, logic, selection, rounding, casts.

Math functions and activations (exp, log, tanh, sigmoid, relu, erf, ...) live in
``elementwise_math``, special functions (gamma, digamma, erfinv, ...) in ``elementwise_special``;
both are re-exported here, so ``ew.exp`` and ``ew.add`` are found alike.

Dtypes follow NumPy exactly: an op that is one NumPy ufunc takes its result dtype from that
ufunc's own type resolution (``int // int`` is int, ``int / int`` is float64, ``exp(int8)`` is
float16, ``-bool`` is an error), so the ``ufunc=`` fast path and the declared type always agree.
Gradients of broadcasting ops reduce back to each input's shape with ``sum_to_like``.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

from ..ir.attrs import DTypeAttr, Float, Int
from ..ir.types import DType, TensorType, result_dtype
from . import reduce as red
from . import shape as shp
from .registry import BROADCAST, ELEMWISE, defop, same_type_as_input
from .rules import assign_out as _assign, broadcast_shapes
from . import loop_code as lc
from .ufunc_steps import ACC, float_in_and_out, lit

# --------------------------------------------------------------------------- helpers


@functools.lru_cache(maxsize=None)
def ufunc_result_dtype(ufunc_name: str, dtypes: Tuple[DType, ...]) -> DType:
    """The dtype NumPy's ufunc ``ufunc_name`` gives for inputs of ``dtypes`` (TypeError if it has no loop)."""
    ufunc = getattr(np, ufunc_name)
    try:
        resolved = ufunc.resolve_dtypes(tuple(d.np for d in dtypes) + (None,) * ufunc.nout)
    except TypeError as exc:  # NumPy's message names the operator and what to use instead
        names = ", ".join(d.name for d in dtypes)
        raise TypeError(f"{ufunc_name} is not defined for {names}: {exc}") from None
    return DType(resolved[-1])


def ufunc_rule(ufunc_name: str) -> Callable[..., TensorType]:
    """A type rule: inputs broadcast, dtype as NumPy's ``ufunc_name`` resolves it."""
    def infer(types: Sequence[TensorType], **_: object) -> TensorType:
        shape = types[0].shape if len(types) == 1 else broadcast_shapes(*[t.shape for t in types])
        return TensorType(shape, ufunc_result_dtype(ufunc_name, tuple(t.dtype for t in types)))
    infer.__name__ = f"{ufunc_name}_rule"
    return infer


def _unbroadcast(g, x):
    """Gradient ``g`` summed down to the shape of input ``x`` (a no-op when shapes agree)."""
    if g is None:
        return None
    if g.shape == x.shape and None not in x.shape:
        return g
    return red.sum_to_like(g, x)


def _masked(g, mask):
    """``g`` where ``mask`` holds, else 0 (``where`` rather than a product, so inf/nan elsewhere stay out)."""
    return where(mask, g, shp.zeros_like(g))




def _binary(name: str, ufunc: str, **kwargs):
    return defop(name, num_inputs=2, pattern=BROADCAST, infer=ufunc_rule(ufunc), inplace=((0, 0), (1, 0)),
                 ufunc=ufunc, **kwargs)


def _unary(name: str, ufunc: str, **kwargs):
    return defop(name, pattern=ELEMWISE, infer=ufunc_rule(ufunc), inplace=((0, 0),), ufunc=ufunc, **kwargs)


# --------------------------------------------------------------------------- arithmetic

add = _binary("add", "add")


@add.grad
def _(node, g):
    a, b = node.inputs
    return [_unbroadcast(g, a), _unbroadcast(g, b)]


def add_n(terms: Sequence[Any]) -> Optional[Any]:
    """The sum of ``terms`` left to right, ``((t0 + t1) + t2) + ...`` (None for no terms; None terms
    are skipped): the one place frontends, solvers and autodiff total a list of values. It builds
    ``add`` nodes, so fusion and simplification see an ordinary chain of adds."""
    total = None
    for term in terms:
        if term is not None:
            total = term if total is None else add(total, term)
    return total


sub = _binary("sub", "subtract")


@sub.grad
def _(node, g):
    a, b = node.inputs
    return [_unbroadcast(g, a), _unbroadcast(neg(g), b)]


mul = _binary("mul", "multiply")


@mul.grad
def _(node, g):
    a, b = node.inputs
    return [_unbroadcast(mul(g, b), a), _unbroadcast(mul(g, a), b)]


div = _binary("div", "divide", doc="True division; integer inputs give float64, as in NumPy.")


@div.grad
def _(node, g):
    a, b = node.inputs
    y = node.outputs[0]
    ga = div(g, b)
    return [_unbroadcast(ga, a), _unbroadcast(neg(mul(ga, y)), b)]


floordiv = _binary("floordiv", "floor_divide", differentiable=False,
                   doc="Floor division with Python/NumPy semantics (rounds toward minus infinity).")

mod = _binary("mod", "remainder", doc="Remainder with the sign of the divisor (Python/NumPy semantics).")


@mod.grad
def _(node, g):
    # a mod b = a - floor(a / b) * b, and floor is piecewise constant
    a, b = node.inputs
    return [_unbroadcast(g, a), _unbroadcast(neg(mul(g, floordiv(a, b))), b)]


neg = _unary("neg", "negative")


@neg.grad
def _(node, g):
    return [neg(g)]


pow = _binary("pow", "power")


@pow.grad
def _(node, g):
    a, b = node.inputs
    y = node.outputs[0]
    ga = mul(g, mul(b, pow(a, sub(b, 1))))
    # d/db a**b = a**b log a, taken as 0 where a <= 0 (there a**b is only defined for integral b)
    log_a = ew_math.log(where(gt(a, 0), a, shp.ones_like(a)))
    gb = mul(g, mul(y, log_a))
    return [_unbroadcast(ga, a), _unbroadcast(gb, b)]


square = _unary("square", "square", nonnegative=True)


@square.grad
def _(node, g):
    return [mul(g, mul(node.inputs[0], 2))]


reciprocal = _unary("reciprocal", "reciprocal", doc="1 / x; integer inputs stay integer, as in NumPy.")


@reciprocal.grad
def _(node, g):
    y = node.outputs[0]
    return [neg(mul(g, mul(y, y)))]


abs = _unary("abs", "absolute", nonnegative=True)


@abs.grad
def _(node, g):
    return [mul(g, sign(node.inputs[0]))]


sign = _unary("sign", "sign", differentiable=False)


# --------------------------------------------------------------------------- maximum / minimum / clip / where


def _extreme_grad(node, g, larger: bool):
    """Gradient of maximum/minimum: to the winning input; on ties each input gets half.

    Half on ties is the symmetric choice, and it is what a central difference measures there.
    """
    a, b = node.inputs
    wins = gt(a, b) if larger else lt(a, b)
    share_a = add(cast(wins, dtype=g.dtype), mul(cast(eq(a, b), dtype=g.dtype), 0.5))
    ga = mul(g, share_a)
    return [_unbroadcast(ga, a), _unbroadcast(sub(g, ga), b)]


maximum = _binary("maximum", "maximum", doc="Elementwise larger; the gradient splits ties equally.")
maximum.grad(lambda node, g: _extreme_grad(node, g, larger=True))

minimum = _binary("minimum", "minimum", doc="Elementwise smaller; the gradient splits ties equally.")
minimum.grad(lambda node, g: _extreme_grad(node, g, larger=False))


def _clip_infer(types, lo, hi):
    if len(types) == 1:
        return types[0]
    if len(types) != 3:
        raise ValueError("clip takes x alone (bounds as attributes lo, hi) or x, lo, hi as tensors")
    if lo is not None or hi is not None:
        raise ValueError("clip with tensor bounds takes no lo/hi attributes")
    return TensorType(broadcast_shapes(*[t.shape for t in types]), result_dtype(*[t.dtype for t in types]))


clip = defop("clip", num_inputs=(1, 3), pattern=BROADCAST, inplace=((0, 0),), infer=_clip_infer,
             attrs={"lo": Float(None), "hi": Float(None)},
             doc="x limited to [lo, hi]: bounds as attributes (None = unbounded), or as tensors clip(x, lo, hi) "
                 "that broadcast. Integer x takes the integers inside float bounds (ceil lo, floor hi). "
                 "The gradient passes where lo <= x <= hi, bounds included.")


def _int_bound(bound: Optional[float], dtype, up: bool) -> Optional[int]:
    """A float bound as the nearest integer inside it (rounded up for lo), within the dtype's range."""
    if bound is None:
        return None
    info = np.iinfo(dtype)
    v = math.ceil(bound) if up else math.floor(bound)
    return min(max(v, int(info.min)), int(info.max))


@clip.lowering
def _(node):
    if len(node.inputs) != 1 or not float_in_and_out(node):
        return None
    dtype, lo, hi = node.outputs[0].dtype, node.attrs["lo"], node.attrs["hi"]
    steps = []
    if lo is not None:
        steps.append(("maximum", (0, lit(lo, dtype))))
    if hi is not None:
        steps.append(("minimum", (ACC if steps else 0, lit(hi, dtype))))
    return steps or None


@clip.kernel_factory
def _(xp, lo, hi):
    def clip_kernel(x, lo_t=None, hi_t=None, out=None):
        if lo_t is not None:  # tensor bounds; maximum first, so lo > hi gives hi as np.clip does
            r = xp.minimum(xp.maximum(x, lo_t), hi_t, out=out)
            return r if out is not None else xp.asarray(r)
        lo_v, hi_v = lo, hi
        if x.dtype.kind in "iu":
            lo_v, hi_v = _int_bound(lo, x.dtype, up=True), _int_bound(hi, x.dtype, up=False)
        src = x
        if lo_v is not None:
            src = xp.maximum(src, xp.asarray(lo_v, dtype=x.dtype), out=out)
        if hi_v is not None:
            src = xp.minimum(src, xp.asarray(hi_v, dtype=x.dtype), out=out)
        if src is x:  # no bounds at all
            return _assign(xp, out, x.copy())
        return src
    return clip_kernel


@clip.grad
def _(node, g):
    x = node.inputs[0]
    if len(node.inputs) == 1:
        lo, hi = node.attrs["lo"], node.attrs["hi"]
        inside = None
        if lo is not None:
            inside = ge(x, lo)
        if hi is not None:
            below = le(x, hi)
            inside = below if inside is None else logical_and(inside, below)
        return [g if inside is None else _masked(g, inside)]
    lo, hi = node.inputs[1:]
    capped = gt(maximum(x, lo), hi)
    not_capped = logical_not(capped)
    from_x = logical_and(ge(x, lo), not_capped)
    from_lo = logical_and(lt(x, lo), not_capped)
    return [_unbroadcast(_masked(g, from_x), x), _unbroadcast(_masked(g, from_lo), lo),
            _unbroadcast(_masked(g, capped), hi)]


def _where_infer(types):
    c, a, b = types
    return TensorType(broadcast_shapes(c.shape, a.shape, b.shape), result_dtype(a.dtype, b.dtype))


where = defop("where", num_inputs=3, pattern=BROADCAST, infer=_where_infer, inplace=((1, 0), (2, 0)),
              doc="a where cond holds (any dtype, as truth values), else b; all three broadcast.")


@where.kernel
def _(xp, cond, a, b, out=None):
    return _assign(xp, out, xp.where(cond, a, b))


@where.grad
def _(node, g):
    c, a, b = node.inputs
    zero = shp.zeros_like(g)
    return [None, _unbroadcast(where(c, g, zero), a), _unbroadcast(where(c, zero, g), b)]


# --------------------------------------------------------------------------- comparisons and logic

eq = _binary("eq", "equal", differentiable=False)
ne = _binary("ne", "not_equal", differentiable=False)
lt = _binary("lt", "less", differentiable=False)
le = _binary("le", "less_equal", differentiable=False)
gt = _binary("gt", "greater", differentiable=False)
ge = _binary("ge", "greater_equal", differentiable=False)

logical_and = _binary("logical_and", "logical_and", differentiable=False)
logical_or = _binary("logical_or", "logical_or", differentiable=False)
logical_xor = _binary("logical_xor", "logical_xor", differentiable=False)
logical_not = _unary("logical_not", "logical_not", differentiable=False)

# on integers bit by bit, on bools the logical operation (NumPy's ufuncs); floats have no such loop
bitwise_and = _binary("bitwise_and", "bitwise_and", differentiable=False)
bitwise_or = _binary("bitwise_or", "bitwise_or", differentiable=False)
bitwise_xor = _binary("bitwise_xor", "bitwise_xor", differentiable=False)
invert = _unary("invert", "invert", differentiable=False, doc="~x: bitwise NOT of integers, logical NOT of bools.")


# --------------------------------------------------------------------------- rounding

floor = _unary("floor", "floor", differentiable=False)
ceil = _unary("ceil", "ceil", differentiable=False)

round = defop("round", pattern=ELEMWISE, infer=lambda types, decimals: types[0], inplace=((0, 0),),
              differentiable=False, attrs={"decimals": Int(0)},
              doc="Round half to even (as NumPy) to ``decimals`` places; integers stay integers.")


@round.kernel
def _(xp, x, *, decimals, out=None):
    r = xp.round(x, decimals, out=out)
    return r if out is not None else xp.asarray(r)


# --------------------------------------------------------------------------- casts

cast = defop("cast", pattern=ELEMWISE, attrs={"dtype": DTypeAttr()},
             infer=lambda types, dtype: TensorType(types[0].shape, dtype))


cast.identity_when(same_type_as_input)


@cast.kernel_factory
def _(xp, dtype):
    npd = dtype.np

    def cast_kernel(x, out=None):
        if out is None:
            return x.astype(npd)
        out[...] = x
        return out
    return cast_kernel


@cast.numba_lowering
def _(node, em, ins, outs):
    # a float to an integer or bool converts as C does, not as NumPy's astype: only widening,
    # narrowing between floats and integer to float are written
    src, dst = ins[0].dtype, outs[0].dtype
    if not dst.is_float and src.is_float:
        return False
    lc.copy(em, ins[0], outs[0]) if src is dst else lc.elementwise(em, [("positive", (0,))], ins, outs[0])
    return None


@cast.grad
def _(node, g):
    x = node.inputs[0]
    if not x.dtype.is_float:
        return [None]
    return [cast(g, dtype=x.dtype)]


# math functions, activations and special functions: declared in their own files, found here too
from . import elementwise_math as ew_math  # noqa: E402
from .elementwise_math import (  # noqa: E402,F401
    arccos, arccosh, arcsin, arcsinh, arctan, arctan2, arctanh, cos, cosh, elu, erf, exp, expm1, log, log1p, log2,
    log10, relu, relu_grad, rsqrt, sigmoid, sin, sinh, softplus, sqrt, tan, tanh)
from .elementwise_special import digamma, erfinv, gamma, gammaln, polygamma  # noqa: E402,F401
