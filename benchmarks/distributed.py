"""Data-parallel scaling on MPI ranks: ``python -m benchmarks.distributed [--quick]``.

Each measurement is a fresh ``mpiexec -n R`` (or plain) run of this module's worker, one BLAS
thread per process, and the configurations of one net are interleaved round by round (medians
reported), so a ratio compares runs under the same machine state:

* weak scaling: 2 ranks x batch b against 1 process x batch b, samples/s (target >= 1.8x);
* the time the gradient allreduce adds to a step: 2 ranks that reduce nothing (the same two
  processes competing for the machine, no communication) against 2 ranks with blocking
  allreduces and with the default overlapped (non-blocking, bucketed) ones;
* the allreduce time against the payload (1 K to 16 M float32), fitted as alpha + bytes * beta;
* an alpha-beta projection for ResNet-50 (25.6 M parameters) on 8 and 64 ranks over 25 Gbit/s.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESNET50_PARAMS = 25_557_032
RESNET50_FLOPS_RATIO = 4.1 / 1.8      # forward multiply-adds per image, ResNet-50 / ResNet-18
LINK_BITS_PER_S = 25e9


# --------------------------------------------------------------------------- worker (inside mpiexec)

def _lenet_step(batch: int):
    import cgvm.caffe as caffe
    from benchmarks.caffe_nets import LENET_TRAIN

    tmp = tempfile.mkdtemp(prefix="cgvm-dist-bench-")
    net = os.path.join(tmp, "lenet.prototxt")
    Path(net).write_text(LENET_TRAIN.replace("dim: 64", f"dim: {batch}"))
    solver_file = os.path.join(tmp, "solver.prototxt")
    Path(solver_file).write_text(f'net: "{net}"\nbase_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\n'
                                 f'lr_policy: "fixed"\nmax_iter: 100000\ndisplay: 0\nsnapshot: 0\n'
                                 f'snapshot_prefix: "{tmp}/s"\nrandom_seed: 1\n')
    solver = caffe.get_solver(solver_file, log=False)
    rng = np.random.default_rng(caffe.solver_rank())
    solver.net.blobs["data"].data[...] = rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)
    solver.net.blobs["label"].data[...] = rng.integers(0, 10, batch).astype(np.float32)
    params = sum(int(np.prod(p.shape)) for p in solver.net.learnable_params)
    return (lambda: solver.step(1)), params


def _resnet_step(batch: int):
    import cgvm
    import cgvm.distributed as dist
    from benchmarks import nets
    from cgvm.ops import elementwise as E

    net = nets.resnet18(batch=batch, train=True, image=112)
    grads = cgvm.grad(nets.loss_of(net), net.params)
    if os.environ.get("BENCH_REDUCE", "1") == "1":
        grads = dist.reduce_gradients(grads)
        dist.broadcast_parameters(net.workspace, [p.name for p in net.params])
    step = cgvm.compile([net.x, net.y], nets.loss_of(net), workspace=net.workspace,
                        updates={p: E.sub(p, E.mul(g, 0.01)) for p, g in zip(net.params, grads)})
    x, y = nets.batch(net, seed=dist.rank())
    return (lambda: step(x, y)), sum(int(np.prod(p.shape)) for p in net.params)


def worker(args: argparse.Namespace) -> None:
    import cgvm.distributed as dist

    g = dist.init()
    if args.net == "allreduce":
        out = {}
        for k in range(10, 25, 2):
            a = np.ones(1 << k, np.float32)
            times = []
            for _ in range(args.steps if k < 22 else max(3, args.steps // 4)):
                g.barrier()
                t0 = time.perf_counter()
                g.allreduce(a)
                times.append(time.perf_counter() - t0)
            out[str(a.nbytes)] = statistics.median(times)
        a, b = np.ones(1 << 22, np.float32), np.ones(1 << 22, np.float32)
        t0 = time.perf_counter()
        for _ in range(10):
            np.add(a, b, out=a)
        out["add_s_per_byte"] = (time.perf_counter() - t0) / 10 / a.nbytes
        if g.rank == 0:
            print("RESULT " + json.dumps(out), flush=True)
        return
    import cgvm.caffe as caffe

    if os.environ.get("BENCH_REDUCE", "1") == "1" and g.size > 1:
        caffe.set_solver_count(g.size)
        caffe.set_solver_rank(g.rank)
    step, params = (_lenet_step if args.net == "lenet" else _resnet_step)(args.batch)
    step()
    step()     # warm: frames built, buffers planned
    g.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    g.barrier()
    elapsed = time.perf_counter() - t0
    if g.rank == 0:
        print("RESULT " + json.dumps({"step_s": elapsed / args.steps, "params": params,
                                      "samples_per_s": g.size * args.batch * args.steps / elapsed}), flush=True)


# --------------------------------------------------------------------------- driver

def _run(ranks: int, net: str, batch: int, steps: int, env: Dict[str, str]) -> dict:
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    cmd = ([mpiexec, "-n", str(ranks)] if ranks > 1 else []) + [
        sys.executable, "-m", "benchmarks.distributed", "--worker", "--net", net, "--batch", str(batch),
        "--steps", str(steps)]
    full = dict(os.environ, CGVM_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                CGVM_DIST_QUIET="1", PYTHONPATH=str(ROOT), **env)
    done = subprocess.run(cmd, cwd=ROOT, env=full, capture_output=True, text=True, timeout=600)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


CONFIGS = {
    "1 process": (1, {"BENCH_REDUCE": "0"}),
    "2 ranks, no allreduce": (2, {"BENCH_REDUCE": "0"}),
    "2 ranks, blocking allreduce": (2, {"CGVM_ALLREDUCE_OVERLAP": "0"}),
    "2 ranks, overlapped allreduce": (2, {}),
}


def scaling(net: str, batch: int, steps: int, rounds: int) -> List[str]:
    results: Dict[str, List[dict]] = {k: [] for k in CONFIGS}
    for _ in range(rounds):
        for name, (ranks, env) in CONFIGS.items():
            results[name].append(_run(ranks, net, batch, steps, env))
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("step_s", "samples_per_s")} for k, v in results.items()}
    params = results["1 process"][0]["params"]
    base = med["1 process"]["samples_per_s"]
    alone = med["2 ranks, no allreduce"]["step_s"]
    label = {"lenet": "LeNet (Caffe solver, SGD momentum)", "resnet18": "ResNet-18-shaped (112x112, SGD)"}[net]
    lines = []
    for name in CONFIGS:
        m = med[name]
        added = "" if name == "1 process" else f"{(m['step_s'] - alone) * 1e3:+.1f} ms"
        lines.append(f"| {label}, batch {batch}/rank, {params / 1e6:.2f} M params | {name} | "
                     f"{m['step_s'] * 1e3:.1f} ms | {m['samples_per_s']:.1f} | {m['samples_per_s'] / base:.2f}x | "
                     f"{added} |")
    return lines


def ring_allreduce_s(fit: dict, nbytes: float, ranks: int) -> float:
    """Ring allreduce: 2(N-1) latency terms (alpha measured on loopback) and 2(N-1)/N of the bytes
    through the 25 Gbit/s link, each byte also summed once per step (the measured reduction cost)."""
    beta_link = 8.0 / LINK_BITS_PER_S
    return 2 * (ranks - 1) * fit["alpha"] + 2 * (ranks - 1) / ranks * nbytes * (beta_link + fit["gamma"])


def projection(fit: dict, resnet18_112px_s_per_image: float) -> List[str]:
    """ResNet-50's gradient allreduce against one step's compute, at batch 32 a rank.

    Without overlap the allreduce adds to the step; with overlap it runs during backward (about
    2/3 of a step) except the last bucket (the first layers' 4 MiB), which starts when backward ends.
    """
    nbytes = RESNET50_PARAMS * 4
    cpu = resnet18_112px_s_per_image * 32 * 4 * RESNET50_FLOPS_RATIO   # 224x224: 4x the pixels of 112x112
    computes = {"cgvm CPU, 1 thread (ResNet-18 measured here, x4 for 224x224, x2.3 for ResNet-50)": cpu,
                "GPU-class step, 0.25 s (about a Pascal GPU at batch 32-64; assumed)": 0.25}
    lines = []
    for label, compute in computes.items():
        for n in (8, 64):
            comm = ring_allreduce_s(fit, nbytes, n)
            exposed = max(comm - compute * 2 / 3, ring_allreduce_s(fit, 4 << 20, n))
            lines.append(f"| {label} | {n} | {compute:.3g} s | {comm * 1e3:.0f} ms | {compute / (compute + comm):.0%} | "
                         f"{compute / (compute + exposed):.0%} | 90% (Horovod, 512 GPUs, ResNet-101 and Inception V3) |")
    return lines


def allreduce_fit(steps: int) -> tuple:
    data = _run(2, "allreduce", 1, steps, {})
    gamma = data.pop("add_s_per_byte")
    sizes = np.array([float(k) for k in data])
    times = np.array(list(data.values()))
    beta, alpha = np.polyfit(sizes, times, 1)
    alpha = max(float(alpha), float(times.min()) / 2)
    rows = [f"| {int(s) // 4:,} floats ({s / 2**20:.3g} MiB) | {t * 1e3:.3f} ms | {s / t / 1e9:.2f} GB/s |"
            for s, t in zip(sizes, times)]
    return {"alpha": alpha, "beta": float(beta), "gamma": gamma}, rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.distributed")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--net", default="lenet")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    from .harness import machine

    rounds = 1 if args.quick else 3
    import cgvm

    cgvm.set_num_threads(1)     # what every worker runs with (the driver itself computes nothing)
    print(f"Machine: {machine()}\n")
    print("| net | configuration | step | samples/s | vs 1 process | added by the allreduce |")
    print("|---|---|---|---|---|---|")
    lenet = scaling("lenet", 64, 10 if args.quick else 30, rounds)
    print("\n".join(lenet), flush=True)
    resnet = scaling("resnet18", 4, 2 if args.quick else 4, rounds)
    print("\n".join(resnet), flush=True)
    fit, rows = allreduce_fit(10 if args.quick else 30)
    print("\n| allreduce payload (2 ranks) | time | algorithm bandwidth |\n|---|---|---|")
    print("\n".join(rows))
    print(f"\nfit: alpha = {fit['alpha'] * 1e6:.1f} us, beta = {fit['beta'] * 1e9:.3f} ns/byte "
          f"({1 / fit['beta'] / 1e9:.2f} GB/s); local reduction {fit['gamma'] * 1e9:.3f} ns/byte")
    per_image = float(resnet[0].split("|")[3].strip().split()[0]) / 1e3 / 4   # 1 process, batch 4
    print("\n| ResNet-50 projection (25.6 M params, batch 32/rank, 25 Gbit/s ring) | ranks | compute/step | "
          "allreduce | efficiency, no overlap | with overlap | published |\n|---|---|---|---|---|---|---|")
    print("\n".join(projection(fit, per_image)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
