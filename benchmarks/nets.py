"""Reference networks built directly with cgvm ops, for the memory and speed rows.

Each builder returns a ``Net``: its symbolic inputs (images ``x``, int64 labels ``y``), logits,
parameters and a Workspace holding He-initialized weights (badly scaled weights drift into
float32 subnormals and make every timing meaningless). ``inference(net)`` and
``train_step(net)`` compile them; ``batch(net)`` draws matching input arrays.

* ``resnet18``: ResNet-18 shaped (He et al. 2016): 7x7/2 stem, 3x3/2 max pool, four stages of
  two basic blocks (64-128-256-512 channels, 1x1/2 projection shortcuts), global average pool,
  fully connected. Batch normalization uses batch statistics when training.
* ``resnet50``: ResNet-50 (bottleneck blocks, torchvision's layout), for the GPU rows.
* ``alexnet``: AlexNet shaped as BVLC's Caffe model (grouped conv2/4/5, LRN, dropout in training).
* ``dense_chain``: ``n`` blocks of tanh(x W + b), the deep chain of the recomputation rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import cgvm
from cgvm.ir import TensorType, Value, input_value, param_value
from cgvm.ops import conv as C
from cgvm.ops import elementwise as E
from cgvm.ops import elementwise_math as EM
from cgvm.ops import linalg as L
from cgvm.ops import loss as LS
from cgvm.ops import nn as NN
from cgvm.ops import pool as P
from cgvm.ops import shape as S


@dataclass
class Net:
    """A network's symbolic pieces and the workspace holding its weights."""

    name: str
    x: Value
    y: Value
    logits: Value
    params: List[Value]
    workspace: cgvm.Workspace
    classes: int
    seeds: List[str] = field(default_factory=list)     # int64 dropout seeds (not learned)


class _Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.ws = cgvm.Workspace()
        self.params: List[Value] = []
        self.seeds: List[str] = []

    def param(self, name: str, array: np.ndarray, learned: bool = True) -> Value:
        self.ws[name] = array
        v = param_value(name, TensorType(array.shape, array.dtype))
        if learned:
            self.params.append(v)
        return v

    def he(self, name: str, shape: Tuple[int, ...], fan_in: int) -> Value:
        return self.param(name, (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32))

    def conv(self, name: str, x: Value, cin: int, cout: int, k: int, stride: int = 1, pad: int = 0,
             groups: int = 1, bias: bool = True) -> Value:
        w = self.he(f"{name}/w", (cout, cin // groups, k, k), cin // groups * k * k)
        args = [x, w] + ([self.param(f"{name}/b", np.zeros(cout, np.float32))] if bias else [])
        return C.conv(*args, stride=stride, pad=pad, groups=groups, name=name)

    def bn(self, name: str, x: Value, channels: int, train: bool) -> Value:
        scale = self.param(f"{name}/scale", np.ones(channels, np.float32))
        shift = self.param(f"{name}/bias", np.zeros(channels, np.float32))
        mean = self.param(f"{name}/mean", np.zeros(channels, np.float32), learned=False)
        var = self.param(f"{name}/var", np.ones(channels, np.float32), learned=False)
        out = NN.batch_norm(x, mean, var, scale, shift, training=train, name=name)
        return out[0] if train else out

    def fc(self, name: str, x: Value, cin: int, cout: int) -> Value:
        w = self.he(f"{name}/w", (cin, cout), cin)
        return E.add(L.matmul(x, w), self.param(f"{name}/b", np.zeros(cout, np.float32)), name=name)

    def dropout(self, name: str, x: Value) -> Value:
        self.ws[f"{name}/seed"] = np.array(int(self.rng.integers(1 << 62)), dtype=np.int64)
        self.seeds.append(f"{name}/seed")
        seed = param_value(f"{name}/seed", TensorType((), "int64"))
        return NN.dropout(x, seed, ratio=0.5, name=name)


def resnet18(batch: Optional[int] = 16, image: int = 224, classes: int = 1000, *, train: bool = False,
             seed: int = 0) -> Net:
    b = _Builder(seed)
    x = input_value(TensorType((batch, 3, image, image)), "x")
    y = input_value(TensorType((batch,), "int64"), "y")
    h = EM.relu(b.bn("bn1", b.conv("conv1", x, 3, 64, 7, 2, 3, bias=False), 64, train))
    h = P.max_pool(h, kernel=(3,), stride=(2,), pad=(1,))
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"layer{stage + 1}.{block}"
            r = EM.relu(b.bn(f"{name}.bn1", b.conv(f"{name}.conv1", h, cin, cout, 3, stride, 1, bias=False),
                             cout, train))
            r = b.bn(f"{name}.bn2", b.conv(f"{name}.conv2", r, cout, cout, 3, 1, 1, bias=False), cout, train)
            if stride != 1 or cin != cout:
                h = b.bn(f"{name}.down.bn", b.conv(f"{name}.down", h, cin, cout, 1, stride, 0, bias=False),
                         cout, train)
            h = EM.relu(E.add(r, h))
            cin = cout
    h = S.reshape(P.global_avg_pool(h), shape=(-1, 512))
    logits = b.fc("fc", h, 512, classes)
    return Net("ResNet-18", x, y, logits, b.params, b.ws, classes, b.seeds)


def resnet50(batch: Optional[int] = 16, image: int = 224, classes: int = 1000, *, train: bool = False,
             seed: int = 0) -> Net:
    """ResNet-50 (torchvision's v1.5: the stride on each stage's first 3x3): bottleneck blocks
    1x1-3x3-1x1 with 4x expansion, stages of 3, 4, 6, 3 blocks (64-128-256-512 wide)."""
    b = _Builder(seed)
    x = input_value(TensorType((batch, 3, image, image)), "x")
    y = input_value(TensorType((batch,), "int64"), "y")
    h = EM.relu(b.bn("bn1", b.conv("conv1", x, 3, 64, 7, 2, 3, bias=False), 64, train))
    h = P.max_pool(h, kernel=(3,), stride=(2,), pad=(1,))
    cin = 64
    for stage, (width, blocks) in enumerate(zip((64, 128, 256, 512), RESNET50_BLOCKS)):
        cout = 4 * width
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            name = f"layer{stage + 1}.{block}"
            r = EM.relu(b.bn(f"{name}.bn1", b.conv(f"{name}.conv1", h, cin, width, 1, bias=False), width, train))
            r = EM.relu(b.bn(f"{name}.bn2", b.conv(f"{name}.conv2", r, width, width, 3, stride, 1, bias=False),
                             width, train))
            r = b.bn(f"{name}.bn3", b.conv(f"{name}.conv3", r, width, cout, 1, bias=False), cout, train)
            if stride != 1 or cin != cout:
                h = b.bn(f"{name}.down.bn", b.conv(f"{name}.down", h, cin, cout, 1, stride, 0, bias=False),
                         cout, train)
            h = EM.relu(E.add(r, h))
            cin = cout
    h = S.reshape(P.global_avg_pool(h), shape=(-1, 2048))
    logits = b.fc("fc", h, 2048, classes)
    return Net("ResNet-50", x, y, logits, b.params, b.ws, classes, b.seeds)


#: blocks per stage of ResNet-50
RESNET50_BLOCKS = (3, 4, 6, 3)


def alexnet(batch: Optional[int] = 16, classes: int = 1000, *, train: bool = False, seed: int = 0) -> Net:
    b = _Builder(seed)
    x = input_value(TensorType((batch, 3, 227, 227)), "x")
    y = input_value(TensorType((batch,), "int64"), "y")

    def lrn(v: Value) -> Value:
        return NN.lrn(v, local_size=5, alpha=1e-4, beta=0.75)

    def pool(v: Value) -> Value:
        return P.max_pool(v, kernel=(3,), stride=(2,))

    h = pool(lrn(EM.relu(b.conv("conv1", x, 3, 96, 11, 4))))
    h = pool(lrn(EM.relu(b.conv("conv2", h, 96, 256, 5, 1, 2, groups=2))))
    h = EM.relu(b.conv("conv3", h, 256, 384, 3, 1, 1))
    h = EM.relu(b.conv("conv4", h, 384, 384, 3, 1, 1, groups=2))
    h = pool(EM.relu(b.conv("conv5", h, 384, 256, 3, 1, 1, groups=2)))
    h = S.reshape(h, shape=(-1, 256 * 6 * 6))
    for name, cin in (("fc6", 256 * 6 * 6), ("fc7", 4096)):
        h = EM.relu(b.fc(name, h, cin, 4096))
        if train:
            h = b.dropout(f"drop{name[2:]}", h)
    logits = b.fc("fc8", h, 4096, classes)
    return Net("AlexNet", x, y, logits, b.params, b.ws, classes, b.seeds)


def dense_chain(blocks: int = 100, batch: int = 512, width: int = 128, classes: int = 10, *,
                seed: int = 0) -> Net:
    """``blocks`` x tanh(x W + b) and a linear classifier; tanh's gradient reads its output only."""
    b = _Builder(seed)
    x = input_value(TensorType((batch, width)), "x")
    y = input_value(TensorType((batch,), "int64"), "y")
    h = x
    for i in range(blocks):
        w = b.param(f"W{i}", (b.rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32))
        h = EM.tanh(E.add(L.matmul(h, w), b.param(f"b{i}", np.zeros(width, np.float32))))
    logits = b.fc("out", h, width, classes)
    return Net(f"{blocks}-block dense+tanh chain", x, y, logits, b.params, b.ws, classes, b.seeds)


def loss_of(net: Net) -> Value:
    return LS.softmax_cross_entropy(net.logits, net.y)


def inference(net: Net, **compile_options: Any) -> cgvm.Function:
    """``f(x) -> logits`` over the net's workspace."""
    return cgvm.compile([net.x], net.logits, workspace=net.workspace, **compile_options)


def train_step(net: Net, lr: float = 0.01, **compile_options: Any) -> cgvm.Function:
    """``f(x, y) -> loss``: one SGD step, weights updated in the net's workspace."""
    loss = loss_of(net)
    grads = cgvm.grad(loss, net.params)
    updates: Dict[Value, Value] = {p: E.sub(p, E.mul(g, lr)) for p, g in zip(net.params, grads)}
    return cgvm.compile([net.x, net.y], loss, updates=updates, workspace=net.workspace, **compile_options)


def batch(net: Net, seed: int = 1) -> Tuple[np.ndarray, np.ndarray]:
    """Random images (standard normal) and labels shaped for ``net`` (a concrete batch size)."""
    rng = np.random.default_rng(seed)
    shape = tuple(net.x.shape)
    labels = rng.integers(0, net.classes, shape[0]).astype(np.int64)
    return rng.standard_normal(shape).astype(np.float32), labels


def weight_bytes(net: Net) -> int:
    return int(sum(net.workspace[p.name].nbytes for p in net.params))


__all__ = ["Net", "resnet18", "resnet50", "alexnet", "dense_chain", "inference", "train_step", "batch", "loss_of",
           "weight_bytes"]
