"""cgvm.distributed's collectives on 2+ ranks, checked against values computed from the rank numbers."""
import numpy as np

import cgvm
import cgvm.distributed as dist
from cgvm.dlpack import Tensor

g = dist.init()
r, n = dist.rank(), dist.size()
assert n == g.size >= 2 and 0 <= dist.local_rank() < n
ws = cgvm.Workspace()
ws["w"] = np.full((3, 4), float(r + 1), np.float32)
entry = ws["w"]
address = entry.ctypes.data
dist.allreduce(entry, "sum")                                    # a Workspace entry, in place
assert ws["w"].ctypes.data == address and np.all(ws["w"] == sum(range(1, n + 1)))
m = np.arange(6, dtype=np.float64) * (r + 1)
dist.allreduce(m, "mean")
assert np.allclose(m, np.arange(6) * (n + 1) / 2)
mx = np.array([r, -r], np.int64)
dist.allreduce(mx, "max")
assert mx.tolist() == [n - 1, 0]
t = Tensor(np.full(5, r, np.float32))
dist.allreduce(t)                                               # a DLPack Tensor: its array, in place
assert np.all(t.array == sum(range(n)))
b = np.full(4, 7.0 if r == 0 else -1.0, np.float32)
dist.broadcast(b, root=0)
assert np.all(b == 7.0)
b = np.full(2, float(r), np.float32)
dist.broadcast(b, root=n - 1)
assert np.all(b == n - 1)
gathered = dist.allgather(np.array([r, 10 * r], np.int32))
assert gathered.tolist() == [[k, 10 * k] for k in range(n)]
dist.barrier()
try:
    dist.allreduce(np.zeros((4, 4), np.float32)[:, ::2])        # not contiguous: refused, not copied
except cgvm.CgvmError as e:
    assert "contiguous" in str(e)
else:
    raise AssertionError("a strided view was accepted")
print(f"rank {r} ok")
