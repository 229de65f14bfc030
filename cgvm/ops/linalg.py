"""Linear algebra: matmul (batched, broadcasting), gemm with transposes, tensordot; dot, outer, batched_dot.

``matmul``, ``gemm`` and ``tensordot`` are ops whose kernels write into planned buffers
(``xp.matmul(..., out=)``). ``dot``, ``outer`` and ``batched_dot`` are functions that lower to
them with NumPy's and Theano's semantics. Gradients are built from the same ops, so second
derivatives work.
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ShapeError
from ..ir.attrs import AttrKind, Bool, Float
from ..ir.builder import as_value
from ..ir.graph import Value, current_source
from ..ir.types import TensorType, result_dtype
from ..backend import blas
from . import elementwise as ew
from . import reduce as red
from . import shape as shp
from . import loop_code as lc
from .registry import OPAQUE, defop
from .rules import Dim, broadcast_shapes, normalize_axis


def _sum_to(g: Value, x: Value) -> Value:
    """``g`` summed down to ``x``'s shape (a no-op when the static shapes already agree)."""
    if g.shape == x.shape and None not in x.shape:
        return g
    return red.sum_to_like(g, x)


# --------------------------------------------------------------------------- matmul

def _matmul_infer(types):
    a, b = types
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("matmul needs operands of rank 1 or more (use mul for scalars)")
    k_b = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    shp.unify_dim(a.shape[-1], k_b, "matmul: inner dimensions differ")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    rows: Tuple[Dim, ...] = (a.shape[-2],) if a.ndim >= 2 else ()
    cols: Tuple[Dim, ...] = (b.shape[-1],) if b.ndim >= 2 else ()
    return TensorType(batch + rows + cols, result_dtype(a.dtype, b.dtype))


# the kernel is xp.matmul itself (no Python layer: GEMMs sit in every loop body). A product of two
# vectors comes back as a NumPy scalar, which every kernel accepts; programs return arrays.
matmul = defop("matmul", num_inputs=2, pattern=OPAQUE, infer=_matmul_infer, ufunc="matmul", runs_gemm=True,
               doc="numpy.matmul: matrix product over the last two axes, batch axes broadcast, 1-D "
                   "operands promoted to a row (left) or column (right) and the axis removed again.")


#: products of at most this many outputs run through numpy.dot: for small matrices NumPy's dot
#: costs half of matmul's (a generalized ufunc's dispatch); both multiply through the same BLAS
SMALL_PRODUCT = 4096


@matmul.kernel_for_types
def _(xp, in_types, out_types):
    a, b = in_types
    if (xp is np and a.ndim == b.ndim == 2 and a.dtype is b.dtype is out_types[0].dtype
            and a.dtype.name in ("float32", "float64") and out_types[0].size <= SMALL_PRODUCT):
        return np.dot
    return None


@matmul.grad
def _(node, g):
    a, b = node.inputs
    # promote 1-D operands to matrices so one rule covers every case, then undo it
    a2 = shp.expand_dims(a, axis=0) if a.ndim == 1 else a
    b2 = shp.expand_dims(b, axis=-1) if b.ndim == 1 else b
    if a.ndim == 1 and b.ndim == 1:
        g2 = shp.expand_dims(g, axis=(0, 1))
    elif a.ndim == 1:
        g2 = shp.expand_dims(g, axis=-2)
    elif b.ndim == 1:
        g2 = shp.expand_dims(g, axis=-1)
    else:
        g2 = g
    ga, gb = matmul(g2, shp.swap_last_axes(b2)), matmul(shp.swap_last_axes(a2), g2)
    if a2.ndim > 2 or b2.ndim > 2:   # batch axes may have broadcast; matrices' products have their shapes
        ga, gb = _sum_to(ga, a2), _sum_to(gb, b2)
    # a vector times a matrix: its gradient is the vector times the transpose, as is (no row made
    # and squeezed again; over a loop's steps, one matrix product of the stacked vectors)
    if a.ndim == 1:
        ga = matmul(g, shp.transpose(b, perm=(1, 0))) if b.ndim == 2 else shp.squeeze(ga, axis=0)
    if b.ndim == 1:
        gb = matmul(shp.transpose(a, perm=(1, 0)), g) if a.ndim == 2 else shp.squeeze(gb, axis=-1)
    return [ga, gb]


@matmul.over_steps
def _(node, stepped):
    # a leading axis of steps must become a batch axis of the product, never its rows: a stepped
    # vector times a matrix is a matrix product of the stacked rows; otherwise the stepped operand
    # must have at least the other's rank, so that the new axis leads the broadcast batch axes
    (a, b), (sa, sb) = node.inputs, stepped
    if sa and not sb:
        ok = b.ndim == 2 if a.ndim == 1 else 2 <= b.ndim <= a.ndim
    elif sb and not sa:
        ok = b.ndim >= 2 and a.ndim <= b.ndim
    else:
        ok = sa and sb and a.ndim == b.ndim >= 2
    return {} if ok else None


# --------------------------------------------------------------------------- gemm

def _gemm_infer(types, trans_a, trans_b, alpha, beta):
    a, b = types[0], types[1]
    if a.ndim != 2 or b.ndim != 2:
        raise ShapeError(f"gemm multiplies matrices; got ranks {a.ndim} and {b.ndim}")
    m, k = a.shape[::-1] if trans_a else a.shape
    k2, n = b.shape[::-1] if trans_b else b.shape
    shp.unify_dim(k, k2, "gemm: inner dimensions differ")
    dtypes = [t.dtype for t in types]
    if len(types) == 3:
        shp.check_broadcastable_to(types[2].shape, (m, n), "gemm: the bias c")
    return TensorType((m, n), result_dtype(*dtypes))


gemm = defop("gemm", num_inputs=(2, 3), pattern=OPAQUE, infer=_gemm_infer, inplace=((2, 0),), runs_gemm=True,
             attrs={"trans_a": Bool(False), "trans_b": Bool(False), "alpha": Float(1.0), "beta": Float(1.0)},
             doc="BLAS gemm: alpha * op(a) @ op(b) + beta * c, op transposing where asked; c broadcasts. "
                 "A c of the result's shape may be overwritten by it.")


def product_plus(xp: Any, a: Any, b: Any, c: Any, alpha: float, beta: float, out: Any = None) -> Any:
    """``alpha * a @ b + beta * c`` for matrices a, b, with c broadcasting against the product.

    Where c has the product's shape, the product is added into c's values as BLAS writes it
    (cgvm.backend.blas): into c itself when ``out is c`` (the planner let c die here), else into a
    copy of c. Other shapes, dtypes and backends take matmul and ufuncs.
    """
    if c.shape == (a.shape[0], b.shape[1]) and beta != 0.0:
        if out is not c:
            if out is None:
                out = c.astype(xp.result_type(a, b, c), copy=True)
            else:
                xp.copyto(out, c)
        if xp is np and blas.accumulate_product(alpha, a, b, beta, out):
            return out
        if beta != 1.0:
            out *= xp.asarray(beta, dtype=out.dtype)
        product = xp.matmul(a, b)
        if alpha != 1.0:
            product *= xp.asarray(alpha, dtype=product.dtype)
        out += product
        return out
    scaled_c = c if beta == 1.0 else c * xp.asarray(beta, dtype=c.dtype)
    if out is None or out.shape != (a.shape[0], b.shape[1]):   # c is wider than the product
        product = xp.matmul(a, b)
        if alpha != 1.0:
            product *= xp.asarray(alpha, dtype=product.dtype)
        return xp.add(product, scaled_c, out=out)
    r = xp.matmul(a, b, out=out)
    if alpha != 1.0:
        r *= xp.asarray(alpha, dtype=r.dtype)
    if beta != 0.0:   # as in BLAS, beta = 0 ignores c
        r += scaled_c
    return r


@gemm.kernel_factory
def _(xp, trans_a, trans_b, alpha, beta):
    def kernel(a, b, c=None, out=None):
        a = a.T if trans_a else a
        b = b.T if trans_b else b
        if c is None:
            r = xp.matmul(a, b, out=out)
            if alpha != 1.0:
                r *= xp.asarray(alpha, dtype=r.dtype)
            return r
        return product_plus(xp, a, b, c, alpha, beta, out)
    return kernel


@gemm.grad
def _(node, g):
    a, b = node.inputs[:2]
    ta, tb, alpha, beta = (node.attrs[k] for k in ("trans_a", "trans_b", "alpha", "beta"))
    # with A = op(a), B = op(b): dA = alpha g B^T and dB = alpha A^T g, each written as one gemm
    if ta:
        ga = gemm(b, g, trans_a=tb, trans_b=True, alpha=alpha)
    else:
        ga = gemm(g, b, trans_b=not tb, alpha=alpha)
    if tb:
        gb = gemm(g, a, trans_a=True, trans_b=ta, alpha=alpha)
    else:
        gb = gemm(a, g, trans_a=not ta, alpha=alpha)
    grads = [ga, gb]
    if len(node.inputs) == 3:
        c = node.inputs[2]
        grads.append(_sum_to(g if beta == 1.0 else ew.mul(g, beta), c))
    return grads


# --------------------------------------------------------------------------- tensordot

class TensordotAxes(AttrKind):
    """An int n (the last n axes of a with the first n of b) or a pair of axis sequences."""

    kind = "axes"

    def convert(self, value):
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            if value < 0:
                raise ValueError(f"tensordot: negative number of axes {value}")
            return int(value)
        try:
            axes_a, axes_b = value
        except (TypeError, ValueError):
            raise TypeError(f"expected an int or a pair of axis lists, got {value!r}") from None
        pair = tuple((int(v),) if isinstance(v, (int, np.integer)) else tuple(int(i) for i in v)
                     for v in (axes_a, axes_b))
        if len(pair[0]) != len(pair[1]):
            raise ValueError(f"tensordot: {len(pair[0])} axes of a against {len(pair[1])} of b")
        return pair


def tensordot_axes(axes: Any, ndim_a: int, ndim_b: int) -> Tuple[List[int], List[int]]:
    """Normalized contracted axes of a and b (checked: in range, no repeats)."""
    if isinstance(axes, int):
        if axes > ndim_a or axes > ndim_b:
            raise ShapeError(f"tensordot: cannot contract {axes} axes of ranks {ndim_a} and {ndim_b}")
        sum_a, sum_b = list(range(ndim_a - axes, ndim_a)), list(range(axes))
    else:
        sum_a = [normalize_axis(i, ndim_a) for i in axes[0]]
        sum_b = [normalize_axis(i, ndim_b) for i in axes[1]]
    if len(set(sum_a)) != len(sum_a) or len(set(sum_b)) != len(sum_b):
        raise ShapeError(f"tensordot: repeated axis in {axes}")
    return sum_a, sum_b


def _tensordot_infer(types, axes):
    a, b = types
    sum_a, sum_b = tensordot_axes(axes, a.ndim, b.ndim)
    for i, j in zip(sum_a, sum_b):
        shp.unify_dim(a.shape[i], b.shape[j], f"tensordot: axis {i} of a and axis {j} of b differ")
    free_a = [d for i, d in enumerate(a.shape) if i not in sum_a]
    free_b = [d for j, d in enumerate(b.shape) if j not in sum_b]
    return TensorType(free_a + free_b, result_dtype(a.dtype, b.dtype))


tensordot = defop("tensordot", num_inputs=2, pattern=OPAQUE, attrs={"axes": TensordotAxes(2)},
                  infer=_tensordot_infer,
                  doc="numpy.tensordot: sum over the paired axes; the result has a's free axes, then b's.")


@tensordot.kernel
def _(xp, a, b, *, axes, out=None):
    sum_a, sum_b = tensordot_axes(axes, a.ndim, b.ndim)
    free_a = [i for i in range(a.ndim) if i not in sum_a]
    free_b = [j for j in range(b.ndim) if j not in sum_b]
    rows = math.prod(a.shape[i] for i in free_a)
    cols = math.prod(b.shape[j] for j in free_b)
    inner = math.prod(a.shape[i] for i in sum_a)
    # as NumPy does: one matrix product of the transposed, flattened operands
    a2 = xp.transpose(a, free_a + sum_a).reshape(rows, inner)
    b2 = xp.transpose(b, sum_b + free_b).reshape(inner, cols)
    shape = tuple(a.shape[i] for i in free_a) + tuple(b.shape[j] for j in free_b)
    if out is not None and out.flags.c_contiguous:
        xp.matmul(a2, b2, out=out.reshape(rows, cols))
        return out
    r = xp.matmul(a2, b2).reshape(shape)
    if out is None:
        return r
    out[...] = r
    return out


@tensordot.grad
def _(node, g):
    a, b = node.inputs
    sum_a, sum_b = tensordot_axes(node.attrs["axes"], a.ndim, b.ndim)
    free_a = [i for i in range(a.ndim) if i not in sum_a]
    free_b = [j for j in range(b.ndim) if j not in sum_b]
    nfa, nfb = len(free_a), len(free_b)
    # g has a's free axes then b's; contract it with the other operand's free axes. What is left
    # of an operand keeps its own axis order, so the paired axes come out sorted by that operand.
    ga = tensordot(g, b, axes=(tuple(range(nfa, nfa + nfb)), tuple(free_b)))
    gb = tensordot(a, g, axes=(tuple(free_a), tuple(range(nfa))))
    ga_order = free_a + [sum_a[k] for k in np.argsort(sum_b)]
    gb_order = [sum_b[k] for k in np.argsort(sum_a)] + free_b
    return [_transpose_back(ga, ga_order), _transpose_back(gb, gb_order)]


def _transpose_back(x: Value, order: Sequence[int]) -> Value:
    """``x`` laid out as axes ``order`` of some tensor, put back in that tensor's axis order."""
    if list(order) == sorted(order):
        return x
    return shp.transpose(x, perm=tuple(int(i) for i in np.argsort(order)))


def _expand(x: Value, axes: Sequence[int]) -> Value:
    return shp.expand_dims(x, axis=tuple(axes)) if axes else x


# --------------------------------------------------------------------------- functions lowering to the ops

def dot(a: Any, b: Any) -> Value:
    """numpy.dot / Theano's dot: a product for scalars, matmul up to matrices, else tensordot of a's
    last axis with b's second-to-last."""
    a, b = _values(a, b)
    if a.ndim == 0 or b.ndim == 0:
        return ew.mul(a, b)
    if b.ndim <= 2:
        return matmul(a, b)
    return tensordot(a, b, axes=((a.ndim - 1,), (b.ndim - 2,)))


def outer(a: Any, b: Any) -> Value:
    """numpy.outer: the product of every element of a (flattened) with every element of b."""
    a, b = _values(a, b)
    return ew.mul(shp.reshape(a, shape=(-1, 1)), shp.reshape(b, shape=(1, -1)))


def batched_dot(a: Any, b: Any) -> Value:
    """Theano's batched_dot: ``result[i] = dot(a[i], b[i])`` over the leading (batch) axis."""
    a, b = _values(a, b)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"batched_dot needs a batch axis in both operands; got ranks {a.ndim} and {b.ndim}"
                         f" (at {current_source()})")
    if a.ndim == 1 or b.ndim == 1:  # a batch of scalars scales the other operand's items
        if a.ndim == 1:
            a = _expand(a, range(1, b.ndim))
        else:
            b = _expand(b, range(1, a.ndim))
        return ew.mul(a, b)
    p, q = a.ndim - 1, b.ndim - 1       # ranks of the items a[i] and b[i]
    if p <= 2 and q <= 2:
        left = shp.expand_dims(a, axis=1) if p == 1 else a
        right = shp.expand_dims(b, axis=-1) if q == 1 else b
        drop = tuple(ax for ax, promoted in ((1, p == 1), (-1, q == 1)) if promoted)
        r = matmul(left, right)
        return shp.squeeze(r, axis=drop) if drop else r
    # general items: contract a[i]'s last axis with b[i]'s second-to-last (or only) axis by lining
    # the items' other axes up as broadcast batch axes of one matmul
    if q == 1:
        left = shp.expand_dims(a, axis=-2)                                  # (B, a.., 1, n)
        right = _expand(b, tuple(range(1, p)) + (-1,))                      # (B, 1.., n, 1)
        return shp.squeeze(matmul(left, right), axis=(-2, -1))
    left = _expand(a, range(p, p + q - 1))                                  # (B, a.., 1.., 1, n)
    right = _expand(b, range(1, p))                                         # (B, 1.., b.., n, r)
    return shp.squeeze(matmul(left, right), axis=-2)


def _values(*xs: Any) -> List[Value]:
    like: Optional[Value] = next((x for x in xs if isinstance(x, Value)), None)
    return [as_value(x, like) for x in xs]


# --------------------------------------------------------------------------- Numba lowerings
# how products run inside a compiled loop (cgvm.ops.loop_code): small ones as loops, larger
# ones keep the loop in Python, where BLAS does them

@matmul.numba_lowering
def _(node, em, ins, outs):
    lc.product(em, ins[0], ins[1], outs[0])


@gemm.numba_lowering
def _(node, em, ins, outs):
    a = node.attrs
    alpha, beta = em.const(a["alpha"], outs[0].dtype), em.const(a["beta"], outs[0].dtype)
    c = ins[2] if len(ins) == 3 else None
    lc.product(em, ins[0], ins[1], outs[0], a["trans_a"], a["trans_b"],
               epilogue=lambda acc, idx: f"{alpha} * {acc}" + (f" + {beta} * {c.at_broadcast(idx, outs[0].shape)}"
                                                               if c is not None else ""))
