"""Indexing ops: basic slicing (bounds as attributes, or as values: dynamic_slice), set/inc of a sliced
region, integer-array indexing, padding, one-hot.

Slices follow Python: ``starts``/``stops``/``steps`` per axis in ``axes`` (default: the leading
axes), with ``None``, negative indices and negative steps. Gradients of gathers are scatter-adds
(cgvm.backend.scatter_add: ``xp.add.at``, or ``cupyx.scatter_add`` on CuPy), so
repeated indices accumulate.
"""
from __future__ import annotations

import builtins
from typing import Any, Dict, List, Sequence, Tuple

from ..backend import scatter_add
from ..errors import DTypeError, ShapeError
from ..ir.attrs import DTypeAttr, Float, Int, Ints, Str
from ..ir.types import TensorType, float32
from . import reduce as red
from . import shape as shp
from . import loop_code as lc
from .registry import OPAQUE, defop
from .rules import Dim, broadcast_shapes, normalize_axis

# The op below is named `slice`, as users know it; Python's own slice is _py_slice in this module.
_py_slice = builtins.slice


def _copy_of(x: Any, out: Any) -> Any:
    """``x`` written into ``out`` (a new copy without one; nothing to do where out is x itself)
    for the kernels that return x with some elements changed."""
    if out is None:
        return x.copy()
    if out is not x:
        out[...] = x
    return out


def _require_int(t: TensorType, what: str) -> None:
    if not t.dtype.is_int:
        raise DTypeError(f"{what} must be an integer tensor, got {t!r}")


# --------------------------------------------------------------------------- slice

SLICE_ATTRS = {"starts": shp.OptionalInts(None), "stops": shp.OptionalInts(None),
               "steps": shp.OptionalInts(None), "axes": Ints(None)}


def slice_spec(ndim: int, starts, stops, steps, axes) -> Dict[int, Any]:
    """``{axis: slice}`` from slice attributes, checked against a tensor of rank ``ndim``."""
    given = [v for v in (starts, stops, steps, axes) if v is not None]
    if not given:
        raise ValueError("slice: give at least one of starts=, stops=, steps=")
    n = len(axes) if axes is not None else max(len(v) for v in given)
    for label, v in (("starts", starts), ("stops", stops), ("steps", steps)):
        if v is not None and len(v) != n:
            raise ValueError(f"slice: {label} has {len(v)} entries, expected {n}")
    if axes is None:
        axes = tuple(range(n))
    if n > ndim:
        raise ShapeError(f"slice: {n} axes sliced in a tensor of rank {ndim}")
    spec: Dict[int, Any] = {}
    for i, axis in enumerate(axes):
        a = normalize_axis(axis, ndim)
        if a in spec:
            raise ValueError(f"slice: axis {axis} is sliced twice")
        step = steps[i] if steps is not None else None
        if step == 0:
            raise ValueError("slice: step must not be zero")
        spec[a] = _py_slice(starts[i] if starts is not None else None, stops[i] if stops is not None else None, step)
    return spec


def _sliced_dim(d: Dim, s: Any) -> Dim:
    # an unknown dimension leaves the length unknown even for x[2:5] (the axis may be shorter)
    return None if d is None else len(range(*s.indices(d)))


def _slice_type(t: TensorType, attrs: Dict[str, Any]) -> TensorType:
    spec = slice_spec(t.ndim, **attrs)
    return TensorType(tuple(_sliced_dim(d, spec[i]) if i in spec else d for i, d in enumerate(t.shape)), t.dtype)


def _index_maker(starts, stops, steps, axes):
    """A function ``ndim -> index tuple``, cached per rank (ranks rarely vary)."""
    cache: Dict[int, Tuple[Any, ...]] = {}

    def index(ndim: int) -> Tuple[Any, ...]:
        hit = cache.get(ndim)
        if hit is None:
            spec = slice_spec(ndim, starts, stops, steps, axes)
            hit = cache[ndim] = tuple(spec.get(i, _py_slice(None)) for i in range(ndim))
        return hit
    return index


slice = defop("slice", view=True, attrs=dict(SLICE_ATTRS),
              infer=lambda types, **attrs: _slice_type(types[0], attrs),
              doc="x[start:stop:step] on the given axes, with Python's slice semantics.")


@slice.kernel_factory
def _(xp, starts, stops, steps, axes):
    index = _index_maker(starts, stops, steps, axes)
    return lambda x: x[index(x.ndim)]


@slice.grad
def _(node, g):
    x = node.inputs[0]
    return [inc_subtensor(shp.zeros_like(x, dtype=g.dtype), g, **node.attrs)]


def _subtensor_infer(types, **attrs):
    x, y = types
    region = _slice_type(x, attrs)
    shp.check_broadcastable_to(y.shape, region.shape, "the value for the sliced region")
    return x


def _subtensor_factory(increment: bool):
    def factory(xp, starts, stops, steps, axes):
        index = _index_maker(starts, stops, steps, axes)

        def kernel(x, y, out=None):
            if out is None:
                out = x.copy()
            elif not xp.may_share_memory(out, x):  # in place, out is x's own buffer already
                out[...] = x
            idx = index(x.ndim)
            if increment:
                out[idx] += y
            else:
                out[idx] = y
            return out
        return kernel
    return factory


set_subtensor = defop("set_subtensor", num_inputs=2, inplace=((0, 0),),
                      attrs=dict(SLICE_ATTRS), infer=_subtensor_infer,
                      doc="A copy of x whose sliced region is set to y (broadcast).")
inc_subtensor = defop("inc_subtensor", num_inputs=2, inplace=((0, 0),),
                      attrs=dict(SLICE_ATTRS), infer=_subtensor_infer,
                      doc="A copy of x whose sliced region is incremented by y (broadcast).")
set_subtensor.kernel_factory(_subtensor_factory(increment=False))
inc_subtensor.kernel_factory(_subtensor_factory(increment=True))


def _region_grad(g, y, attrs):
    region = slice(g, **attrs)
    return red.sum_to_like(region, y) if region.shape != y.shape or None in y.shape else region


@set_subtensor.grad
def _(node, g):
    x, y = node.inputs
    return [set_subtensor(g, 0, **node.attrs), _region_grad(g, y, node.attrs)]


@inc_subtensor.grad
def _(node, g):
    x, y = node.inputs
    return [g, _region_grad(g, y, node.attrs)]


# --------------------------------------------------------------------------- slices with bounds known at run time

def _bounds_infer(types, axis, step, what):
    x, start, stop = types[-3:]
    for t, name in ((start, "start"), (stop, "stop")):
        _require_int(t, f"{what}: the {name}")
        if t.ndim != 0:
            raise ShapeError(f"{what}: the {name} must be a scalar, got {t!r}")
    if step == 0:
        raise ValueError(f"{what}: the step cannot be zero")
    return normalize_axis(axis, x.ndim)


def _dynamic_slice_infer(types, axis, step):
    x = types[0]
    a = _bounds_infer(types, axis, step, "dynamic_slice")
    return TensorType(x.shape[:a] + (None,) + x.shape[a + 1:], x.dtype)


dynamic_slice = defop("dynamic_slice", num_inputs=3, view=True, attrs={"axis": Int(0), "step": Int(1)},
                      infer=_dynamic_slice_infer,
                      doc="x[start:stop:step] along axis, start and stop 0-d integer values known at run time "
                          "(Python's rules: negative bounds count from the end, out-of-range ones clamp); a "
                          "view, as the slice op (Theano's X[i * n:(i + 1) * n] of a givens minibatch).")


def _range_index(x, start, stop, axis, step):
    return (_py_slice(None),) * (axis % x.ndim) + (_py_slice(int(start), int(stop), step),)


@dynamic_slice.kernel
def _(xp, x, start, stop, *, axis, step):
    return x[_range_index(x, start, stop, axis, step)]


@dynamic_slice.grad
def _(node, g):
    x, start, stop = node.inputs
    return [dynamic_slice_grad(g, x, start, stop, **node.attrs), None, None]


def _dynamic_slice_grad_infer(types, axis, step):
    _bounds_infer(types, axis, step, "dynamic_slice_grad")
    return TensorType(types[1].shape, types[0].dtype)


dynamic_slice_grad = defop("dynamic_slice_grad", num_inputs=4, pattern=OPAQUE, shape_only=(1,),
                           attrs={"axis": Int(0), "step": Int(1)}, infer=_dynamic_slice_grad_infer,
                           doc="Zeros shaped like x with g in the region dynamic_slice read (its adjoint).")


@dynamic_slice_grad.kernel
def _(xp, g, x, start, stop, *, axis, step, out=None):
    if out is None:
        out = xp.zeros(x.shape, dtype=g.dtype)
    else:
        out.fill(0)
    out[_range_index(out, start, stop, axis, step)] = g
    return out


@dynamic_slice_grad.grad
def _(node, gg):
    _, x, start, stop = node.inputs
    return [dynamic_slice(gg, start, stop, **node.attrs), None, None, None]


# --------------------------------------------------------------------------- take / advanced indexing

def _take_infer(types, axis):
    x, idx = types
    _require_int(idx, "take: indices")
    if axis is None:
        return TensorType(idx.shape, x.dtype)
    a = normalize_axis(axis, x.ndim)
    return TensorType(x.shape[:a] + idx.shape + x.shape[a + 1:], x.dtype)


take = defop("take", num_inputs=2, attrs={"axis": Int(None)}, infer=_take_infer,
             doc="numpy.take: elements of x at integer indices along axis (the flattened x if None).")


@take.kernel
def _(xp, x, indices, *, axis, out=None):
    return xp.take(x, indices, axis=axis, out=out)


@take.grad
def _(node, g):
    x, indices = node.inputs
    return [take_grad(g, x, indices, axis=node.attrs["axis"]), None]


take_grad = defop("take_grad", num_inputs=3, pattern=OPAQUE, attrs={"axis": Int(None)},
                  infer=lambda types, axis: TensorType(types[1].shape, types[0].dtype),
                  doc="Zeros shaped like x with g scatter-added at the indices take read (its adjoint).")


@take_grad.kernel
def _(xp, g, x, indices, *, axis, out=None):
    if out is None:
        out = xp.zeros(x.shape, dtype=g.dtype)
    else:
        out.fill(0)
    if axis is None:  # flat indices (negative ones count from the end) as one index array per axis
        index = xp.unravel_index(indices % max(x.size, 1), x.shape)
    else:
        index = (_py_slice(None),) * (axis % x.ndim) + (indices,)
    scatter_add(xp, out, index, g)
    return out


@take_grad.grad
def _(node, gg):
    return [take(gg, node.inputs[2], axis=node.attrs["axis"]), None, None]


def _take_add_infer(types, axis):
    x, g, idx = types
    _require_int(idx, "take_add: indices")
    if g.dtype is not x.dtype:
        raise DTypeError(f"take_add: values {g!r} and x {x!r} differ in dtype")
    return x


take_add = defop("take_add", num_inputs=3, pattern=OPAQUE, inplace=((0, 0),), attrs={"axis": Int(0)},
                 infer=_take_add_infer,
                 doc="A copy of x with g scatter-added at the indices along axis (repeats accumulate): "
                     "x + take_grad(g, x, indices) without the zeros, an SGD step on the embedding rows "
                     "a sentence read (which may overwrite x's own array).")


@take_add.kernel
def _(xp, x, g, indices, *, axis, out=None):
    out = _copy_of(x, out)
    scatter_add(xp, out, (_py_slice(None),) * (axis % x.ndim) + (indices,), g)
    return out


@take_add.grad
def _(node, gout):
    return [gout, take(gout, node.inputs[2], axis=node.attrs["axis"]), None]


def _advanced_infer(types):
    x, indices = types[0], types[1:]
    for i, t in enumerate(indices):
        _require_int(t, f"advanced_index: index {i}")
    if len(indices) > x.ndim:
        raise ShapeError(f"advanced_index: {len(indices)} index arrays for a tensor of rank {x.ndim}")
    return TensorType(broadcast_shapes(*[t.shape for t in indices]) + x.shape[len(indices):], x.dtype)


advanced_index = defop("advanced_index", num_inputs=(2, None), infer=_advanced_infer,
                       doc="x[i0, i1, ...] with integer index arrays (broadcast together) on the leading axes.")


@advanced_index.kernel
def _(xp, x, *indices, out=None):
    r = x[tuple(indices)]
    if out is None:
        return r
    out[...] = r
    return out


@advanced_index.grad
def _(node, g):
    x, indices = node.inputs[0], node.inputs[1:]
    return [advanced_index_grad(g, x, *indices)] + [None] * len(indices)


advanced_index_grad = defop("advanced_index_grad", num_inputs=(3, None), pattern=OPAQUE,
                            infer=lambda types: TensorType(types[1].shape, types[0].dtype),
                            doc="Zeros shaped like x with g scatter-added at x[i0, i1, ...] (the adjoint).")


@advanced_index_grad.kernel
def _(xp, g, x, *indices, out=None):
    if out is None:
        out = xp.zeros(x.shape, dtype=g.dtype)
    else:
        out.fill(0)
    scatter_add(xp, out, tuple(indices), g)
    return out


@advanced_index_grad.grad
def _(node, gg):
    indices = node.inputs[2:]
    return [advanced_index(gg, *indices), None] + [None] * len(indices)


# --------------------------------------------------------------------------- pad

PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")


def _pad_pairs(pads: Sequence[int], ndim: int) -> List[Tuple[int, int]]:
    if len(pads) != 2 * ndim:
        raise ShapeError(f"pad: pads {tuple(pads)} must hold (before, after) for each of the {ndim} axes")
    if any(p < 0 for p in pads):
        raise ValueError(f"pad: negative padding {tuple(pads)}")
    return [(pads[2 * i], pads[2 * i + 1]) for i in range(ndim)]


def _pad_infer(types, pads, mode, value):
    t = types[0]
    pairs = _pad_pairs(pads, t.ndim)
    for d, (b, a) in zip(t.shape, pairs):
        if mode != "constant" and d == 0 and (b or a):
            raise ShapeError(f"pad: mode {mode!r} cannot extend an empty axis")
    return TensorType(tuple(None if d is None else d + b + a for d, (b, a) in zip(t.shape, pairs)), t.dtype)


def _source_index(xp: Any, mode: str, n: int, before: int, after: int) -> Any:
    """For each position along a padded axis, the input position it copies (non-constant modes)."""
    if n == 0:
        raise ValueError(f"pad: mode {mode!r} cannot extend an empty axis")
    k = xp.arange(-before, n + after)
    if mode == "edge":
        return xp.clip(k, 0, n - 1)
    if mode == "wrap":
        return k % n
    if mode == "symmetric":
        m = k % (2 * n)
        return xp.where(m < n, m, 2 * n - 1 - m)
    if n == 1:  # reflect about a single element repeats it
        return xp.zeros_like(k)
    period = 2 * (n - 1)
    m = k % period
    return xp.where(m < n, m, period - m)


def _interior(shape: Sequence[int], pairs: Sequence[Tuple[int, int]]) -> Tuple[Any, ...]:
    return tuple(_py_slice(b, b + d) for d, (b, _) in zip(shape, pairs))


pad = defop("pad", infer=_pad_infer,
            attrs={"pads": Ints(), "mode": Str("constant", choices=PAD_MODES), "value": Float(0.0)},
            doc="Pad each axis by (before, after) = pads[2i], pads[2i+1]; constant `value`, or copies of "
                "the input as numpy.pad's edge/reflect/symmetric/wrap modes.")


@pad.kernel
def _(xp, x, *, pads, mode, value, out=None):
    pairs = _pad_pairs(pads, x.ndim)
    if mode == "constant":
        if out is None:
            out = xp.empty(tuple(d + b + a for d, (b, a) in zip(x.shape, pairs)), dtype=x.dtype)
        out.fill(value)
        out[_interior(x.shape, pairs)] = x
        return out
    r = x
    for axis, (b, a) in enumerate(pairs):
        if b or a:
            r = xp.take(r, _source_index(xp, mode, r.shape[axis], b, a), axis=axis)
    if out is None:
        return r.copy() if r is x else r
    out[...] = r
    return out


@pad.grad
def _(node, g):
    return [pad_grad(g, node.inputs[0], pads=node.attrs["pads"], mode=node.attrs["mode"])]


pad_grad = defop("pad_grad", num_inputs=2, pattern=OPAQUE,
                 attrs={"pads": Ints(), "mode": Str("constant", choices=PAD_MODES)},
                 infer=lambda types, pads, mode: TensorType(types[1].shape, types[0].dtype),
                 doc="The adjoint of pad: the interior of g, plus (non-constant modes) the padding folded back.")


@pad_grad.kernel
def _(xp, g, x, *, pads, mode, out=None):
    pairs = _pad_pairs(pads, x.ndim)
    if mode == "constant":
        r = g[_interior(x.shape, pairs)]
    else:
        r = g
        for axis, (b, a) in enumerate(pairs):
            if b or a:
                n = x.shape[axis]
                folded = xp.zeros(r.shape[:axis] + (n,) + r.shape[axis + 1:], dtype=g.dtype)
                scatter_add(xp, folded, (_py_slice(None),) * axis + (_source_index(xp, mode, n, b, a),), r)
                r = folded
    if out is None:
        return r.copy() if r is g or mode == "constant" else r
    out[...] = r
    return out


@pad_grad.grad
def _(node, gg):
    return [pad(gg, pads=node.attrs["pads"], mode=node.attrs["mode"], value=0.0), None]


# --------------------------------------------------------------------------- one_hot

def _one_hot_infer(types, depth, dtype):
    _require_int(types[0], "one_hot: indices")
    if depth < 0:
        raise ValueError(f"one_hot: negative depth {depth}")
    return TensorType(types[0].shape + (depth,), dtype)


one_hot = defop("one_hot", differentiable=False, infer=_one_hot_infer,
                attrs={"depth": Int(), "dtype": DTypeAttr(float32)},
                doc="A new last axis of length depth, 1 at each index and 0 elsewhere (rows of out-of-range "
                    "indices are all 0).")


@one_hot.kernel
def _(xp, indices, *, depth, dtype, out=None):
    hits = indices[..., None] == xp.arange(depth)
    if out is None:
        return hits.astype(dtype.np)
    out[...] = hits
    return out



# --------------------------------------------------------------------------- assignment at integer indices

def _take_set_infer(types, axis):
    x, val, idx = types
    _require_int(idx, "take_set: indices")
    return x


take_set = defop("take_set", num_inputs=3, pattern=OPAQUE, attrs={"axis": Int(0)}, infer=_take_set_infer,
                 doc="A copy of x with x[..., idx, ...] (idx on `axis`) set to val; with repeated indices the "
                     "last write wins (NumPy's assignment, Theano's set_subtensor).")


@take_set.kernel
def _(xp, x, val, idx, *, axis, out=None):
    out = _copy_of(x, out)
    out[(_py_slice(None),) * (axis % x.ndim) + (idx,)] = val
    return out


@take_set.grad
def _(node, g):
    x, val, idx = node.inputs
    axis = node.attrs["axis"]
    gx = take_set(g, shp.zeros_like(take(g, idx, axis=axis)), idx, axis=axis)
    gv = take(g, idx, axis=axis)
    return [gx, red.sum_to_like(gv, val) if gv.shape != val.shape or None in val.shape else gv, None]


advanced_set = defop("advanced_set", num_inputs=(3, None), pattern=OPAQUE,
                     infer=lambda types: types[0],
                     doc="A copy of x with x[i0, i1, ...] set to val (the last write wins on repeats).")


@advanced_set.kernel
def _(xp, x, val, *indices, out=None):
    out = _copy_of(x, out)
    out[tuple(indices)] = val
    return out


@advanced_set.grad
def _(node, g):
    val, indices = node.inputs[1], node.inputs[2:]
    gv = advanced_index(g, *indices)
    gx = advanced_set(g, shp.zeros_like(gv), *indices)
    return [gx, red.sum_to_like(gv, val) if gv.shape != val.shape or None in val.shape else gv] + [None] * len(indices)


# --------------------------------------------------------------------------- Numba lowerings
# how slicing runs inside a compiled loop (cgvm.ops.loop_code): the region's elements by index

def _region_index(attrs: Dict[str, Any], shape: Sequence[int], idx: Sequence[str]) -> List[str]:
    """Source indices into an array of ``shape`` of element ``idx`` of its sliced region."""
    spec = slice_spec(len(shape), **attrs)
    out = []
    for a, i in enumerate(idx):
        if a in spec:
            start, _, step = spec[a].indices(shape[a])
            out.append(f"{start} + {i} * {step}")
        else:
            out.append(i)
    return out


@slice.numba_lowering
def _(node, em, ins, outs):
    x, out = ins[0], outs[0]
    with em.loops(out.shape) as idx:
        em.line(f"{out.at(idx)} = {x.at(_region_index(node.attrs, x.shape, idx))}")


def _lower_subtensor(increment: bool):
    def lower(node, em, ins, outs):
        (x, y), out = ins, outs[0]
        lc.copy(em, x, out)
        region = _slice_type(TensorType(x.shape, x.dtype), node.attrs).shape
        with em.loops(region) as idx:
            target = out.at(_region_index(node.attrs, x.shape, idx))
            em.line(f"{target} {'+=' if increment else '='} {y.at_broadcast(idx, region)}")
    return lower


set_subtensor.numba_lowering(_lower_subtensor(False))
inc_subtensor.numba_lowering(_lower_subtensor(True))
