"""Core API data parallelism: an MLP trained with SGD on a fixed data set, the global batch split over
the ranks. Writes this rank's final weights to OUT_rank<r>.npz. Run by tests/distributed/test_core.py."""
import os
import signal
import sys

import numpy as np

import cgvm
import cgvm.distributed as dist
from cgvm.ir import TensorType, input_value, param_value
from cgvm.ops import elementwise as E, linalg as L, loss as LS, nn as NN

out, global_batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
bucket = int(sys.argv[4]) if len(sys.argv) > 4 else None
overlap = (sys.argv[5] != "blocking") if len(sys.argv) > 5 else True
g = dist.init()
rng = np.random.default_rng(0)
X = rng.standard_normal((global_batch * 10, 12)).astype(np.float32)
Y = rng.integers(0, 3, len(X)).astype(np.int64)
ws = cgvm.Workspace()
# each rank starts from different weights: the broadcast from rank 0 must make them equal
init = np.random.default_rng(100 + g.rank)
fault = os.environ.get("CGVM_TEST_FAULT", "")    # "raise:R:STEP", "kill:R:STEP", "stall:R:STEP" or "hidden:R"
kind, fault_rank, fault_step = (fault.split(":") + ["", "", ""])[:3] if fault else ("", "-1", "-1")
hidden = 17 if kind == "hidden" and g.rank == int(fault_rank) else 16
shapes = {"w1": (12, hidden), "b1": (hidden,), "w2": (hidden, 3), "b2": (3,)}
for name, shape in shapes.items():
    ws[name] = (init.standard_normal(shape) * 0.3).astype(np.float32)
if kind != "hidden":
    dist.broadcast_parameters(ws)
x = input_value(TensorType((None, 12)), "x")
y = input_value(TensorType((None,), "int64"), "y")
params = {n: param_value(n, TensorType(s)) for n, s in shapes.items()}
h = E.tanh(E.add(L.matmul(x, params["w1"]), params["b1"]))
logits = E.add(L.matmul(h, params["w2"]), params["b2"])
loss = LS.softmax_cross_entropy(logits, y)
grads = dist.data_parallel_grad(loss, list(params.values()), bucket_bytes=bucket, overlap=overlap)
step = cgvm.compile([x, y], loss, workspace=ws,
                    updates={p: E.sub(p, E.mul(gr, 0.1)) for p, gr in zip(params.values(), grads)})
rows = dist.shard_rows(global_batch)
for i in range(steps):
    if kind in ("raise", "kill", "stall") and g.rank == int(fault_rank) and i == int(fault_step):
        if kind == "stall":          # alive but stuck: the peers' collective times out
            import time
            time.sleep(60)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected failure at step {i}")
    start = (i * global_batch) % len(X)
    xb, yb = X[start:start + global_batch][rows], Y[start:start + global_batch][rows]
    step(xb, yb)
np.savez(f"{out}_rank{g.rank}.npz", **{n: np.asarray(ws[n]) for n in shapes})
if g.rank == 0 and "--dis" in sys.argv:
    print(step.dis())
