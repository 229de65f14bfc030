"""ResNet-18-shaped inference at batch 1 and 16: cgvm (benchmarks/nets.py) beside the same net, same weights,
written with torch.nn.functional."""
from __future__ import annotations

from typing import List

import numpy as np

from . import nets
from .core import _torch
from .harness import Row


def _torch_resnet18(net: nets.Net):
    torch = _torch()
    F = torch.nn.functional
    W = {k: torch.from_numpy(np.asarray(v)) for k, v in net.workspace.items()}

    def bn(name, h):
        return F.batch_norm(h, W[f"{name}/mean"], W[f"{name}/var"], W[f"{name}/scale"], W[f"{name}/bias"],
                            training=False, eps=1e-5)

    def forward(x):
        with torch.no_grad():
            h = F.relu(bn("bn1", F.conv2d(x, W["conv1/w"], stride=2, padding=3)))
            h = F.max_pool2d(h, 3, 2, 1)
            cin = 64
            for stage, cout in enumerate((64, 128, 256, 512)):
                for block in range(2):
                    stride = 2 if stage > 0 and block == 0 else 1
                    name = f"layer{stage + 1}.{block}"
                    r = F.relu(bn(f"{name}.bn1", F.conv2d(h, W[f"{name}.conv1/w"], stride=stride, padding=1)))
                    r = bn(f"{name}.bn2", F.conv2d(r, W[f"{name}.conv2/w"], padding=1))
                    if stride != 1 or cin != cout:
                        h = bn(f"{name}.down.bn", F.conv2d(h, W[f"{name}.down/w"], stride=stride))
                    h = F.relu(r + h)
                    cin = cout
            h = F.adaptive_avg_pool2d(h, 1).reshape(-1, 512)
            return h @ W["fc/w"] + W["fc/b"]
    return forward


def _row(batch: int, number: int) -> Row:
    net = nets.resnet18(batch=batch)
    f = nets.inference(net)
    x, _ = nets.batch(net)
    row = Row(f"ResNet-18-shaped forward, batch {batch}", number=number, rounds=5)
    row.add("cgvm", lambda: f(x))
    if _torch() is not None:
        torch_forward = _torch_resnet18(net)
        tx = _torch().from_numpy(x)
        np.testing.assert_allclose(f(x), torch_forward(tx).numpy(), rtol=2e-3, atol=2e-3)
        row.add("torch", lambda: torch_forward(tx))
    return row


def rows(quick: bool = False) -> List[Row]:
    return [_row(1, 2 if quick else 5), _row(16, 1 if quick else 2)]
