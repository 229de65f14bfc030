"""Shape ops: reshape, transpose, broadcasting, expand/squeeze, flatten, shape_of, *_like.

concat, split, stack and tile live in ``join.py``; slicing, integer indexing, padding and one-hot
in ``indexing.py``; zeros/ones/full, arange,
eye and alloc in ``creation.py``. View ops (``view=True``) return arrays that may alias their
first input; the memory planner extends that input's life. Dimensions may be unknown (``None``)
in every type rule; they stay unknown where the output depends on them, and are checked again
with concrete shapes when a program is planned.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

import numpy as np

from ..errors import DTypeError, ShapeError
from ..ir.attrs import AttrKind, DTypeAttr, Float, Int, Ints
from ..ir.graph import Value
from ..ir.types import TensorType, int64, shape_str
from . import reduce as red
from . import loop_code as lc
from .registry import OPAQUE, defop, same_type_as_input
from .rules import Dim, broadcast_shapes, normalize_axes, normalize_axis, over_steps_along, prod_dims


class OptionalInts(AttrKind):
    """A tuple whose entries are ints or ``None`` (slice bounds, partly static shapes)."""

    kind = "ints?"

    def convert(self, value):
        if value is None or isinstance(value, (int, np.integer)):
            value = (value,)
        items = tuple(value)
        for v in items:
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer))):
                raise TypeError(f"expected ints or None, got {value!r}")
        return tuple(None if v is None else int(v) for v in items)


def unify_dim(a: Dim, b: Dim, what: str) -> Dim:
    """The common value of two dimensions that must agree (``None`` agrees with anything)."""
    if a is None:
        return b
    if b is not None and a != b:
        raise ShapeError(f"{what}: {a} != {b}")
    return a


def unify_shapes(shapes: Sequence[Sequence[Dim]], what: str, skip_axis: Optional[int] = None) -> List[Dim]:
    """One shape agreeing with all of ``shapes`` (same rank), ignoring ``skip_axis``."""
    ranks = {len(s) for s in shapes}
    if len(ranks) != 1:
        raise ShapeError(f"{what}: inputs have different ranks " + ", ".join(shape_str(s) for s in shapes))
    out = list(shapes[0])
    for s in shapes[1:]:
        for i, d in enumerate(s):
            if i != skip_axis:
                out[i] = unify_dim(out[i], d, f"{what}: dimension {i} differs")
    return out


# --------------------------------------------------------------------------- expand / squeeze

def _expand_infer(types, axis):
    t = types[0]
    ndim = t.ndim + len(axis)
    axes = normalize_axes(axis, ndim)
    dims = iter(t.shape)
    return TensorType(tuple(1 if i in axes else next(dims) for i in range(ndim)), t.dtype)


expand_dims = defop("expand_dims", view=True, attrs={"axis": Ints()}, infer=_expand_infer)


@expand_dims.kernel_factory
def _(xp, axis):
    positions: dict = {}   # rank of x -> the sorted positions of the new axes (ranks rarely vary)

    def kernel(x):
        # numpy.expand_dims is this reshape behind a Python-level axis normalization that cost more
        # than the reshape (an RNN gradient step calls it for every bias and softmax row)
        at = positions.get(x.ndim)
        if at is None:
            at = positions[x.ndim] = sorted(normalize_axes(axis, x.ndim + len(axis)))
        shape = list(x.shape)
        for a in at:
            shape.insert(a, 1)
        return x.reshape(shape)
    return kernel


@expand_dims.grad
def _(node, g):
    return [squeeze(g, axis=node.attrs["axis"])]


expand_dims.over_steps(over_steps_along("axis"))


def _squeeze_infer(types, axis):
    t = types[0]
    axes = normalize_axes(axis, t.ndim) if axis is not None else tuple(i for i, d in enumerate(t.shape) if d == 1)
    for a in axes:
        if t.shape[a] not in (1, None):
            raise ValueError(f"cannot squeeze axis {a} of size {t.shape[a]}")
    return TensorType(tuple(d for i, d in enumerate(t.shape) if i not in axes), t.dtype)


squeeze = defop("squeeze", view=True, attrs={"axis": Ints(None)}, infer=_squeeze_infer)


@squeeze.kernel
def _(xp, x, *, axis):
    return xp.squeeze(x, axis=axis)


@squeeze.grad
def _(node, g):
    return [reshape_like(g, node.inputs[0])]


squeeze.over_steps(over_steps_along("axis"))   # not axis=None: it would squeeze a single step's axis too


# --------------------------------------------------------------------------- broadcasting

def _broadcast_like_infer(types):
    x, like = types
    return TensorType(broadcast_shapes(x.shape, like.shape), x.dtype)


broadcast_like = defop("broadcast_like", num_inputs=2, view=True, infer=_broadcast_like_infer,
                       shape_only=(1,),
                       doc="x broadcast to the shape of the second input (only its shape is read).")


broadcast_like.identity_when(same_type_as_input)


@broadcast_like.kernel
def _(xp, x, like):
    if x.shape == like.shape:   # what specialization aliases where it knows the shapes (10 us saved)
        return x
    return xp.broadcast_to(x, xp.broadcast_shapes(x.shape, like.shape))


@broadcast_like.grad
def _(node, g):
    return [red.sum_to_like(g, node.inputs[0]), None]


def check_broadcastable_to(shape: Sequence[Dim], target: Sequence[Dim], what: str) -> None:
    """Raise unless ``shape`` broadcasts to ``target`` without changing it (unknown dims pass)."""
    if len(shape) > len(target):
        raise ShapeError(f"{what}: {shape_str(shape)} has more dimensions than {shape_str(target)}")
    for d, t in zip(reversed(shape), reversed(target)):
        if d is not None and d != 1 and t is not None and d != t:
            raise ShapeError(f"{what}: {shape_str(shape)} does not broadcast to {shape_str(target)}")


def _broadcast_to_infer(types, shape):
    if any(d < 0 for d in shape):
        raise ValueError(f"broadcast_to: negative dimension in shape {shape}")
    check_broadcastable_to(types[0].shape, shape, "broadcast_to")
    return TensorType(shape, types[0].dtype)


broadcast_to = defop("broadcast_to", view=True, attrs={"shape": Ints()},
                     infer=_broadcast_to_infer)


@broadcast_to.kernel
def _(xp, x, *, shape):
    return xp.broadcast_to(x, shape)


@broadcast_to.grad
def _(node, g):
    return [red.sum_to_like(g, node.inputs[0])]


# --------------------------------------------------------------------------- reshape

def resolve_reshape(in_shape: Sequence[Dim], target: Sequence[int]) -> Tuple[Dim, ...]:
    """Caffe/NumPy reshape target: 0 copies the input dimension at that position, -1 is inferred.

    Works on static shapes (``None`` dims give ``None`` where they matter) and concrete ones.
    """
    if sum(1 for t in target if t == -1) > 1:
        raise ShapeError(f"reshape target {tuple(target)} has more than one -1")
    out: List[Dim] = []
    for i, t in enumerate(target):
        if t == 0:
            if i >= len(in_shape):
                raise ShapeError(f"reshape target {tuple(target)}: 0 at position {i} copies an input "
                                 f"dimension, but the input {shape_str(in_shape)} has rank {len(in_shape)}")
            out.append(in_shape[i])
        elif t < -1:
            raise ShapeError(f"reshape target {tuple(target)} has a negative dimension {t}")
        else:
            out.append(t)
    size_in = prod_dims(in_shape)
    if -1 in out:
        k = out.index(-1)
        rest = prod_dims([d for i, d in enumerate(out) if i != k])
        if size_in is not None and rest is not None:
            if rest == 0 or size_in % rest:
                raise ShapeError(f"cannot reshape {shape_str(in_shape)} to {tuple(target)}")
            out[k] = size_in // rest
        else:
            out[k] = None
    else:
        size_out = prod_dims(out)
        if size_in is not None and size_out is not None and size_in != size_out:
            raise ShapeError(f"cannot reshape {shape_str(in_shape)} ({size_in} elements) to "
                             f"{tuple(target)} ({size_out} elements)")
    return tuple(out)


reshape = defop("reshape", view=True, attrs={"shape": Ints()},
                infer=lambda types, shape: TensorType(resolve_reshape(types[0].shape, shape), types[0].dtype),
                doc="Reshape to `shape`: 0 copies the input dimension at that position, -1 is inferred.")


@reshape.kernel_factory
def _(xp, shape):
    if 0 not in shape:  # NumPy resolves -1 itself
        return lambda x: x.reshape(shape)
    return lambda x: x.reshape(resolve_reshape(x.shape, shape))


@reshape.grad
def _(node, g):
    return [reshape_like(g, node.inputs[0])]


def _reshape_dyn_infer(types):
    x, target = types
    if target.ndim != 1 or not target.dtype.is_int:
        raise DTypeError(f"reshape_dyn: the target shape must be a 1-D integer tensor, got {target!r}")
    rank = target.shape[0]
    if rank is None:
        raise ShapeError("reshape_dyn: the length of the target shape must be known when the graph is built")
    if rank == 1:  # flattening: the one dimension is the input's size
        return TensorType((prod_dims(x.shape),), x.dtype)
    return TensorType((None,) * rank, x.dtype)


reshape_dyn = defop("reshape_dyn", num_inputs=2, view=True, infer=_reshape_dyn_infer,
                    doc="Reshape to a shape read at run time from an integer vector (0 and -1 as in reshape).")


@reshape_dyn.kernel
def _(xp, x, target):
    return x.reshape(resolve_reshape(x.shape, [int(d) for d in target.tolist()]))


@reshape_dyn.grad
def _(node, g):
    return [reshape_like(g, node.inputs[0]), None]


reshape_like = defop("reshape_like", num_inputs=2, view=True, shape_only=(1,),
                     infer=lambda types: TensorType(types[1].shape, types[0].dtype),
                     doc="x reshaped to the shape of the second input (only its shape is read).")


reshape_like.identity_when(same_type_as_input)


@reshape_like.kernel
def _(xp, x, like):
    return x.reshape(like.shape)


@reshape_like.grad
def _(node, g):
    return [reshape_like(g, node.inputs[0]), None]


def _flatten_range(ndim: int, axis: int, end_axis: int) -> Tuple[int, int]:
    start, end = normalize_axis(axis, ndim), normalize_axis(end_axis, ndim)
    if end < start:
        raise ShapeError(f"flatten: end_axis {end_axis} comes before axis {axis} (rank {ndim})")
    return start, end


def _flatten_infer(types, axis, end_axis):
    t = types[0]
    start, end = _flatten_range(t.ndim, axis, end_axis)
    return TensorType(t.shape[:start] + (prod_dims(t.shape[start:end + 1]),) + t.shape[end + 1:], t.dtype)


flatten = defop("flatten", view=True, attrs={"axis": Int(1), "end_axis": Int(-1)},
                infer=_flatten_infer, doc="Caffe's Flatten: dimensions axis..end_axis (inclusive) become one.")


@flatten.kernel
def _(xp, x, *, axis, end_axis):
    start, end = _flatten_range(x.ndim, axis, end_axis)
    return x.reshape(x.shape[:start] + (math.prod(x.shape[start:end + 1]),) + x.shape[end + 1:])


@flatten.grad
def _(node, g):
    return [reshape_like(g, node.inputs[0])]


# --------------------------------------------------------------------------- transpose

def _transpose_perm(perm: Optional[Sequence[int]], ndim: int) -> Tuple[int, ...]:
    if perm is None:
        return tuple(range(ndim - 1, -1, -1))
    if len(perm) != ndim:
        raise ShapeError(f"transpose: perm {tuple(perm)} has {len(perm)} entries for a tensor of rank {ndim}")
    norm = tuple(normalize_axis(p, ndim) for p in perm)
    if sorted(norm) != list(range(ndim)):
        raise ShapeError(f"transpose: perm {tuple(perm)} is not a permutation of the axes")
    return norm


def _transpose_infer(types, perm):
    t = types[0]
    return TensorType(tuple(t.shape[p] for p in _transpose_perm(perm, t.ndim)), t.dtype)


transpose = defop("transpose", view=True, attrs={"perm": Ints(None)}, infer=_transpose_infer,
                  doc="Permute axes (default: reverse them).")


@transpose.kernel_factory
def _(xp, perm):
    # the array method skips NumPy's Python-level dispatch: this runs once per loop step in RNNs
    if perm is None:
        return lambda x: x.T
    return lambda x: x.transpose(perm)


@transpose.grad
def _(node, g):
    perm = _transpose_perm(node.attrs["perm"], node.inputs[0].ndim)
    return [transpose(g, perm=tuple(int(i) for i in np.argsort(perm)))]


contiguous = defop("contiguous", infer=lambda types: types[0],
                   doc="A C-contiguous copy of x. Loop passes materialize a transposed matrix that a GEMM "
                       "reads on every step: OpenBLAS multiplied a 32x128 block by a transposed 128x128 "
                       "view in 20 us, by the same matrix contiguous in 8-12 us.")


@contiguous.kernel
def _(xp, x, out=None):
    if out is None:
        return x.copy()
    out[...] = x
    return out


@contiguous.grad
def _(node, g):
    return [g]


def swap_last_axes(x: Value) -> Value:
    """``x`` with its last two axes exchanged (a matrix transpose over batch dimensions)."""
    n = x.ndim
    return transpose(x, perm=tuple(range(n - 2)) + (n - 1, n - 2))


# --------------------------------------------------------------------------- shape_of and fills

shape_of = defop("shape_of", pattern=OPAQUE, differentiable=False, shape_only=(0,),
                 infer=lambda types: TensorType((types[0].ndim,), int64),
                 doc="The shape of x as an int64 vector.")


@shape_of.kernel
def _(xp, x, out=None):
    shape = xp.asarray(x.shape, dtype=xp.int64)
    if out is None:
        return shape
    out[...] = shape
    return out


def _fill_like_infer(types, value=0.0, dtype=None):
    t = types[0]
    return t if dtype is None else t.with_dtype(dtype)


zeros_like = defop("zeros_like", differentiable=False, infer=_fill_like_infer,
                   shape_only=(0,), fill=0.0, attrs={"dtype": DTypeAttr(None)})
ones_like = defop("ones_like", differentiable=False, infer=_fill_like_infer,
                  shape_only=(0,), fill=1.0, attrs={"dtype": DTypeAttr(None)})
full_like = defop("full_like", differentiable=False, infer=_fill_like_infer,
                  shape_only=(0,), attrs={"value": Float(), "dtype": DTypeAttr(None)})


def _filler(fill):
    def factory(xp, dtype=None, value=None):
        v = fill if value is None else value

        def kernel(x, out=None):
            if out is None:
                return xp.full(x.shape, v, dtype=x.dtype if dtype is None else dtype.np)
            out.fill(v)
            return out
        return kernel
    return factory


zeros_like.kernel_factory(_filler(0))
ones_like.kernel_factory(_filler(1))
full_like.kernel_factory(_filler(None))


# --------------------------------------------------------------------------- Numba lowerings
# how these ops run inside a compiled loop (cgvm.ops.loop_code): every result is its own buffer
# there, so views are copies of a few elements

def _lower_reshaped(node, em, ins, outs):
    lc.reshape(em, ins[0], outs[0])


def _lower_broadcast(node, em, ins, outs):
    lc.copy(em, ins[0], outs[0])


for _op in (expand_dims, squeeze, reshape, reshape_dyn, reshape_like, flatten):
    _op.numba_lowering(_lower_reshaped)
for _op in (broadcast_like, broadcast_to, contiguous):
    _op.numba_lowering(_lower_broadcast)


@transpose.numba_lowering
def _(node, em, ins, outs):
    lc.transpose(em, ins[0], outs[0], _transpose_perm(node.attrs["perm"], ins[0].ndim))


def _lower_fill(value):
    def lower(node, em, ins, outs):
        lc.fill(em, outs[0], node.attrs["value"] if value is None else value)
    return lower


zeros_like.numba_lowering(_lower_fill(0))
ones_like.numba_lowering(_lower_fill(1))
full_like.numba_lowering(_lower_fill(None))
