"""Caffe net rows: forward of LeNet / AlexNet / GoogLeNet deploy nets and a LeNet training iteration,
cgvm beside PyTorch eager running the same layers with the same weights (benchmarks/torch_caffe.py)."""
from __future__ import annotations

import os
import tempfile
from typing import List, Optional

import numpy as np

from .core import _torch
from .harness import Row

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(HERE, "..", "shared", "models", "caffe")


def _net(path: str, batch: int):
    import cgvm.caffe as caffe

    net = caffe.Net(path, caffe.TEST, seed=0)
    rng = np.random.default_rng(0)
    for params in net.params.values():
        for blob in params:
            fan_in = max(int(np.prod(blob.data.shape[1:])), 1)
            blob.data[...] = rng.normal(0, 1.0 / np.sqrt(fan_in), blob.data.shape)
    name = net.inputs[0]
    net.blobs[name].reshape(*((batch,) + tuple(net.blobs[name].shape[1:])))
    data = rng.normal(0, 1, net.blobs[name].shape).astype(np.float32)
    net.blobs[name].data[...] = data
    return net, data


def forward_row(label: str, path: str, batch: int, number: int) -> Optional[Row]:
    if not os.path.isfile(path):
        return None
    row = Row(f"{label} forward, batch {batch}", number=number, rounds=5)
    net, data = _net(path, batch)
    row.add("cgvm", net.forward)
    torch = _torch()
    if torch is not None:
        from .torch_caffe import torch_forward

        def torch_fwd():
            with torch.no_grad():
                return torch_forward(net, data)
        row.add("torch", torch_fwd)
    return row


LENET_TRAIN = """
name: "LeNetBench"
layer { name: "data" type: "Input" top: "data" top: "label"
  input_param { shape { dim: 64 dim: 1 dim: 28 dim: 28 } shape { dim: 64 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 20 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  convolution_param { num_output: 50 kernel_size: 5 weight_filler { type: "xavier" } } }
layer { name: "pool2" type: "Pooling" bottom: "conv2" top: "pool2" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool2" top: "ip1" inner_product_param { num_output: 500 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2" inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def lenet_train_row() -> Row:
    import cgvm.caffe as caffe

    row = Row("LeNet training iteration (SGD momentum, batch 64)", number=5, rounds=7)
    tmp = tempfile.mkdtemp(prefix="cgvm-bench-")
    net_path = os.path.join(tmp, "lenet_bench.prototxt")
    with open(net_path, "w") as f:
        f.write(LENET_TRAIN)
    solver_path = os.path.join(tmp, "solver.prototxt")
    with open(solver_path, "w") as f:
        f.write(f'net: "{net_path}"\nbase_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\nlr_policy: "fixed"\n'
                f'max_iter: 100000\ndisplay: 0\nsnapshot: 0\nsnapshot_prefix: "{tmp}/s"\nrandom_seed: 1\n')
    solver = caffe.get_solver(solver_path, log=False)
    # one fixed batch on both sides (as PyTorch's x, y below): the row times the training step, not data
    # generation (a DummyData layer would draw 50k normal numbers on every step, ~1 ms)
    rng = np.random.default_rng(0)
    solver.net.blobs["data"].data[...] = rng.standard_normal((64, 1, 28, 28)).astype(np.float32)
    solver.net.blobs["label"].data[...] = rng.integers(0, 10, 64).astype(np.float32)
    row.add("cgvm", lambda: solver.step(1))
    torch = _torch()
    if torch is not None:
        nn = torch.nn
        model = nn.Sequential(nn.Conv2d(1, 20, 5), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5), nn.MaxPool2d(2, 2),
                              nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=0.0005)
        x = torch.randn(64, 1, 28, 28)
        y = torch.randint(0, 10, (64,))  # random labels on both sides: a constant label trains to denormal gradients

        def torch_step():
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss
        row.add("torch", torch_step)
    return row


def rows(quick: bool = False) -> List[Row]:
    out: List[Optional[Row]] = [
        forward_row("LeNet", os.path.join(HERE, "models", "lenet", "lenet_deploy.prototxt"), 1, 200),
        forward_row("LeNet", os.path.join(HERE, "models", "lenet", "lenet_deploy.prototxt"), 16, 50),
        lenet_train_row(),
        forward_row("AlexNet", os.path.join(SHARED, "bvlc_alexnet", "deploy.prototxt"), 1, 3 if quick else 10),
        forward_row("AlexNet", os.path.join(SHARED, "bvlc_alexnet", "deploy.prototxt"), 16, 1 if quick else 2),
    ]
    if not quick:
        out.append(forward_row("GoogLeNet", os.path.join(SHARED, "bvlc_googlenet", "deploy.prototxt"), 1, 5))
        out.append(forward_row("GoogLeNet", os.path.join(SHARED, "bvlc_googlenet", "deploy.prototxt"), 16, 1))
    return [r for r in out if r is not None]
