"""Keras-style training rows: an MLP and a small CNN, one SGD step each (train_on_batch),
cgvm.keras beside PyTorch eager and real Keras 3 on its torch backend (where installed)."""
from __future__ import annotations

import os
from typing import Callable, List, Optional

import numpy as np

from .core import _torch
from .harness import Row


def _build(keras, kind: str):
    L = keras.layers
    if kind == "mlp":
        return keras.Sequential([keras.Input((784,)), L.Dense(512, activation="relu"),
                                 L.Dense(512, activation="relu"), L.Dense(10)])
    return keras.Sequential([keras.Input((28, 28, 1)), L.Conv2D(16, 3, activation="relu"), L.MaxPooling2D(2),
                             L.Conv2D(32, 3, activation="relu"), L.MaxPooling2D(2), L.Flatten(), L.Dense(10)])


def _real_keras():
    os.environ.setdefault("KERAS_BACKEND", "torch")
    try:
        import keras
    except ImportError:
        return None
    return keras if keras.backend.backend() == "torch" else None


def _step(keras, kind: str, x, y) -> Callable[[], object]:
    model = _build(keras, kind)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return lambda: model.train_on_batch(x, y)


def _torch_step(kind: str, x, y) -> Optional[Callable[[], object]]:
    torch = _torch()
    if torch is None:
        return None
    nn = torch.nn
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        tx = torch.from_numpy(x)
    else:
        model = nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3), nn.ReLU(),
                              nn.MaxPool2d(2), nn.Flatten(), nn.Linear(800, 10))
        tx = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))
    ty = torch.from_numpy(y)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(tx), ty)
        loss.backward()
        opt.step()
        return loss
    return step


def rows(quick: bool = False) -> List[Row]:
    import cgvm.keras as ckeras

    rng = np.random.default_rng(0)
    out = []
    for kind, shape in (("mlp", (128, 784)), ("cnn", (64, 28, 28, 1))):
        x = rng.standard_normal(shape).astype(np.float32)
        y = rng.integers(0, 10, shape[0]).astype(np.int64)
        label = "MLP 784-512-512-10, batch 128" if kind == "mlp" else "CNN conv16-pool-conv32-pool-dense, batch 64"
        row = Row(f"Keras-style {label}: train_on_batch (SGD momentum)", number=5 if quick else 10, rounds=7)
        row.add("cgvm", _step(ckeras, kind, x, y))
        row.add("torch", _torch_step(kind, x, y))
        keras = _real_keras()
        if keras is not None:
            row.add("keras", _step(keras, kind, x, y))
        out.append(row)
    return out
