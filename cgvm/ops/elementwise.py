"""Elementwise ops with NumPy broadcasting: arithmetic, math functions, activations, comparisons, logic, casts.

Gradients of broadcasting ops reduce back to each input's shape with ``sum_to_like``.
"""
from __future__ import annotations

from ..ir.attrs import DTypeAttr, Float
from ..ir.types import TensorType
from . import reduce as red
from .registry import BROADCAST, ELEMWISE, defop
from .rules import broadcast_infer, same_as_input


def _unbroadcast(g, x):
    """Gradient ``g`` summed down to the shape of input ``x`` (a no-op when shapes agree)."""
    if g is None:
        return None
    if g.shape == x.shape and None not in x.shape:
        return g
    return red.sum_to_like(g, x)


# --------------------------------------------------------------------------- arithmetic

add = defop("add", num_inputs=2, pattern=BROADCAST, infer=broadcast_infer, inplace=((0, 0), (1, 0)), ufunc="add")


@add.grad
def _(node, g):
    a, b = node.inputs
    return [_unbroadcast(g, a), _unbroadcast(g, b)]


sub = defop("sub", num_inputs=2, pattern=BROADCAST, infer=broadcast_infer, inplace=((0, 0), (1, 0)), ufunc="subtract")


@sub.grad
def _(node, g):
    a, b = node.inputs
    return [_unbroadcast(g, a), _unbroadcast(neg(g), b)]


mul = defop("mul", num_inputs=2, pattern=BROADCAST, infer=broadcast_infer, inplace=((0, 0), (1, 0)), ufunc="multiply")


@mul.grad
def _(node, g):
    a, b = node.inputs
    return [_unbroadcast(mul(g, b), a), _unbroadcast(mul(g, a), b)]


neg = defop("neg", pattern=ELEMWISE, infer=same_as_input, inplace=((0, 0),), ufunc="negative")


@neg.grad
def _(node, g):
    return [neg(g)]


exp = defop("exp", pattern=ELEMWISE, infer=same_as_input, inplace=((0, 0),), ufunc="exp")


@exp.grad
def _(node, g):
    return [mul(g, node.outputs[0])]


tanh = defop("tanh", pattern=ELEMWISE, infer=same_as_input, inplace=((0, 0),), ufunc="tanh")


@tanh.grad
def _(node, g):
    y = node.outputs[0]
    return [mul(g, sub(1.0, mul(y, y)))]


relu = defop("relu", pattern=ELEMWISE, infer=same_as_input, inplace=((0, 0),),
             attrs={"negative_slope": Float(0.0)})


@relu.kernel_factory
def _(xp, negative_slope):
    if negative_slope == 0.0:
        def relu0(x, out=None):
            return xp.maximum(x, 0, out=out)
        return relu0

    def leaky(x, out=None):
        return xp.where(x > 0, x, x * xp.asarray(negative_slope, x.dtype)) if out is None else \
            _assign(xp, out, xp.where(x > 0, x, x * xp.asarray(negative_slope, x.dtype)))
    return leaky


def _assign(xp, out, value):
    out[...] = value
    return out


@relu.grad
def _(node, g):
    x = node.inputs[0]
    return [relu_grad(g, x, negative_slope=node.attrs["negative_slope"])]


relu_grad = defop("relu_grad", num_inputs=2, pattern=ELEMWISE, infer=same_as_input, inplace=((0, 0),),
                  attrs={"negative_slope": Float(0.0)})


@relu_grad.kernel
def _(xp, g, x, *, negative_slope, out=None):
    slope = xp.asarray(negative_slope, g.dtype)
    r = xp.where(x > 0, g, g * slope)
    if out is None:
        return r
    out[...] = r
    return out


@relu_grad.grad
def _(node, gg):
    g, x = node.inputs
    return [relu_grad(gg, x, negative_slope=node.attrs["negative_slope"]), None]


cast = defop("cast", pattern=ELEMWISE, attrs={"dtype": DTypeAttr()},
             infer=lambda types, dtype: TensorType(types[0].shape, dtype))


@cast.kernel_factory
def _(xp, dtype):
    npd = dtype.np

    def cast_kernel(x, out=None):
        if out is None:
            return x.astype(npd)
        out[...] = x
        return out
    return cast_kernel


@cast.grad
def _(node, g):
    x = node.inputs[0]
    if not x.dtype.is_float:
        return [None]
    return [cast(g, dtype=x.dtype)]
