"""Small PyTorch nets the ONNX tests export with torch.onnx.export: a ResNet-18-shaped CNN
(BasicBlocks 2-2-2-2, BatchNorm, a strided 1x1 shortcut, global pooling, a Linear head), an
AlexNet-shaped CNN, and a 2-layer bidirectional LSTM classifier."""
from __future__ import annotations

import io
import warnings

import torch
import torch.nn as nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.shortcut is None else self.shortcut(x)))


class ResNet18(nn.Module):
    """ResNet-18's layout (7x7 stem, max pool, four stages of two BasicBlocks) at width ``width``."""

    def __init__(self, width: int = 64, classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], width
        for i, c in enumerate([width, 2 * width, 4 * width, 8 * width]):
            blocks += [BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)]
            cin = c
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


class AlexNet(nn.Module):
    """AlexNet's layout (torchvision's single-tower variant) at ``width`` times its channel counts."""

    def __init__(self, width: float = 1.0, classes: int = 1000):
        super().__init__()
        c = [max(int(k * width), 8) for k in (64, 192, 384, 256, 256)]
        self.features = nn.Sequential(
            nn.Conv2d(3, c[0], 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(c[0], c[1], 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(c[1], c[2], 3, padding=1), nn.ReLU(),
            nn.Conv2d(c[2], c[3], 3, padding=1), nn.ReLU(),
            nn.Conv2d(c[3], c[4], 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2))
        hidden = max(int(4096 * width), 16)
        self.classifier = nn.Sequential(nn.Linear(c[4] * 36, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                        nn.Linear(hidden, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


class LSTMNet(nn.Module):
    """Two stacked bidirectional LSTM layers over (batch, time, features), a Linear head on the last step."""

    def __init__(self, features: int = 8, hidden: int = 16, classes: int = 4):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, classes)

    def forward(self, x):
        y, _ = self.lstm(x)
        return self.fc(y[:, -1])


def randomize_batchnorm(model: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial running statistics and affine parameters, so BatchNorm's import is really tested."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model


def export_bytes(model: nn.Module, example: torch.Tensor, dynamic_batch: bool = False, **kwargs) -> bytes:
    """``torch.onnx.export`` with the TorchScript exporter (dynamo=False: no onnxscript needed)."""
    f = io.BytesIO()
    axes = {"x": {0: "batch"}, "y": {0: "batch"}} if dynamic_batch else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (example,), f, dynamo=False, input_names=["x"], output_names=["y"],
                          dynamic_axes=axes, **kwargs)
    return f.getvalue()
