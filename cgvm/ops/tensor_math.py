"""Ops the ONNX frontend needed that cgvm lacked: bit_shift, cumprod, einsum, det, bitcast.

bit_shift defines shifts by a negative amount or by at least the bit width (undefined in C) as
ONNX does: all bits shifted out, so 0, or the sign fill (-1 for negatives) of an arithmetic right
shift. cumprod's gradient divides by nothing (it is built from prefix products, so zeros are
handled). einsum's gradient is einsum again (broadcast along letters summed within one operand); an
operand with a repeated subscript (a diagonal) has none.
"""
from __future__ import annotations

import string
from typing import List, Sequence, Tuple

from ..errors import GradientError, ShapeError
from ..ir.attrs import Bool, DTypeAttr, Int, Str
from ..ir.types import TensorType
from . import elementwise as ew
from . import shape as shp
from .registry import BROADCAST, OPAQUE, defop
from .rules import assign_out, broadcast_shapes, normalize_axis

# --------------------------------------------------------------------------- bit_shift


def _shift_infer(types, direction):
    a, b = types
    if not (a.dtype.is_int and b.dtype.is_int):
        raise ShapeError(f"bit_shift takes integers, got {a.dtype.name} and {b.dtype.name}")
    return TensorType(broadcast_shapes(a.shape, b.shape), a.dtype)


bit_shift = defop("bit_shift", num_inputs=2, pattern=BROADCAST, differentiable=False, infer=_shift_infer,
                  attrs={"direction": Str("left", choices=("left", "right"))},
                  doc="x << y or x >> y (arithmetic for signed x); a shift out of [0, bits) shifts every bit out.")


@bit_shift.kernel
def _(xp, x, y, *, direction, out=None):
    bits = x.dtype.itemsize * 8
    y = y.astype(x.dtype)
    inside = (y >= 0) & (y < bits)
    safe = xp.where(inside, y, 0).astype(x.dtype)
    if direction == "left":
        shifted, outside = xp.left_shift(x, safe), xp.zeros_like(x)
    else:
        shifted = xp.right_shift(x, safe)
        outside = xp.where(x < 0, -1, 0).astype(x.dtype) if x.dtype.kind == "i" else xp.zeros_like(x)
    return assign_out(xp, out, xp.where(inside, shifted, outside))


# --------------------------------------------------------------------------- cumprod


def _cumprod_infer(types, axis, reverse):
    normalize_axis(axis, types[0].ndim)
    return types[0]


cumprod = defop("cumprod", pattern=OPAQUE, attrs={"axis": Int(0), "reverse": Bool(False)}, infer=_cumprod_infer,
                doc="Running products along axis, keeping x's dtype; reverse multiplies from the end.")


@cumprod.kernel
def _(xp, x, *, axis, reverse, out=None):
    if reverse:
        return assign_out(xp, out, xp.flip(xp.cumprod(xp.flip(x, axis), axis=axis, dtype=x.dtype), axis))
    return assign_out(xp, out, xp.cumprod(x, axis=axis, dtype=x.dtype))


@cumprod.grad
def _(node, g):
    # dy_j/dx_i = prod_{k <= j, k != i} x_k for i <= j: with exclusive prefix products P_i (before i)
    # and the products of x between i and j, sum_j g_j * y_j / x_i rewritten without a division:
    # dx_i = P_i * sum_{j >= i} g_j * prod_{i < k <= j} x_k, computed as a reversed scan by the graph
    x = node.inputs[0]
    axis, reverse = node.attrs["axis"], node.attrs["reverse"]
    a = normalize_axis(axis, x.ndim)
    n = x.shape[a]
    if n is None:
        raise GradientError("cumprod's gradient needs a known length along its axis")
    from . import indexing as ix
    from . import join

    def at(v, i):
        return ix.slice(v, starts=(i,), stops=(i + 1,), steps=(1,), axes=(a,))

    order = list(range(n))[::-1] if reverse else list(range(n))
    prefix, running = {}, None
    for i in order:                                   # exclusive prefix products
        prefix[i] = shp.ones_like(at(x, i)) if running is None else running
        running = ew.mul(prefix[i], at(x, i))
    acc, grads = None, {}
    for i in reversed(order):                         # suffix sums of g weighted by products after i
        acc = at(g, i) if acc is None else ew.add(at(g, i), ew.mul(at(x, order[order.index(i) + 1]), acc))
        grads[i] = ew.mul(prefix[i], acc)
    return [join.concat(*[grads[i] for i in range(n)], axis=a) if n > 1 else grads[0]]


# --------------------------------------------------------------------------- einsum


def _parse_einsum(equation: str, ranks: Sequence[int]) -> Tuple[List[str], str]:
    """Operand and output subscripts with '...' expanded to letters not used elsewhere."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(ranks):
        raise ShapeError(f"einsum {equation!r} names {len(ins)} operands, got {len(ranks)}")
    free = [c for c in string.ascii_letters if c not in eq]
    ell_rank = max([r - len(s.replace("...", "")) for s, r in zip(ins, ranks) if "..." in s] or [0])
    ell = "".join(free[:ell_rank])
    out_ins = []
    for s, r in zip(ins, ranks):
        if "..." in s:
            k = r - len(s.replace("...", ""))
            s = s.replace("...", ell[ell_rank - k:] if k else "")
        if len(s) != r:
            raise ShapeError(f"einsum {equation!r}: subscripts {s!r} for an operand of rank {r}")
        out_ins.append(s)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        letters = "".join(out_ins)
        out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell))
    return out_ins, out


def _einsum_infer(types, equation):
    ins, out = _parse_einsum(equation, [t.ndim for t in types])
    sizes = {}
    for s, t in zip(ins, types):
        for c, d in zip(s, t.shape):
            if d is None or d == 1:
                sizes.setdefault(c, d)
                continue
            if sizes.get(c) not in (None, 1, d):
                raise ShapeError(f"einsum {equation!r}: index {c!r} is {sizes[c]} and {d}")
            sizes[c] = d
    dtype = types[0].dtype
    for t in types[1:]:
        if t.dtype is not dtype:
            raise ShapeError(f"einsum operands have dtypes {dtype.name} and {t.dtype.name}")
    return TensorType(tuple(sizes.get(c) for c in out), dtype)


einsum = defop("einsum", num_inputs=(1, None), pattern=OPAQUE, attrs={"equation": Str()}, infer=_einsum_infer,
               doc="numpy.einsum(equation, *operands), '...' broadcasting; operands share one dtype.")


_NATIVE = frozenset(("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16",
                     "uint32", "uint64", "bool"))


@einsum.kernel
def _(xp, *xs, equation, out=None):
    ins, o = _parse_einsum(equation, [x.ndim for x in xs])
    dtype = xs[0].dtype
    if dtype.name not in _NATIVE:
        # storage formats (bfloat16, float8 from ml_dtypes) have no einsum loop: accumulate in float32, round once
        xs = [x.astype(xp.float32) for x in xs]
    return assign_out(xp, out, xp.asarray(xp.einsum(",".join(ins) + "->" + o, *xs)).astype(dtype, copy=False))


@einsum.grad
def _(node, g):
    xs = node.inputs
    ins, o = _parse_einsum(node.attrs["equation"], [x.ndim for x in xs])
    grads = []
    for k, s in enumerate(ins):
        others = [ins[j] for j in range(len(ins)) if j != k]
        seen = set(o).union(*others) if others else set(o)
        if len(set(s)) != len(s):
            raise GradientError(f"einsum {node.attrs['equation']!r}: no gradient for operand {k} (a repeated "
                                "subscript: a diagonal)")
        kept = "".join(c for c in s if c in seen)          # letters summed only within the operand are
        eq = ",".join([o] + others) + "->" + kept           # restored below by broadcasting
        gk = einsum(g, *[xs[j] for j in range(len(xs)) if j != k], equation=eq)
        if kept != s:
            missing = tuple(i for i, c in enumerate(s) if c not in seen)
            if any(xs[k].shape[i] is None for i in missing):
                raise GradientError(f"einsum {node.attrs['equation']!r}: operand {k} needs a known shape")
            gk = shp.broadcast_to(shp.expand_dims(gk, axis=missing), shape=tuple(xs[k].shape))
        if gk.shape != xs[k].shape:
            from . import reduce as red

            gk = red.sum_to_like(gk, xs[k])
        grads.append(gk)
    return grads


# --------------------------------------------------------------------------- det


def _det_infer(types):
    t = types[0]
    if t.ndim < 2 or (t.shape[-1] is not None and t.shape[-2] is not None and t.shape[-1] != t.shape[-2]):
        raise ShapeError(f"det takes square matrices (..., n, n), got {t.shape}")
    if not t.dtype.is_float:
        raise ShapeError(f"det takes floats, got {t.dtype.name}")
    return TensorType(t.shape[:-2], t.dtype)


det = defop("det", pattern=OPAQUE, infer=_det_infer, differentiable=False,
            doc="Determinants of the square matrices in the last two axes (numpy.linalg.det).")


@det.kernel
def _(xp, x, out=None):
    return assign_out(xp, out, xp.linalg.det(x).astype(x.dtype, copy=False))


# --------------------------------------------------------------------------- bitcast


def _bitcast_infer(types, dtype):
    t = types[0]
    if t.dtype.itemsize != dtype.itemsize:
        raise ShapeError(f"bitcast from {t.dtype.name} to {dtype.name}: the element sizes differ")
    return TensorType(t.shape, dtype)


bitcast = defop("bitcast", pattern=OPAQUE, differentiable=False, attrs={"dtype": DTypeAttr()}, infer=_bitcast_infer,
                doc="The bits of x read as another dtype of the same size (numpy's ndarray.view).")


@bitcast.kernel
def _(xp, x, *, dtype, out=None):
    # (ascontiguousarray returns at least one axis: a scalar is given its shape back)
    return assign_out(xp, out, xp.ascontiguousarray(x).reshape(x.shape).view(dtype.np))
