"""``python -m benchmarks.gpu [--out table.md] [--json rows.json] [--budget S] [--only TEXT]``: cgvm on CuPy
against PyTorch CUDA eager on the same GPU, in one run.

Rows (the nets of benchmarks/nets.py, the MLP of benchmarks/core.py, the RNN of benchmarks/rnn.py):
an elementwise chain (fusion: one kernel against torch's one per op), the MLP SGD step, LeNet
training, the RNN scan forward and forward+grad, AlexNet forward batch 128, ResNet-50 forward batch
64 and training step batch 32; then the device memory peak of inference against weights + the two
largest live activations. Targets (cgvm time / torch time): forward <= 1.2, training <= 1.5, the
elementwise chain < 1. Every timing synchronizes the device before and after (cupy and torch), and
the two implementations alternate in rounds; the table gives medians. Each cgvm row also counts
device-to-host copies inside one step (there should be none) and checks cgvm's output against
torch's. Rows stop being started once ``--budget`` seconds have passed. Without a GPU (CuPy and
a CUDA device) it exits with status 2 and says what is missing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

#: ratio targets by kind of row
TARGETS = {"forward": 1.2, "training": 1.5, "fusion": 1.0}
MIB = 2 ** 20


class NoGPU(RuntimeError):
    """The benchmarks need CuPy with a CUDA device."""


def require_gpu() -> Any:
    """CuPy, with cgvm's cupy backend working; NoGPU saying what is missing otherwise."""
    from cgvm.backend import get_backend
    from cgvm.errors import BackendUnavailable

    try:
        get_backend("cupy")
    except BackendUnavailable as exc:
        raise NoGPU(f"python -m benchmarks.gpu needs an NVIDIA GPU with CuPy: {exc}") from None
    import cupy

    return cupy


def gpu_workspaces_by_default() -> None:
    """New Workspaces (the benchmark nets', the reused builders') go on the GPU."""
    os.environ["CGVM_BACKEND"] = "cupy"


def torch_cuda() -> Optional[Any]:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


@dataclass
class GpuRow:
    name: str
    kind: str                                   # forward | training | fusion
    impls: Dict[str, Callable[[], Any]] = field(default_factory=dict)
    number: int = 10
    rounds: int = 5
    results: Dict[str, float] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    first_call_s: Dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> Optional[float]:
        if "cgvm" in self.results and "torch" in self.results:
            return self.results["cgvm"] / self.results["torch"]
        return None

    @property
    def verdict(self) -> str:
        r = self.ratio
        if r is None:
            return "-"
        target = TARGETS[self.kind]
        return "ok" if (r < target if self.kind == "fusion" else r <= target) else "MISSED"


def measure(row: GpuRow, sync: Callable[[], None]) -> GpuRow:
    for name, fn in row.impls.items():
        sync()
        t0 = time.perf_counter()
        fn()                                    # first call: compilation, memory plan, cuDNN tuning
        sync()
        row.first_call_s[name] = time.perf_counter() - t0
        fn()
    sync()
    samples: Dict[str, List[float]] = {k: [] for k in row.impls}
    for _ in range(row.rounds):
        for name, fn in row.impls.items():
            sync()
            t0 = time.perf_counter()
            for _ in range(row.number):
                fn()
            sync()
            samples[name].append((time.perf_counter() - t0) / row.number)
    row.results = {k: statistics.median(v) for k, v in samples.items()}
    return row


def _agree(row: GpuRow, got: Any, want: Any, tol: float) -> None:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    err = float(np.max(np.abs(got - want))) / scale if want.size else 0.0
    row.notes.append(f"outputs agree (max err {err:.1e} of scale)" if err <= tol else
                     f"OUTPUTS DIFFER: max err {err:.1e} of scale > {tol:.0e}")


def _count_copies(row: GpuRow, step: Callable[[], Any]) -> None:
    from cgvm.backend import transfer

    with transfer.counting() as c:
        step()
    note = f"{c.device_to_host} device-to-host copies in a step"
    try:
        with transfer.counting(strict=True):     # CuPy's own synchronizations (.item(), bool()) raise here
            step()
    except Exception as exc:
        if type(exc).__name__ != "DeviceSynchronized":
            raise
        note += ", but the step synchronizes the device (a host read outside the backend)"
    row.notes.append(note)


# ------------------------------------------------------------------------------------- rows

def chain_row(cp: Any, torch: Optional[Any], n: int = 20, size: int = 1 << 22) -> GpuRow:
    from .core import _cgvm_chain, _chain_ops

    row = GpuRow(f"{n}-op elementwise chain, {size} float32", "fusion", number=50)
    f = _cgvm_chain(n, size)
    host = np.linspace(-1, 1, size).astype(np.float32)
    a = cp.asarray(host)
    row.impls["cgvm"] = lambda: f(a)
    _count_copies(row, lambda: f(a))
    if torch is not None:
        t = torch.from_dlpack(a).clone()
        ops = _chain_ops(n)

        def eager():
            y = t
            for op, c in ops:
                y = torch.tanh(y) if op == "tanh" else {"add": y + c, "mul": y * c, "sub": y - c}[op]
            return y
        row.impls["torch"] = eager
        _agree(row, cp.asnumpy(f(a)), eager().cpu().numpy(), 1e-5)
    return row


def _train_row(cp: Any, torch: Optional[Any], name: str, net: Any, logits_of_torch: Callable, lr: float,
               number: int) -> GpuRow:
    from . import gpu_torch, nets

    row = GpuRow(name, "training", number=number)
    x_host, y_host = nets.batch(net)
    x, y = cp.asarray(x_host), cp.asarray(y_host)
    tw = gpu_torch.weights(torch, net, grad=True) if torch is not None else None   # before cgvm's updates
    step = nets.train_step(net, lr=lr)
    row.impls["cgvm"] = lambda: step(x, y)
    if torch is not None:
        params = [tw[p.name] for p in net.params]
        tstep = gpu_torch.sgd_step(torch, logits_of_torch(tw), params, lr)
        tx, ty = torch.from_dlpack(x).clone(), torch.from_dlpack(y).clone()
        _agree(row, float(step(x, y)), float(tstep(tx, ty).detach()), 1e-3)    # the first steps' losses
        row.impls["torch"] = lambda: tstep(tx, ty)
    _count_copies(row, lambda: step(x, y))
    return row


def mlp_row(cp: Any, torch: Optional[Any]) -> GpuRow:
    from cgvm.ir import TensorType, input_value
    from cgvm.ops import elementwise_math as EM

    from . import nets

    b = nets._Builder(0)
    x = input_value(TensorType((128, 784)), "x")
    y = input_value(TensorType((128,), "int64"), "y")
    h = EM.relu(b.fc("fc1", x, 784, 512))
    h = EM.relu(b.fc("fc2", h, 512, 512))
    net = nets.Net("MLP", x, y, b.fc("fc3", h, 512, 10), b.params, b.ws, 10)

    def torch_mlp(W):
        F = torch.nn.functional
        return lambda v: torch.addmm(W["fc3/b"], F.relu(torch.addmm(W["fc2/b"], F.relu(
            torch.addmm(W["fc1/b"], v, W["fc1/w"])), W["fc2/w"])), W["fc3/w"])
    return _train_row(cp, torch, "MLP 784-512-512-10 SGD step, batch 128", net, torch_mlp, 0.01, 50)


def lenet_row(cp: Any, torch: Optional[Any], batch: int = 64) -> GpuRow:
    from cgvm.ir import TensorType, input_value
    from cgvm.ops import elementwise_math as EM
    from cgvm.ops import pool as P
    from cgvm.ops import shape as S

    from . import nets

    b = nets._Builder(0)
    x = input_value(TensorType((batch, 1, 28, 28)), "x")
    y = input_value(TensorType((batch,), "int64"), "y")
    h = P.max_pool(b.conv("conv1", x, 1, 20, 5), kernel=(2,), stride=(2,))
    h = P.max_pool(b.conv("conv2", h, 20, 50, 5), kernel=(2,), stride=(2,))
    h = EM.relu(b.fc("ip1", S.reshape(h, shape=(-1, 800)), 800, 500))
    net = nets.Net("LeNet", x, y, b.fc("ip2", h, 500, 10), b.params, b.ws, 10)

    def torch_lenet(W):
        F = torch.nn.functional

        def forward(v):
            h = F.max_pool2d(F.conv2d(v, W["conv1/w"], W["conv1/b"]), 2, 2)
            h = F.max_pool2d(F.conv2d(h, W["conv2/w"], W["conv2/b"]), 2, 2).reshape(-1, 800)
            return torch.addmm(W["ip2/b"], F.relu(torch.addmm(W["ip1/b"], h, W["ip1/w"])), W["ip2/w"])
        return forward
    return _train_row(cp, torch, f"LeNet training step (SGD), batch {batch}", net, torch_lenet, 0.01, 30)


def rnn_rows(cp: Any, torch: Optional[Any]) -> List[GpuRow]:
    from . import rnn

    X, H0, W, U = (cp.asarray(a) for a in rnn._data())
    fwd, grad = rnn._cgvm_rnn()
    out = []
    for backward in (False, True):
        label = "forward+grad" if backward else "forward"
        row = GpuRow(f"RNN scan (tanh, hidden 128, 100 steps, batch 32) {label}",
                     "training" if backward else "forward", number=10)
        row.impls["cgvm"] = (lambda: grad(X, H0, W, U)) if backward else (lambda: fwd(X, H0, W, U))
        _count_copies(row, row.impls["cgvm"])
        if torch is not None:
            tX, tH0 = torch.from_dlpack(X).clone(), torch.from_dlpack(H0).clone()
            tW, tU = torch.from_dlpack(W).clone().requires_grad_(), torch.from_dlpack(U).clone().requires_grad_()

            def loop(backward=backward):
                h, total = tH0, 0.0
                with torch.set_grad_enabled(backward):
                    for t in range(tX.shape[0]):
                        h = torch.tanh(tX[t] @ tW + h @ tU)
                        total = total + h.sum()
                    return torch.autograd.grad(total, [tW, tU]) if backward else total
            row.impls["torch"] = loop
            got = grad(X, H0, W, U)[1] if backward else fwd(X, H0, W, U)
            want = loop()[0] if backward else loop()
            _agree(row, cp.asnumpy(got), want.detach().cpu().numpy(), 1e-3)
        out.append(row)
    return out


def forward_row(cp: Any, torch: Optional[Any], label: str, make: Callable, torch_net: Callable, batch: int,
                number: int) -> GpuRow:
    from . import gpu_torch, nets

    net = make(batch)
    f = nets.inference(net)
    x = cp.asarray(nets.batch(net)[0])
    row = GpuRow(f"{label} forward, batch {batch}", "forward", number=number)
    row.impls["cgvm"] = lambda: f(x)
    _count_copies(row, lambda: f(x))
    if torch is not None:
        forward = torch_net(torch, gpu_torch.weights(torch, net))
        tx = torch.from_dlpack(x).clone()

        def eager():
            with torch.no_grad():
                return forward(tx)
        row.impls["torch"] = eager
        _agree(row, cp.asnumpy(f(x)), eager().cpu().numpy(), 2e-3)
    return row


def resnet50_train_row(cp: Any, torch: Optional[Any], batch: int = 32) -> GpuRow:
    from . import gpu_torch, nets

    net = nets.resnet50(batch, train=True)
    row = _train_row(cp, torch, f"ResNet-50 training step (SGD), batch {batch}", net,
                     lambda W: gpu_torch.resnet50(torch, W, train=True), 0.01, 5)
    return row


# ------------------------------------------------------------------------------------- memory

class PeakTracker:
    """CuPy's pool behind an allocator that notes the most bytes in use at any allocation."""

    def __init__(self, cp: Any):
        self.cp, self.pool = cp, cp.get_default_memory_pool()
        self.peak = 0

    def malloc(self, nbytes: int) -> Any:
        mem = self.pool.malloc(nbytes)
        self.peak = max(self.peak, self.pool.used_bytes())
        return mem

    def __enter__(self) -> "PeakTracker":
        self.peak = self.pool.used_bytes()
        self.cp.cuda.set_allocator(self.malloc)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cp.cuda.set_allocator(self.pool.malloc)


def memory_rows(cp: Any, batch: int = 16) -> List[Dict[str, Any]]:
    """Device memory peak of inference (weights, input, plan, scratch, cuDNN workspaces, output)
    against weights + the two largest live activations (cgvm.compiler.memory_report), target 1.1x."""
    import gc

    from cgvm.compiler.memory_report import memory_report

    from . import nets

    rows = []
    for label, make in (("AlexNet", nets.alexnet), ("ResNet-50", nets.resnet50)):
        gc.collect()
        pool = cp.get_default_memory_pool()
        base = pool.used_bytes()
        with PeakTracker(cp) as tracker:
            net = make(batch)
            x = cp.asarray(nets.batch(net)[0])
            f = nets.inference(net)
            f(x)
            f(x)
            cp.cuda.Device().synchronize()
        rep = memory_report(f)
        floor = rep["weights"] + rep["two_largest_live"]
        peak = tracker.peak - base
        rows.append({"name": f"{label} inference device peak, batch {batch}", "peak_mib": peak / MIB,
                     "floor_mib": floor / MIB, "ratio": peak / floor, "target": 1.1,
                     "verdict": "ok" if peak <= 1.1 * floor else "MISSED",
                     "detail": f"weights {rep['weights'] / MIB:.1f} + two largest live "
                               f"{rep['two_largest_live'] / MIB:.1f} MiB; planned {rep['planned'] / MIB:.1f} MiB"})
        del net, f, x
    return rows


# ------------------------------------------------------------------------------------- report

def table(rows: List[GpuRow]) -> str:
    lines = ["| benchmark | cgvm | torch | cgvm/torch | target | | first call cgvm / torch | notes |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = {k: f"{v * 1e3:.3f} ms" for k, v in r.results.items()}
        first = " / ".join(f"{r.first_call_s[k]:.2f} s" for k in ("cgvm", "torch") if k in r.first_call_s)
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}x"
        target = ("< " if r.kind == "fusion" else "<= ") + f"{TARGETS[r.kind]}x"
        lines.append(f"| {r.name} | {ms.get('cgvm', '-')} | {ms.get('torch', '-')} | {ratio} | {target} | "
                     f"{r.verdict} | {first} | {'; '.join(r.notes)} |")
    return "\n".join(lines)


def memory_table(rows: List[Dict[str, Any]]) -> str:
    lines = ["| device memory | peak | weights + two largest live | ratio | target | | detail |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['peak_mib']:.1f} MiB | {r['floor_mib']:.1f} MiB | {r['ratio']:.2f}x | "
                     f"<= {r['target']}x | {r['verdict']} | {r['detail']} |")
    return "\n".join(lines)


def device_line(cp: Any, torch: Optional[Any]) -> str:
    from cgvm.backend import cudnn

    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    conv = cudnn.choose(cp, np.float32, 2, ((1, 1), (1, 1)))
    parts = [f"GPU {name} ({props['totalGlobalMem'] / 2 ** 30:.0f} GiB)",
             f"CuPy {cp.__version__} (CUDA runtime {cp.cuda.runtime.runtimeGetVersion()})",
             "convolutions: cuDNN" if conv.path == "cudnn" else f"convolutions: im2col+GEMM ({conv.reason})"]
    if torch is not None:
        parts.append(f"torch {torch.__version__} (CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
                     f"cudnn.benchmark={torch.backends.cudnn.benchmark})")
    else:
        parts.append("no PyTorch CUDA: cgvm times only")
    return "; ".join(parts)


def plan(cp: Any, torch: Optional[Any]) -> List[Tuple[str, Callable[[], List[GpuRow]]]]:
    """(label, build) of each row group, in the order they run (cheapest first)."""
    from . import gpu_torch, nets

    return [("elementwise chain", lambda: [chain_row(cp, torch)]), ("MLP", lambda: [mlp_row(cp, torch)]),
            ("LeNet training", lambda: [lenet_row(cp, torch)]), ("RNN scan", lambda: rnn_rows(cp, torch)),
            ("AlexNet forward", lambda: [forward_row(cp, torch, "AlexNet", nets.alexnet, gpu_torch.alexnet, 128, 10)]),
            ("ResNet-50 forward", lambda: [forward_row(cp, torch, "ResNet-50", nets.resnet50, gpu_torch.resnet50,
                                                       64, 5)]),
            ("ResNet-50 training", lambda: [resnet50_train_row(cp, torch)])]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the Markdown tables here")
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--budget", type=float, default=600.0, help="start no row after this many seconds")
    ap.add_argument("--only", default=None, help="only the row groups whose label contains this text "
                    "(elementwise chain, MLP, LeNet training, RNN scan, AlexNet forward, ResNet-50 forward, "
                    "ResNet-50 training)")
    ap.add_argument("--no-memory", action="store_true", help="skip the device memory rows")
    args = ap.parse_args(argv)
    try:
        cp = require_gpu()
    except NoGPU as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    gpu_workspaces_by_default()
    torch = torch_cuda()
    start = time.perf_counter()
    header = device_line(cp, torch)
    print(header, file=sys.stderr)

    def sync() -> None:
        cp.cuda.Device().synchronize()
        if torch is not None:
            torch.cuda.synchronize()
    done: List[GpuRow] = []
    skipped: List[str] = []
    for label, make in plan(cp, torch):
        if args.only and args.only not in label:
            continue
        if time.perf_counter() - start > args.budget:
            skipped.append(f"{label} (out of time)")
            continue
        try:
            rows = make()
        except Exception as exc:  # a row that cannot be built is reported, the others still run
            skipped.append(f"{label}: {type(exc).__name__}: {exc}"[:300])
            continue
        for row in rows:
            measure(row, sync)
            done.append(row)
            print(f"done: {row.name} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    mem: List[Dict[str, Any]] = []
    if not args.no_memory and not args.only and time.perf_counter() - start <= args.budget:
        try:
            mem = memory_rows(cp)
        except Exception as exc:
            skipped.append(f"memory rows: {type(exc).__name__}: {exc}"[:300])
    text = "\n".join([header, "", table(done)] + (["", memory_table(mem)] if mem else [])
                     + ([""] + [f"not measured: {s}" for s in skipped] if skipped else []))
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": header, "rows": [{"name": r.name, "kind": r.kind, "seconds": r.results,
                                                   "ratio": r.ratio, "target": TARGETS[r.kind], "verdict": r.verdict,
                                                   "first_call_s": r.first_call_s, "notes": r.notes} for r in done],
                       "memory": mem, "not_measured": skipped}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
