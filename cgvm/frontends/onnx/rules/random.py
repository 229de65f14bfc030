"""Random ONNX ops: RandomUniform(Like), RandomNormal(Like), Multinomial, and Dropout in training mode (Bernoulli
is translated through its function body, on RandomUniformLike).

Each random node draws with cgvm's ``random_draw`` from a generator state of its own, a Workspace
entry ``<prefix>rng<k>:<output name>`` (the k-th random node translated) created from the node's ``seed`` (or a fresh one when it has
none) the first time the model is translated; the compiled model writes the next state back after
every call, so successive calls draw afresh and a model reloaded with the same seeds repeats them.
"""
from __future__ import annotations

import numpy as np

from cgvm.ir import TensorType, param_value
from cgvm.ir.graph import const_value
from cgvm.ir.types import int64
from cgvm.ops import elementwise as E
from cgvm.ops import indexing as I
from cgvm.ops import random as RND
from cgvm.ops import shape as shp

from ..translate import np_dtype, rule
from .common import cast_to, const, ints


def _state(n):
    """The node's generator state (a parameter of the workspace) and where its next value goes."""
    tr = n.tr
    # numbered in translation order (stable from one translation to the next): two expansions of one
    # function body have the same output names
    name = f"{tr.prefix}rng{len(tr.updates)}:{n.node.output[0]}"
    if tr.workspace is not None and name not in tr.workspace:
        seed = n.attr("seed", None)
        # ONNX's seed is a float attribute; without one the generator is seeded afresh
        seed = int(np.random.SeedSequence().entropy % (1 << 62)) if seed is None else int(seed)
        tr.workspace[name] = RND.initial_state(seed)
    return param_value(name, TensorType((2,), int64))


def draw(n, shape, dist: str, a: float, b: float, dtype):
    """A sample of ``shape`` (known) from ``dist`` with parameters a, b, advancing the node's state."""
    state = _state(n)
    shape = tuple(int(d) for d in shape)
    sample, nxt = RND.random_draw(state, const_value(np.asarray(shape, np.int64).reshape(-1)),
                                  const_value(np.float64(a)), const_value(np.float64(b)), dist=dist,
                                  dtype=np.dtype(dtype), static_shape=shape)
    n.tr.updates[state] = nxt
    return sample


def _dtype(n, default):
    d = n.attr("dtype", None)
    return np_dtype(d) if d is not None else np.dtype(default)


@rule("RandomUniform", fold=False)
def _random_uniform(n):
    return draw(n, ints(n.attr("shape")), "uniform", n.attr("low", 0.0), n.attr("high", 1.0),
                _dtype(n, np.float32))


@rule("RandomNormal", fold=False)
def _random_normal(n):
    return draw(n, ints(n.attr("shape")), "normal", n.attr("mean", 0.0), n.attr("scale", 1.0),
                _dtype(n, np.float32))


@rule("RandomUniformLike", fold=False)
def _random_uniform_like(n):
    return draw(n, n.shape(0), "uniform", n.attr("low", 0.0), n.attr("high", 1.0), _dtype(n, n.input(0).dtype.np))


@rule("RandomNormalLike", fold=False)
def _random_normal_like(n):
    return draw(n, n.shape(0), "normal", n.attr("mean", 0.0), n.attr("scale", 1.0), _dtype(n, n.input(0).dtype.np))


@rule("Dropout", fold=False)
def _dropout(n):
    """Inference: the input (and an all-true mask). Training (opset 12 on, training_mode true): each
    element kept with probability 1 - ratio and scaled by 1 / (1 - ratio); the mask says which."""
    x = n.input(0)
    if n.has_input(2) and n.static(2) is None:
        raise n.error("training_mode must be known when the model is translated")
    training = n.opset >= 12 and n.has_input(2) and bool(np.asarray(n.static(2)).reshape(-1)[0])
    ratio = n.static(1) if n.has_input(1) else np.float32(0.5)
    if not training or (ratio is not None and float(np.asarray(ratio).reshape(-1)[0]) == 0.0):
        outs = [shp.contiguous(x)]
        if n.num_outputs > 1:
            outs.append(shp.ones_like(x, dtype="bool"))
        return outs
    work = x.dtype.np if x.dtype.is_float else np.float32
    r = cast_to(n.input(1), work) if n.has_input(1) else const(0.5, dtype=work)
    keep = E.ge(draw(n, n.shape(0), "uniform", 0.0, 1.0, work), r)
    scale = E.div(const(1.0, dtype=work), E.sub(const(1.0, dtype=work), r))
    y = E.where(keep, cast_to(E.mul(cast_to(x, work), scale), x.dtype.np), shp.zeros_like(x))
    return [y, keep] if n.num_outputs > 1 else [y]


@rule("Multinomial", fold=False)
def _multinomial(n):
    """sample_size class indices per batch row, drawn from the softmax of the row (unnormalized log
    probabilities): one uniform per sample, its class the number of cumulative probabilities below it."""
    from cgvm.ops import nn as NN
    from cgvm.ops import reduce as R

    x = n.input(0)
    batch, classes = n.shape(0)
    samples = int(n.attr("sample_size", 1))
    work = np.float64 if x.dtype.np == np.float64 else np.float32
    cdf = R.cumsum(NN.softmax(cast_to(x, work), axis=1), axis=1)
    u = draw(n, (batch, samples, 1), "uniform", 0.0, 1.0, work)
    below = E.ge(u, shp.reshape(I.slice(cdf, starts=(0,), stops=(classes - 1,), steps=(1,), axes=(1,)),
                                shape=(batch, 1, classes - 1)))
    return E.cast(R.sum(E.cast(below, dtype=np.int64), axis=(2,)), dtype=_dtype(n, np.int32))
