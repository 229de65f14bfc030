"""Reductions over axes (sum, mean, prod, max, min, var, std, logsumexp, argmax, argmin), cumsum,
sum_squares (a full sum of x * x, one BLAS dot), and sum_to_like, the adjoint of broadcasting.

``axis`` is an int, a tuple of ints (negative allowed) or None for all axes; ``keepdims`` keeps
reduced axes as size 1. Dtypes follow NumPy: sum/prod/cumsum of bool or small integers give
int64 (uint64 for unsigned), mean/var/std of integers give float64, argmax/argmin give int64.
Gradient rules are built from ops, so they can be differentiated again.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import numpy as np

from ..ir.attrs import Bool, DTypeAttr, Int, Ints
from ..ir.graph import Value
from ..ir.types import DType, TensorType, float64, int64
from . import elementwise as ew
from . import shape as shp
from . import loop_code as lc
from .registry import OPAQUE, defop, same_type_as_input
from .rules import normalize_axes, normalize_axis, prod_dims, reduce_shape

_AXIS_ATTRS = {"axis": Ints(None), "keepdims": Bool(False)}
_BLAS_DOT = (np.dtype(np.float32), np.dtype(np.float64))   # np.dot of these vectors is BLAS sdot/ddot


def accumulation_dtype(dtype: DType) -> DType:
    """The dtype NumPy's sum/prod/cumsum give: bool and integers narrower than 64 bits widen."""
    if dtype.is_bool or (dtype.kind == "i" and dtype.itemsize < 8):
        return int64
    if dtype.kind == "u" and dtype.itemsize < 8:
        return DType("uint64")
    return dtype


def mean_dtype(dtype: DType) -> DType:
    """The dtype NumPy's mean/var/std give: floats keep theirs, everything else is float64."""
    return dtype if dtype.is_float else float64


def _reduce_rule(dtype_rule=None):
    def infer(types, axis, keepdims, **_):
        t = types[0]
        return TensorType(reduce_shape(t.shape, axis, keepdims), t.dtype if dtype_rule is None else dtype_rule(t.dtype))
    return infer


def _as_array(xp, r, out):
    """NumPy reductions to 0-d hand back scalars; kernels hand back arrays."""
    return r if out is not None else xp.asarray(r)


_UFUNCS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


def _reduced(xp, name, x, axis, keepdims, out=None):
    """``xp.<name>(x, axis=..., keepdims=..., out=...)`` as an array. For NumPy float arrays the
    ufunc's own reduce, which np.sum and np.max call after a Python wrapper that costs as much again
    on a loss's or a bias's few values (about 8 -> 4 us); the same bits."""
    if type(x) is np.ndarray and x.dtype.kind == "f":
        return _as_array(xp, _UFUNCS[name].reduce(x, axis=axis, keepdims=keepdims, out=out), out)
    return _as_array(xp, getattr(xp, name)(x, axis=axis, keepdims=keepdims, out=out), out)


def _keepdims_grad(node, g):
    """The output gradient with the reduced axes put back as size 1, ready to broadcast against x."""
    if node.attrs["keepdims"]:
        return g
    axes = normalize_axes(node.attrs["axis"], node.inputs[0].ndim)
    return shp.expand_dims(g, axis=axes) if axes else g


def _keepdims_output(node):
    """The node's output with reduced axes kept (to compare or combine with x)."""
    y = node.outputs[0]
    if node.attrs["keepdims"]:
        return y
    axes = normalize_axes(node.attrs["axis"], node.inputs[0].ndim)
    return shp.expand_dims(y, axis=axes) if axes else y


def reduced_count(x: Value, axis: Optional[Sequence[int]], dtype: DType) -> Union[float, Value]:
    """How many elements of ``x`` each output of a reduction over ``axis`` combines.

    A Python number when those dimensions are known, else a 0-d ``reduce_count`` node.
    """
    axes = normalize_axes(axis, x.ndim)
    n = prod_dims([x.shape[a] for a in axes])
    return float(n) if n is not None else reduce_count(x, axis=axis, dtype=dtype)


# --------------------------------------------------------------------------- sum, mean, prod

sum = defop("sum", attrs=_AXIS_ATTRS, infer=_reduce_rule(accumulation_dtype))


@sum.kernel
def _(xp, x, *, axis, keepdims, out=None):
    axes = None if axis is None or x.ndim == 0 else {a % x.ndim for a in axis}
    if (axes is not None and len(axes) > 1 and 0 in axes and x.ndim > 2 and x.dtype.kind == "f"
            and x.dtype.itemsize >= 4 and x.flags.c_contiguous):
        # the batch axis first, as whole-sample adds: NumPy's one multi-axis call walks short runs
        # (a conv bias gradient over (0, 2, 3) of 64x20x24x24: 387 -> 207 us)
        rest = tuple(sorted(a - (not keepdims) for a in axes if a != 0))
        return _reduced(xp, "sum", _reduced(xp, "sum", x, 0, keepdims), rest, keepdims, out)
    return _reduced(xp, "sum", x, axis, keepdims, out)


@sum.grad
def _(node, g):
    return [shp.broadcast_like(_keepdims_grad(node, g), node.inputs[0])]


mean = defop("mean", attrs=_AXIS_ATTRS, infer=_reduce_rule(mean_dtype))


@mean.kernel
def _(xp, x, *, axis, keepdims, out=None):
    if type(x) is np.ndarray and x.dtype in _BLAS_DOT and x.size:
        # np.mean's own steps (a sum, then a true divide by the count) without its Python wrapper,
        # which costs 4x the work on a loss's few values (10 -> 2.5 us); same bits
        total = np.add.reduce(x, axis=axis, keepdims=keepdims, out=out)
        count = x.size // total.size
        if type(total) is np.ndarray:
            return np.true_divide(total, count, out=total)
        return np.asarray(total / count, dtype=x.dtype)
    return _as_array(xp, xp.mean(x, axis=axis, keepdims=keepdims, out=out), out)


@mean.grad
def _(node, g):
    x = node.inputs[0]
    spread = shp.broadcast_like(_keepdims_grad(node, g), x)
    return [ew.div(spread, reduced_count(x, node.attrs["axis"], g.dtype))]


prod = defop("prod", attrs=_AXIS_ATTRS, infer=_reduce_rule(accumulation_dtype))


@prod.kernel
def _(xp, x, *, axis, keepdims, out=None):
    return _as_array(xp, xp.prod(x, axis=axis, keepdims=keepdims, out=out), out)


@prod.grad
def _(node, g):
    # d prod / d x_i is the product of the other entries. Dividing y by x_i fails at zeros, so
    # count the zeros: none -> p / x_i; one -> p at the zero and 0 elsewhere; more -> 0, where p
    # is the product of the non-zero entries. Second derivatives are exact away from zeros.
    x = node.inputs[0]
    axis = node.attrs["axis"]
    is_zero = ew.eq(x, 0)
    nonzero = ew.where(is_zero, shp.ones_like(x), x)
    p = prod(nonzero, axis=axis, keepdims=True)
    zeros = sum(ew.cast(is_zero, dtype=x.dtype), axis=axis, keepdims=True)
    at_only_zero = ew.where(ew.logical_and(is_zero, ew.eq(zeros, 1)), p, shp.zeros_like(x))
    others = ew.where(ew.eq(zeros, 0), ew.div(p, nonzero), at_only_zero)
    return [ew.mul(_keepdims_grad(node, g), others)]


# --------------------------------------------------------------------------- max, min


def _extreme_grad(node, g):
    """Gradient of max/min: shared equally among the entries equal to the result (ties split)."""
    x = node.inputs[0]
    hit = ew.cast(ew.eq(x, _keepdims_output(node)), dtype=g.dtype)
    ties = sum(hit, axis=node.attrs["axis"], keepdims=True)
    return [ew.mul(_keepdims_grad(node, g), ew.div(hit, ties))]


max = defop("max", attrs=_AXIS_ATTRS, infer=_reduce_rule(),
            doc="Largest entry; the gradient goes to the largest entries, split equally among ties.")


@max.kernel
def _(xp, x, *, axis, keepdims, out=None):
    return _reduced(xp, "max", x, axis, keepdims, out)


max.grad(_extreme_grad)

min = defop("min", attrs=_AXIS_ATTRS, infer=_reduce_rule(),
            doc="Smallest entry; the gradient goes to the smallest entries, split equally among ties.")


@min.kernel
def _(xp, x, *, axis, keepdims, out=None):
    return _reduced(xp, "min", x, axis, keepdims, out)


min.grad(_extreme_grad)


# --------------------------------------------------------------------------- argmax, argmin


def _arg_infer(types, axis, keepdims):
    t = types[0]
    if axis is None:
        shape: Tuple = (1,) * t.ndim if keepdims else ()
    else:
        shape = reduce_shape(t.shape, (normalize_axis(axis, t.ndim),), keepdims)
    return TensorType(shape, int64)


def _arg_kernel(name: str):
    def kernel(xp, x, *, axis, keepdims, out=None):
        r = getattr(xp, name)(x, axis=axis, keepdims=keepdims)
        if r.dtype != xp.int64:  # intp is 32 bits on some platforms
            r = r.astype(xp.int64)
        return ew._assign(xp, out, r)
    return kernel


argmax = defop("argmax", differentiable=False, attrs={"axis": Int(None), "keepdims": Bool(False)},
               infer=_arg_infer, doc="Index (int64) of the first largest entry along axis; axis None: of x flattened.")
argmax.kernel(_arg_kernel("argmax"))

argmin = defop("argmin", differentiable=False, attrs={"axis": Int(None), "keepdims": Bool(False)},
               infer=_arg_infer, doc="Index (int64) of the first smallest entry along axis; axis None: of x flattened.")
argmin.kernel(_arg_kernel("argmin"))


# --------------------------------------------------------------------------- var, std, logsumexp

_MOMENT_ATTRS = {"axis": Ints(None), "keepdims": Bool(False), "ddof": Int(0)}

var = defop("var", attrs=_MOMENT_ATTRS, infer=_reduce_rule(mean_dtype),
            doc="Variance: mean squared deviation, divided by N - ddof.")


@var.kernel
def _(xp, x, *, axis, keepdims, ddof, out=None):
    return _as_array(xp, xp.var(x, axis=axis, ddof=ddof, keepdims=keepdims, out=out), out)


def _centered_over_dof(node, dtype):
    """(x - mean(x)) / (N - ddof), the shared part of the var and std gradients."""
    x = node.inputs[0]
    axis = node.attrs["axis"]
    centered = ew.sub(x, mean(x, axis=axis, keepdims=True))
    n = reduced_count(x, axis, dtype)
    dof = n - node.attrs["ddof"] if isinstance(n, float) else ew.sub(n, node.attrs["ddof"])
    return ew.div(centered, dof)


@var.grad
def _(node, g):
    return [ew.mul(ew.mul(_keepdims_grad(node, g), 2), _centered_over_dof(node, g.dtype))]


std = defop("std", attrs=_MOMENT_ATTRS, infer=_reduce_rule(mean_dtype),
            doc="Standard deviation: sqrt(var(x, ddof)).")


@std.kernel
def _(xp, x, *, axis, keepdims, ddof, out=None):
    return _as_array(xp, xp.std(x, axis=axis, ddof=ddof, keepdims=keepdims, out=out), out)


@std.grad
def _(node, g):
    # d std = d var / (2 std)
    return [ew.mul(ew.div(_keepdims_grad(node, g), _keepdims_output(node)), _centered_over_dof(node, g.dtype))]


logsumexp = defop("logsumexp", attrs=_AXIS_ATTRS, infer=_reduce_rule(mean_dtype),
                  doc="log(sum(exp(x))), shifted by the maximum so that no exp overflows.")


@logsumexp.kernel
def _(xp, x, *, axis, keepdims, out=None):
    if x.dtype.kind != "f":
        x = x.astype(xp.float64)
    shift = xp.max(x, axis=axis, keepdims=True)
    shift = xp.where(xp.isfinite(shift), shift, 0)  # all -inf (or an inf) along the axis: no shift
    total = xp.sum(xp.exp(x - shift), axis=axis, keepdims=True)
    r = xp.log(total) + shift
    if not keepdims:
        r = r.reshape(reduce_shape(x.shape, axis, False))
    return ew._assign(xp, out, r)


@logsumexp.grad
def _(node, g):
    # the softmax of x along the reduced axes
    x = node.inputs[0]
    return [ew.mul(_keepdims_grad(node, g), ew.exp(ew.sub(x, _keepdims_output(node))))]


# --------------------------------------------------------------------------- cumsum


def _cumsum_infer(types, axis, reverse):
    t = types[0]
    dtype = accumulation_dtype(t.dtype)
    if axis is None:
        return TensorType((prod_dims(t.shape),), dtype)
    normalize_axis(axis, t.ndim)
    return TensorType(t.shape, dtype)


cumsum = defop("cumsum", pattern=OPAQUE, attrs={"axis": Int(None), "reverse": Bool(False)}, infer=_cumsum_infer,
               doc="Running sums along axis (None: over x flattened, giving 1-D); reverse sums from the end.")


@cumsum.kernel
def _(xp, x, *, axis, reverse, out=None):
    if not reverse:
        return xp.cumsum(x, axis=axis, out=out)
    if axis is None:
        x, axis = x.reshape(-1), 0
    return ew._assign(xp, out, xp.flip(xp.cumsum(xp.flip(x, axis), axis=axis), axis))


@cumsum.grad
def _(node, g):
    # y_j = sum_{i <= j} x_i, so dx_i = sum_{j >= i} g_j: the running sum taken the other way
    x = node.inputs[0]
    axis, reverse = node.attrs["axis"], node.attrs["reverse"]
    if axis is None:
        return [shp.reshape_like(cumsum(g, axis=0, reverse=not reverse), x)]
    return [cumsum(g, axis=axis, reverse=not reverse)]


# --------------------------------------------------------------------------- sum of squares

def _sum_squares_infer(types):
    t = types[0]
    if not t.dtype.is_float:
        raise TypeError(f"sum_squares: a float tensor, got {t!r}")
    return TensorType((), t.dtype)


sum_squares = defop("sum_squares", infer=_sum_squares_infer, nonnegative=True,
                    doc="0-d: the sum of x * x over every element (an L2 penalty); made by the compiler "
                        "from sum(square(x)) (cgvm.compiler.reductions).")


@sum_squares.kernel
def _(xp, x, out=None):
    if type(x) is np.ndarray and x.dtype in _BLAS_DOT and x.flags.c_contiguous and x.size:
        flat = x.reshape(-1)
        r = np.dot(flat, flat)        # one BLAS pass over x; no squared temporary
    else:
        r = xp.sum(xp.square(x))
    if out is None:
        return xp.asarray(r, dtype=x.dtype)
    out[...] = r
    return out


@sum_squares.grad
def _(node, g):
    x = node.inputs[0]
    return [ew.mul(ew.mul(x, 2), g)]


# --------------------------------------------------------------------------- helpers as ops

def _count_infer(types, axis, dtype):
    normalize_axes(axis, types[0].ndim)  # raises on a bad axis
    return TensorType((), dtype)


reduce_count = defop("reduce_count", pattern=OPAQUE, differentiable=False, infer=_count_infer,
                     attrs={"axis": Ints(None), "dtype": DTypeAttr("float32")},
                     doc="0-d: how many elements of x a reduction over axis combines (reads only x's shape).")


@reduce_count.kernel
def _(xp, x, *, axis, dtype, out=None):
    n = 1
    for a in normalize_axes(axis, x.ndim):
        n *= x.shape[a]
    if out is None:
        return xp.asarray(n, dtype=dtype.np)
    out.fill(n)
    return out


def _sum_to_like_infer(types):
    g, x = types
    return TensorType(x.shape, g.dtype)


sum_to_like = defop("sum_to_like", num_inputs=2, infer=_sum_to_like_infer, shape_only=(1,),
                    doc="Sum g over the axes along which x was broadcast to g's shape.")


sum_to_like.identity_when(same_type_as_input)


@sum_to_like.over_steps
def _(node, stepped):
    # both stepped and of one rank: the step axes pair up and are never summed
    g, x = node.inputs
    return {} if all(stepped) and g.ndim == x.ndim else None


@sum_to_like.kernel
def _(xp, g, x, out=None):
    # sum_to_like is not a view op: without `out` it must hand back a fresh array, never g itself,
    # because g's buffer may be planned and reused after g dies
    shape = x.shape
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(i + lead for i, d in enumerate(shape) if d == 1 and g.shape[i + lead] != 1)
    if not axes:
        return g.reshape(shape).copy() if out is None else _assign_reshaped(out, g)
    r = _reduced(xp, "sum", g, axes, True).reshape(shape)
    if out is None:
        return r
    out[...] = r
    return out


def _assign_reshaped(out, value):
    out[...] = value.reshape(out.shape)
    return out


@sum_to_like.grad
def _(node, gg):
    return [shp.broadcast_like(gg, node.inputs[0]), None]



# --------------------------------------------------------------------------- Numba lowerings
# how reductions run inside a compiled loop (cgvm.ops.loop_code)

def _lower_reduction(kind: str, mean: bool = False):
    def lower(node, em, ins, outs):
        x, out = ins[0], outs[0]
        axes = normalize_axes(node.attrs["axis"], x.ndim)
        lc.reduce(em, x, out, axes, node.attrs["keepdims"], kind)
        if mean:
            n = em.const(prod_dims([x.shape[a] for a in axes]), out.dtype)
            cast = em.cast(out.dtype)
            with em.loops(out.shape) as idx:
                em.line(f"{out.at(idx)} = {cast}({out.at(idx)} / {n})")
    return lower


sum.numba_lowering(_lower_reduction("sum"))
mean.numba_lowering(_lower_reduction("sum", mean=True))
prod.numba_lowering(_lower_reduction("prod"))
max.numba_lowering(_lower_reduction("max"))
min.numba_lowering(_lower_reduction("min"))


@sum_to_like.numba_lowering
def _(node, em, ins, outs):
    lc.sum_to(em, ins[0], outs[0])
