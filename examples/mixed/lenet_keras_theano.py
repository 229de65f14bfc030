"""Three frontends, one graph: a Caffe LeNet trunk, a Keras head and a Theano-style loss.

    python examples/mixed/lenet_keras_theano.py [--epochs 5] [--batch 64]

* Caffe: models/lenet/lenet_deploy.prototxt up to blob ``ip1`` (conv1, pool1, conv2, pool2, ip1
  and the in-place relu1), applied to a Theano-style input by ``caffe.symbolic_net``;
* Keras: a ``Dense(10)`` layer called on the trunk's ``ip1`` Value;
* Theano-style: softmax cross-entropy with a learned logit scale (a shared variable), one
  ``theano.grad`` over the parameters of all three, momentum SGD as ``updates`` of one
  ``theano.function`` (Caffe's lr_mult is honoured).

All parameters live in one Workspace: the Caffe blobs as ``conv1/0`` ..., the Keras weights as
``keras/head/kernel`` ..., the logit scale and the momentum buffers as Theano shared variables
(``theano.log_scale``, ``theano.conv1/0@velocity`` ...). Trained on
scikit-learn's digits upscaled to 28x28 (1347 train, 450 test images).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Callable, Dict, Tuple

import numpy as np

import cgvm
import cgvm.caffe as caffe
import cgvm.keras as keras
import cgvm.theano as theano
import cgvm.theano.tensor as T
from cgvm.frontends.caffe.digits import load_digit_images, split

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROTOTXT = os.path.join(REPO, "models", "lenet", "lenet_deploy.prototxt")
IMAGE_SHAPE = (1, 28, 28)


def load_data(seed: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): N x 1 x 28 x 28 float32 in [0, 1], int64 labels."""
    images, labels = load_digit_images()
    x_train, y_train, x_test, y_test = split(images, labels, seed)
    scale = np.float32(1.0 / 255.0)
    return x_train.astype(np.float32) * scale, y_train, x_test.astype(np.float32) * scale, y_test


def logits_of(images: "theano.TensorVariable", head: "keras.layers.Layer", workspace: cgvm.Workspace,
              seed: int) -> Tuple["theano.TensorVariable", "caffe.SymbolicNet"]:
    """Caffe trunk up to ip1 on ``images``, then the Keras head: the class scores as a Theano variable."""
    trunk = caffe.symbolic_net(PROTOTXT, inputs={"data": images}, outputs=["ip1"], workspace=workspace, seed=seed)
    scores = head(trunk["ip1"])                  # a KerasTensor over a cgvm Value
    return T.as_tensor_variable(scores), trunk   # back to the Theano-style side


def build(batch: int, test_size: int, lr: float, momentum: float, seed: int,
          workspace: cgvm.Workspace) -> Dict[str, Callable]:
    """The compiled training step (x, y) -> loss and the test-set classifier x -> labels."""
    x = T.TensorType("float32", shape=(batch,) + IMAGE_SHAPE)("x")
    y = T.lvector("y")
    keras.utils.set_random_seed(seed)
    previous = keras.backend.get_workspace()
    keras.backend.set_workspace(workspace)       # the head's weights go where the trunk's are
    try:
        head = keras.layers.Dense(10, name="head")
        scores, trunk = logits_of(x, head, workspace, seed)
    finally:
        keras.backend.set_workspace(previous)
    # the loss has a parameter of its own: a learned logit scale (temperature), a Theano shared variable
    log_scale = theano.shared(np.float32(0.0), name="log_scale", workspace=workspace)
    cost = T.mean(T.nnet.categorical_crossentropy(T.nnet.softmax(scores * T.exp(log_scale)), y))

    # every parameter, whichever frontend made it, as a Theano shared variable over its Workspace entry
    params = [theano.shared_from_workspace(v, workspace) for v in trunk.params.values()]
    params += [theano.shared_from_workspace(w) for w in head.trainable_weights]
    params += [log_scale]
    rates = [lr * trunk.param_infos[name].lr_mult for name in trunk.params]
    rates += [lr] * (len(head.trainable_weights) + 1)
    grads = theano.grad(cost, params)
    updates = []
    for p, g, rate in zip(params, grads, rates):
        velocity = theano.shared(np.zeros(p.get_value(borrow=True).shape, np.float32), name=f"{p.key}@velocity",
                                 workspace=workspace)
        step = np.float32(momentum) * velocity - np.float32(rate) * g  # float32 rates keep the float32 type
        updates += [(velocity, step), (p, p + step)]
    train_step = theano.function([x, y], cost, updates=updates, workspace=workspace, name="train_step")

    # the test set in one batch: a second trunk over the same Workspace shares the Caffe blobs, and
    # calling the same Keras layer again reuses its weights
    x_test = T.TensorType("float32", shape=(test_size,) + IMAGE_SHAPE)("x_test")
    test_scores, _ = logits_of(x_test, head, workspace, seed)
    # the logit scale is positive, so the unscaled scores have the same argmax
    classify = theano.function([x_test], T.argmax(test_scores, axis=1), workspace=workspace, name="classify")
    return {"train_step": train_step, "classify": classify}


def train(epochs: int = 5, batch: int = 64, lr: float = 0.02, momentum: float = 0.9, seed: int = 0,
          log: Callable[[str], None] = print) -> Dict[str, object]:
    """Train on the digits; returns the final test ``accuracy``, per-epoch mean ``losses``, the
    ``seconds`` taken (data loading and compilation included) and the ``workspace``."""
    started = time.perf_counter()
    x_train, y_train, x_test, y_test = load_data(seed)
    workspace = cgvm.Workspace()
    fns = build(batch, len(x_test), lr, momentum, seed, workspace)
    rng = np.random.default_rng(seed)
    losses, accuracy = [], 0.0
    for epoch in range(epochs):
        order = rng.permutation(len(x_train))
        steps = [fns["train_step"](x_train[idx], y_train[idx])
                 for idx in (order[i:i + batch] for i in range(0, len(order) - batch + 1, batch))]
        losses.append(float(np.mean(steps)))
        accuracy = float(np.mean(fns["classify"](x_test) == y_test))
        log(f"epoch {epoch + 1}: loss {losses[-1]:.4f}  test accuracy {accuracy:.4f}")
    return {"accuracy": accuracy, "losses": losses, "seconds": time.perf_counter() - started,
            "workspace": workspace}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = train(args.epochs, args.batch, args.lr, args.momentum, args.seed)
    print(f"test accuracy {result['accuracy']:.4f} after {args.epochs} epochs ({result['seconds']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
