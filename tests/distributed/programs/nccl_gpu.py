"""NCCL on real GPUs (CuPy): usage, under mpiexec, nccl_gpu.py STEPS. One rank per GPU.

The group's collectives on device arrays, then an MLP trained on the CuPy backend with its gradients
reduced by the allreduce_start/allreduce_wait ops through NCCL (two buckets, overlapped), each rank on
its share of a global batch; every rank also trains the same MLP in-process on the NumPy backend with
the whole global batch and no reduction, and the weights must agree to 1e-4 (relative: cuBLAS and
OpenBLAS round differently). With one rank
the bucket ops still run (reduce_gradients adds none for one rank; insert_reductions does)."""
import sys

import numpy as np

import cgvm
import cgvm.distributed as dist
from cgvm.ir import TensorType, input_value, param_value
from cgvm.backend.base import host_array
from cgvm.ops import elementwise as E, linalg as L, loss as LS

import cupy

steps = int(sys.argv[1])
g = dist.init(device="gpu")
r, n = g.rank, g.size
assert g.device == "gpu" and cupy.cuda.Device().id == g.local_rank % cupy.cuda.runtime.getDeviceCount()

a = cupy.arange(6, dtype=cupy.float32) * (r + 1)
dist.allreduce(a, "mean")
assert np.allclose(cupy.asnumpy(a), np.arange(6) * (n + 1) / 2)
b = cupy.full(4, 7.0 if r == 0 else -1.0, cupy.float32)
dist.broadcast(b, root=0)
assert np.all(cupy.asnumpy(b) == 7.0)
gathered = dist.allgather(cupy.asarray(np.array([r, 10 * r], np.int32)))
assert cupy.asnumpy(gathered).tolist() == [[k, 10 * k] for k in range(n)]
dist.barrier()

rng = np.random.default_rng(0)
share, lr = 8, 0.1
X = rng.standard_normal((share * n * steps, 12)).astype(np.float32)
Y = rng.integers(0, 3, len(X)).astype(np.int64)
start = {"w1": (rng.standard_normal((12, 16)) * 0.3).astype(np.float32), "b1": np.zeros(16, np.float32),
         "w2": (rng.standard_normal((16, 3)) * 0.3).astype(np.float32), "b2": np.zeros(3, np.float32)}


def train(backend, reduce):
    ws = cgvm.Workspace(backend)
    for k, v in start.items():
        ws[k] = v
    x = input_value(TensorType((None, 12)), "x")
    y = input_value(TensorType((None,), "int64"), "y")
    ps = [param_value(k, TensorType(v.shape)) for k, v in start.items()]
    hidden = E.tanh(E.add(L.matmul(x, ps[0]), ps[1]))
    loss = LS.softmax_cross_entropy(E.add(L.matmul(hidden, ps[2]), ps[3]), y)
    grads = cgvm.autodiff.grad(loss, ps)
    if reduce:
        buckets = dist.plan_buckets(grads, 256)   # w2+b2 | w1 | b1 ... : more than one bucket
        assert len(buckets) >= 2, buckets
        grads = (dist.reduce_gradients(grads, bucket_bytes=256) if n > 1 else
                 dist.insert_reductions(grads, buckets, g, scale=1.0))
    step = cgvm.compile([x, y], loss, workspace=ws, updates={p: E.sub(p, E.mul(gr, lr)) for p, gr in zip(ps, grads)})
    if reduce:
        assert "allreduce_start" in step.dis() and "allreduce_wait" in step.dis()
    per = share * n if not reduce else share
    for s in range(steps):
        rows = slice(s * share * n, (s + 1) * share * n)
        xs, ys = X[rows], Y[rows]
        if reduce:
            xs, ys = xs[r * share:(r + 1) * share], ys[r * share:(r + 1) * share]
        assert len(xs) == per
        step(xs, ys)
    return {k: host_array(ws[k]) for k in start}


on_gpu = train("cupy", True)
reference = train("numpy", False)
for k, want in reference.items():
    rel = np.abs(on_gpu[k] - want).max() / np.abs(want).max()
    assert rel < 1e-4, f"{k}: NCCL run differs from the one-process NumPy run by {rel:.3g}"
everyone = g.allgather_object({k: v.tobytes() for k, v in on_gpu.items()})
assert all(e == everyone[0] for e in everyone), "ranks hold different weights"
print(f"rank {r} of {n}: nccl gpu ok ({steps} steps)", flush=True)
