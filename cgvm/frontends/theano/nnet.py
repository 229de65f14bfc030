"""``T.nnet``: activations, softmax, cross-entropies, conv2d, batch normalization.

Numerically stable forms are chosen when the graph is built: ``T.log(softmax(x))`` becomes
``log_softmax(x)`` (also through the row/label indexing of the classic negative log-likelihood),
``T.log(sigmoid(x))`` becomes ``-softplus(-x)`` and ``T.log(1 - sigmoid(x))`` ``-softplus(x)``;
see ``stable_log``, which ``T.log`` calls.

``softmax`` is Theano's: row-wise over the last axis. ``conv2d`` follows Theano's defaults:
NCHW, filters (out, in, kh, kw) and ``filter_flip=True``, a true convolution (the kernel is
flipped), unlike Caffe's and PyTorch's cross-correlation.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ...ir.graph import CONST, Value
from ...ops import conv as cv
from ...ops import elementwise as ew
from ...ops import indexing as ix
from ...ops import nn
from . import basic as B
from . import shapes as S
from .basic import sigmoid, softplus  # noqa: F401
from .var import TensorVariable, as_tensor_variable, wrap

__all__ = ["sigmoid", "softplus", "ultra_fast_sigmoid", "hard_sigmoid", "relu", "elu", "selu", "softsign",
           "softmax", "logsoftmax", "log_softmax", "categorical_crossentropy", "binary_crossentropy",
           "sigmoid_binary_crossentropy", "conv2d", "batch_normalization", "bn", "stable_log"]


def ultra_fast_sigmoid(x: Any) -> TensorVariable:
    return sigmoid(x)


def hard_sigmoid(x: Any) -> TensorVariable:
    """clip(0.2 x + 0.5, 0, 1), Theano's piecewise-linear sigmoid."""
    return B.clip(B.add(B.mul(x, 0.2), 0.5), 0.0, 1.0)


def relu(x: Any, alpha: Any = 0) -> TensorVariable:
    """max(x, 0), or leaky with slope ``alpha`` below zero (alpha may be a tensor).

    Written as Theano 1.0 writes it, ``0.5 * (x + abs(x))`` (``f1 x + f2 |x|`` when leaky), so that
    its gradient is Theano's too: ``0.5 * (1 + alpha)`` at exactly 0, where cgvm's relu op gives 0.
    The values are max(x, 0) to the bit (x + |x| is 2x or +0, and halving is exact)."""
    if isinstance(alpha, (int, float)):
        if alpha == 0:
            return B.mul(B.add(x, B.abs(x)), 0.5)
        f1, f2 = 0.5 * (1 + alpha), 0.5 * (1 - alpha)
    else:
        f1, f2 = B.mul(B.add(1, alpha), 0.5), B.mul(B.sub(1, alpha), 0.5)
    return B.add(B.mul(f1, x), B.mul(f2, B.abs(x)))


def elu(x: Any, alpha: float = 1.0) -> TensorVariable:
    return wrap(ew.elu(as_tensor_variable(x).value, alpha=float(alpha)))


def selu(x: Any) -> TensorVariable:
    return B.mul(elu(x, 1.6732632423543772), 1.0507009873554805)


def softsign(x: Any) -> TensorVariable:
    return B.true_div(x, B.add(B.abs(x), 1))


def _as_row(v: Value, axis: Optional[int]) -> Value:
    """Theano 1.0's softmax ops take a vector as a 1 x n row (and return one)."""
    return S.shape_padleft(wrap(v)).value if v.ndim == 1 and axis == -1 else v


def softmax(c: Any, axis: Optional[int] = -1) -> TensorVariable:
    """Row-wise softmax (over the last axis; ``axis`` as in PyTensor's ``softmax(x, axis)``).

    A vector gives a 1 x n row, as Theano's ``T.nnet.softmax`` does.
    """
    v = _as_row(as_tensor_variable(c).value, axis)
    if axis is None:
        flat = S.flatten(wrap(v))
        return S.reshape(wrap(nn.softmax(flat.value, axis=0)), S.shape(wrap(v)))
    return wrap(nn.softmax(v, axis=axis % max(v.ndim, 1)))


def logsoftmax(c: Any, axis: Optional[int] = -1) -> TensorVariable:
    v = _as_row(as_tensor_variable(c).value, axis)
    return wrap(nn.log_softmax(v, axis=(axis if axis is not None else -1) % max(v.ndim, 1)))


log_softmax = logsoftmax


def stable_log(x: Value) -> Optional[Value]:
    """A stable replacement for log(x) when x is a softmax, a sigmoid (possibly indexed) or 1 + exp(z), else None."""
    node = x.node
    if node is None:
        return None
    op = node.op.name
    if op == "softmax":
        return nn.log_softmax(node.inputs[0], axis=node.attrs["axis"])
    if op == "sigmoid":
        return ew.neg(ew.softplus(ew.neg(node.inputs[0])))
    if op == "sub" and _is_one(node.inputs[0]) and node.inputs[1].node is not None \
            and node.inputs[1].node.op.name == "sigmoid":
        return ew.neg(ew.softplus(node.inputs[1].node.inputs[0]))
    if op == "add":  # log(1 + exp(z)) -> softplus(z), so its gradient is sigmoid(z), not inf/inf
        for one, y in (node.inputs, node.inputs[::-1]):
            if _is_one(one) and y.node is not None and y.node.op.name == "exp" and y.type == x.type:
                return ew.softplus(y.node.inputs[0])
    if op in ("advanced_index", "take", "slice", "dynamic_slice", "squeeze", "expand_dims"):
        inner = stable_log(node.inputs[0])
        if inner is not None:
            return node.op(inner, *node.inputs[1:], **node.attrs)
    return None


def _is_one(v: Value) -> bool:
    return v.kind == CONST and v.data.size == 1 and float(v.data) == 1.0


def categorical_crossentropy(coding_dist: Any, true_dist: Any) -> TensorVariable:
    """-log(p[label]) per row for an int label vector, or -sum(t * log(p)) per row for one-hot rows."""
    p = as_tensor_variable(coding_dist)
    t = as_tensor_variable(true_dist)
    if t.ndim == p.ndim - 1 and t.value.dtype.is_int:
        rows = S.arange(S.shape(p)[0])
        return B.neg(B.log(p[rows, t]))
    if t.ndim == p.ndim:
        return B.neg(B.sum(B.mul(t, B.log(p)), axis=p.ndim - 1))
    raise TypeError(f"categorical_crossentropy: true_dist must be an int vector of labels or a matrix like "
                    f"coding_dist, got {t.type!r}")


def binary_crossentropy(output: Any, target: Any) -> TensorVariable:
    """-(t log(o) + (1 - t) log(1 - o)), elementwise (stable when ``output`` is a sigmoid)."""
    return B.neg(B.add(B.mul(target, B.log(output)), B.mul(B.sub(1, target), B.log(B.sub(1, output)))))


def sigmoid_binary_crossentropy(output: Any, target: Any) -> TensorVariable:
    """binary_crossentropy(sigmoid(output), target) computed from the logits, stably."""
    return B.sub(softplus(output), B.mul(target, output))


def crossentropy_softmax_1hot(x: Any, y_idx: Any) -> tuple:
    sm = softmax(x)
    return categorical_crossentropy(sm, y_idx), sm


def _pair(v: Any) -> tuple:
    return (int(v), int(v)) if isinstance(v, (int,)) else tuple(int(a) for a in v)


def conv2d(input: Any, filters: Any, input_shape: Any = None, filter_shape: Any = None, border_mode: Any = "valid",
           subsample: Sequence[int] = (1, 1), filter_flip: bool = True, image_shape: Any = None,
           filter_dilation: Sequence[int] = (1, 1), num_groups: int = 1, unshared: bool = False,
           **kwargs: Any) -> TensorVariable:
    """Theano's conv2d: NCHW input, (out, in/groups, kh, kw) filters; ``filter_flip=True`` convolves."""
    if unshared:
        raise ValueError("conv2d: unshared (locally connected) convolution is not supported")
    x = as_tensor_variable(input)
    w = as_tensor_variable(filters)
    if x.ndim != 4 or w.ndim != 4:
        raise TypeError(f"conv2d needs 4-D input and filters, got {x.ndim}-D and {w.ndim}-D")
    kshape = tuple(filter_shape)[2:] if filter_shape is not None else w.value.shape[2:]
    dil = _pair(filter_dilation)
    if border_mode == "valid":
        pad = (0, 0)
    elif border_mode in ("full", "half", "same"):
        if None in kshape:
            raise ValueError(f"conv2d: border_mode={border_mode!r} needs the filter size; pass filter_shape=")
        eff = [(k - 1) * d + 1 for k, d in zip(kshape, dil)]
        pad = tuple(e - 1 for e in eff) if border_mode == "full" else tuple(e // 2 for e in eff)
    else:
        pad = _pair(border_mode)
    if filter_flip:
        w = w[:, :, ::-1, ::-1]
    out = cv.conv(x.value, w.value, stride=_pair(subsample), pad=pad, dilation=dil, groups=int(num_groups))
    return wrap(out)


def batch_normalization(inputs: Any, gamma: Any, beta: Any, mean: Any, std: Any, mode: str = "low_mem") -> TensorVariable:
    """(inputs - mean) * (gamma / std) + beta, broadcasting as the arguments do."""
    return B.add(B.mul(B.sub(inputs, mean), B.true_div(gamma, std)), beta)


def batch_normalization_train(inputs: Any, gamma: Any, beta: Any, axes: Any = "per-activation", epsilon: float = 1e-4,
                              running_average_factor: float = 0.1, running_mean: Any = None,
                              running_var: Any = None) -> tuple:
    """Normalize with the batch statistics over ``axes``; returns (out, mean, invstd)."""
    x = as_tensor_variable(inputs)
    if axes == "per-activation":
        axes = (0,)
    elif axes == "spatial":
        axes = (0,) + tuple(range(2, x.ndim))
    mean = B.mean(x, axis=axes, keepdims=True)
    var = B.var(x, axis=axes, keepdims=True)
    invstd = B.true_div(1.0, B.sqrt(B.add(var, epsilon)))
    out = B.add(B.mul(B.mul(B.sub(x, mean), invstd), gamma), beta)
    return out, mean, invstd


def batch_normalization_test(inputs: Any, gamma: Any, beta: Any, mean: Any, var: Any, axes: Any = "per-activation",
                             epsilon: float = 1e-4) -> TensorVariable:
    return batch_normalization(inputs, gamma, beta, mean, B.sqrt(B.add(var, epsilon)))


class _BN:
    batch_normalization = staticmethod(batch_normalization)
    batch_normalization_train = staticmethod(batch_normalization_train)
    batch_normalization_test = staticmethod(batch_normalization_test)


bn = _BN()


def to_one_hot(y: Any, nb_class: int, dtype: Optional[str] = None) -> TensorVariable:
    from .config import config

    return wrap(ix.one_hot(as_tensor_variable(y).value, depth=int(nb_class), dtype=dtype or config.floatX))


import sys as _sys  # noqa: E402

nnet = _sys.modules[__name__]  # ``T.nnet.nnet.sigmoid`` in older scripts
conv = nnet
