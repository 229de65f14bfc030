"""Sequence ops (SequenceConstruct/Empty/Insert/At/Erase/Length, SplitToSequence,
ConcatFromSequence): a sequence is a list of Values whose length and positions are known when the
model is translated; optionals (Optional, OptionalHasElement, OptionalGetElement), whose emptiness
is known then too; and the training-preview Gradient op, computed by cgvm.grad."""
from __future__ import annotations

import numpy as np

from cgvm.ops import join as J
from cgvm.ops import shape as shp

from ..translate import OptionalValue, Sequence, rule
from .common import axis_of, ints


def _seq(n, i):
    v = n.inputs[i]
    if not isinstance(v, Sequence):
        raise n.error(f"input {i} must be a sequence")
    return v


def _position(n, i, length, default):
    if not n.has_input(i):
        return default
    p = int(np.asarray(n.need_static(i, "position")).reshape(-1)[0])
    return p + length if p < 0 else p


@rule("SequenceConstruct")
def _construct(n):
    return [Sequence(v for v in n.inputs)]


@rule("SequenceEmpty")
def _empty(n):
    return [Sequence()]


@rule("SequenceInsert")
def _insert(n):
    seq = Sequence(_seq(n, 0))
    seq.insert(_position(n, 2, len(seq), len(seq)), n.input(1))
    return [seq]


@rule("SequenceAt")
def _at(n):
    seq = _seq(n, 0)
    return seq[_position(n, 1, len(seq), 0)]


@rule("SequenceErase")
def _erase(n):
    seq = Sequence(_seq(n, 0))
    del seq[_position(n, 1, len(seq), len(seq) - 1)]
    return [seq]


@rule("SequenceLength")
def _length(n):
    return np.asarray(len(_seq(n, 0)), np.int64)


@rule("SplitToSequence")
def _split_to_sequence(n):
    x = n.input(0)
    axis = axis_of(n.attr("axis", 0), x.ndim)
    dim = n.shape(0)[axis]
    if n.has_input(1):
        split = np.asarray(n.need_static(1, "split"))
        sizes = [int(split)] * (dim // int(split)) + ([dim % int(split)] if dim % int(split) else []) \
            if split.ndim == 0 else ints(split)
        keep = True
    else:
        sizes, keep = [1] * dim, bool(n.attr("keepdims", 1))
    parts = list(J.split(x, axis=axis, sizes=tuple(sizes))) if len(sizes) > 1 else [shp.contiguous(x)]
    if not keep:
        parts = [shp.squeeze(p, axis=(axis,)) for p in parts]
    return [Sequence(parts)]


@rule("ConcatFromSequence")
def _concat_from_sequence(n):
    seq = _seq(n, 0)
    if n.attr("new_axis", 0):
        return J.stack(*seq, axis=axis_of(n.attr("axis"), seq[0].ndim + 1))
    return J.concat(*seq, axis=axis_of(n.attr("axis"), seq[0].ndim))


@rule("SequenceMap")
def _sequence_map(n):
    """The body applied to each position of the sequences (tensor inputs are given whole each time)."""
    body = n.subgraph("body")
    seq = _seq(n, 0)
    for k, v in enumerate(n.inputs[1:], 1):
        if isinstance(v, Sequence) and len(v) != len(seq):
            raise n.error(f"input {k} is a sequence of {len(v)} values, input 0 of {len(seq)}")
    results = [Sequence() for _ in body.output]
    for i in range(len(seq)):
        bound = {f"in{k}": (v[i] if isinstance(v, Sequence) else v) for k, v in enumerate(n.inputs)}
        for r, out in zip(results, n.run_subgraph(body, bound)):
            r.append(out)
    return results


@rule("Optional")
def _optional(n):
    return [OptionalValue(n.inputs[0] if n.has_input(0) else None)]


@rule("OptionalHasElement")
def _optional_has_element(n):
    v = n.inputs[0] if n.has_input(0) else None
    return np.asarray(v is not None and not (isinstance(v, OptionalValue) and v.empty))


@rule("OptionalGetElement")
def _optional_get_element(n):
    v = n.input(0)
    if isinstance(v, OptionalValue):
        if v.empty:
            raise n.error("OptionalGetElement of an empty optional")
        v = v.value
    return [v]


@rule("Gradient", domain="ai.onnx.preview.training", fold=False)
def _gradient(n):
    """d y / d x for each x named in ``xs`` (the values ``zs`` names are held constant)."""
    from cgvm.ops import reduce as R

    import cgvm.autodiff as AD

    names = list(n.attr("xs"))
    y = n.tr.env[n.attr("y")]
    xs = [n.tr.env[x] for x in names]
    target = y if y.ndim == 0 else R.sum(y, axis=None, keepdims=False)
    return list(AD.grad(target, xs))
