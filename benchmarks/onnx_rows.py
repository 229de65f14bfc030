"""Imported ONNX models: ResNet-18-shaped and AlexNet-shaped nets built in PyTorch, exported with
torch.onnx.export, then run by cgvm (cgvm.onnx.load, compiled for the batch), by ONNX Runtime on
the same file (CPU provider, the same thread count) and by PyTorch eager (no_grad), batch 1 and 16."""
from __future__ import annotations

from typing import List

import numpy as np

from .core import _torch
from .harness import Row


def _ort():
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime


def _row(name: str, make, shape, batch: int, number: int, rounds: int) -> List[Row]:
    torch = _torch()
    if torch is None:
        return []
    try:
        import cgvm.onnx
    except ImportError:
        return []
    from cgvm.backend.threads import num_threads
    from cgvm.ir import TensorType

    from .torch_onnx_nets import export_bytes, randomize_batchnorm

    torch.manual_seed(0)
    net = randomize_batchnorm(make()).eval()
    x = np.random.default_rng(0).standard_normal((batch,) + shape).astype(np.float32)
    data = export_bytes(net, torch.from_numpy(x))
    model = cgvm.onnx.load(data, workspace=cgvm.Workspace())
    f = model.compile([TensorType(x.shape, "float32")])
    tx = torch.from_numpy(x)

    def torch_forward():
        with torch.no_grad():
            return net(tx)

    want = torch_forward().numpy()
    np.testing.assert_allclose(f(x)[0], want, rtol=1e-4, atol=1e-4)
    row = Row(f"ONNX-imported {name} forward, batch {batch}", number=number, rounds=rounds)
    row.add("cgvm", lambda: f(x))
    ort = _ort()
    if ort is not None:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = num_threads() or 1
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        feed = {"x": x}
        np.testing.assert_allclose(sess.run(None, feed)[0], want, rtol=1e-4, atol=1e-4)
        row.add("onnxruntime", lambda: sess.run(None, feed))
    row.add("torch", torch_forward)
    return [row]


def rows(quick: bool = False) -> List[Row]:
    from .torch_onnx_nets import AlexNet, ResNet18

    out: List[Row] = []
    for batch, number in ((1, 2 if quick else 5), (16, 1)):
        rounds = 3 if quick else 5
        out += _row("ResNet-18-shaped", lambda: ResNet18(64, 1000), (3, 224, 224), batch, number, rounds)
        out += _row("AlexNet-shaped", lambda: AlexNet(1.0, 1000), (3, 224, 224), batch, number, rounds)
    return out
