"""The embedded default job: a classifier for scikit-learn's handwritten digits, built on the core API.

Shows the whole path: a graph written with ops, ``cgvm.grad``, SGD updates compiled into one
function over a Workspace, minibatch training, and test accuracy.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from .autodiff import grad
from .compiled import compile
from .ir import TensorType, input_value, param_value
from .ops import elementwise as E
from .ops import linalg as L
from .ops import loss as LS
from .ops import reduce as R
from .vm import Workspace


def load_digits_split(seed: int = 0, test_fraction: float = 0.25):
    """(x_train, y_train, x_test, y_test) from scikit-learn's 8x8 digits, scaled to [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("the demo needs scikit-learn for its data: pip install 'cgvm[data]'") from None
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def train_digits(epochs: int = 30, batch: int = 64, lr: float = 0.1, seed: int = 0, out=None) -> float:
    out = sys.stdout if out is None else out
    xtr, ytr, xte, yte = load_digits_split(seed)
    rng = np.random.default_rng(seed)
    sizes = [64, 128, 10]
    ws = Workspace()
    x = input_value(TensorType((None, 64)), "x")
    y = input_value(TensorType((None,), "int64"), "y")
    params, h = [], x
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        ws[f"fc{i}/w"] = (rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32)
        ws[f"fc{i}/b"] = np.zeros(b, np.float32)
        w, bias = param_value(f"fc{i}/w", TensorType((a, b))), param_value(f"fc{i}/b", TensorType((b,)))
        params += [w, bias]
        h = E.add(L.matmul(h, w), bias)
        if i < len(sizes) - 2:
            h = E.relu(h)
    loss = LS.softmax_cross_entropy(h, y)
    grads = grad(loss, params)
    step = compile([x, y], loss, workspace=ws, updates={p: E.sub(p, E.mul(g, lr)) for p, g in zip(params, grads)},
                   name="train_step")
    predict = compile([x], R.argmax(h, axis=1), workspace=ws, name="predict")
    t0 = time.perf_counter()
    for epoch in range(epochs):
        order = rng.permutation(len(xtr))
        losses = [float(step(xtr[order[i:i + batch]], ytr[order[i:i + batch]])) for i in range(0, len(order), batch)]
        if epoch % 5 == 4 or epoch == epochs - 1:
            acc = float(np.mean(predict(xte) == yte))
            print(f"epoch {epoch + 1:3d}  loss {np.mean(losses):.4f}  test accuracy {acc:.4f}", file=out)
    acc = float(np.mean(predict(xte) == yte))
    print(f"digits MLP 64-128-10: test accuracy {acc:.4f} on {len(xte)} images "
          f"({time.perf_counter() - t0:.1f} s)", file=out)
    return acc
