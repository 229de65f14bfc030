"""cgvm.distributed.nccl's NCCLGroup on 2+ CPU ranks with a fake CuPy/NCCL (fake_cupy.py): the unique id
made on rank 0 alone and sent over MPI, one NCCL call per collective and per gradient bucket with the
right count, type, operation and stream, the stream/event ordering of non-blocking buckets, host arrays
left to MPI, and the values, checked against MPI's own reduction of the same data."""
import numpy as np

import cgvm.distributed as dist
import fake_cupy as fc
from cgvm.distributed import collective_ops as cops
from cgvm.distributed.nccl import NCCLGroup
from cgvm.errors import DistributedError

base = dist.init()
r, n = base.rank, base.size
g = NCCLGroup(base, cupy=fc, nccl=fc.nccl)
nccl = fc.nccl
compute, comm = fc.default_stream.ptr, g.comm_stream.ptr
assert comm != compute and g.comm_stream.non_blocking

# the unique id: made once, on rank 0, and every rank's communicator opened with it
assert len(nccl.made_ids) == (1 if r == 0 else 0), nccl.made_ids
uids = base.allgather_object(g.comm.uid)
assert all(u == uids[0] for u in uids) and len(uids[0]) == 128
assert base.bcast_object(nccl.made_ids[0] if r == 0 else None) == uids[0]
assert (g.comm.ndev, g.comm.rank) == (n, r) and ("use_device", 0) in fc.calls

# blocking collectives on "device" arrays: one NCCL call each, on the current (compute) stream
fc.calls.clear()
a = fc.asarray(np.arange(6, dtype=np.float32) * (r + 1))
g.allreduce(a, "mean")
assert np.allclose(a, np.arange(6) * (n + 1) / 2), a
mx = fc.asarray(np.array([r, -r], np.int64))
g.allreduce(mx, "max")
assert mx.tolist() == [n - 1, 0]
b = fc.asarray(np.full(5, 7.0 if r == 0 else -1.0, np.float64))
g.broadcast(b, root=0)
assert np.all(b == 7.0)
gathered = g.allgather(fc.asarray(np.array([r, 10 * r], np.int32)))
assert isinstance(gathered, fc.ndarray) and gathered.tolist() == [[k, 10 * k] for k in range(n)]
assert fc.calls == [("allReduce", 6, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, compute),
                    ("allReduce", 2, nccl.NCCL_INT64, nccl.NCCL_MAX, compute),
                    ("bcast", 5, nccl.NCCL_FLOAT64, 0, compute),
                    ("allGather", 2, nccl.NCCL_INT32, compute)], fc.calls

# host arrays go to MPI, not NCCL
fc.calls.clear()
h = np.ones(3, np.float32)
g.allreduce(h)
assert np.all(h == n) and fc.calls == []
for bad, message in ((fc.asarray(np.zeros(3, bool)), "NCCL cannot reduce bool"),
                     (fc.asarray(np.zeros((4, 4), np.float32))[:, ::2], "contiguous")):
    try:
        g.allreduce(bad)
    except DistributedError as e:
        assert message in str(e), e
    else:
        raise AssertionError(f"{message}: accepted")

# the gradient buckets, through the kernels the VM runs for reduce_gradients' ops
gid = cops.register_group(g)
rng = np.random.default_rng(r)
host = [rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (4,), (2, 2))]
grads = [fc.asarray(x) for x in host]
expected = []
for x in host:   # the mean over the ranks, by MPI on the host copies
    y = x.copy()
    base.allreduce(y, "mean")
    expected.append(y)
buckets = [[0, 1], [2]]
starts = [cops.allreduce_start.bind(fc, {"group": gid, "bucket": k, "blocking": False, "scale": 1.0 / n})
          for k in range(2)]
waits = [cops.allreduce_wait.bind(fc, {"group": gid, "bucket": k, "shapes": [host[i].shape for i in m],
                                       "scale": 1.0}) for k, m in enumerate(buckets)]
fc.calls.clear()
flats = [starts[k](*[grads[i] for i in m]) for k, m in enumerate(buckets)]
started = list(fc.calls)
# per bucket: packed on the compute stream -> the comm stream waits for that -> NCCL on the comm stream -> done
assert len(started) == 8, started
for k, count in enumerate((16, 4)):
    record_ready, wait_ready, reduce, record_done = started[4 * k: 4 * k + 4]
    assert record_ready[0] == "record" and record_ready[2] == compute, started
    assert wait_ready == ("wait_event", comm, record_ready[1]), started
    assert reduce == ("allReduce", count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, comm), started
    assert record_done[0] == "record" and record_done[2] == comm, started
dones = [started[3][1], started[7][1]]
fc.calls.clear()
out1 = waits[1](flats[1])             # waited for in another order than started
out0 = waits[0](flats[0])
assert fc.calls == [("wait_event", compute, dones[1]), ("wait_event", compute, dones[0])], fc.calls
for got, want in zip(list(out0) + [out1], expected):
    assert isinstance(got, fc.ndarray) and got.shape == want.shape
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)

# a blocking bucket (overlap off): NCCL on the compute stream, no events
fc.calls.clear()
block = cops.allreduce_start.bind(fc, {"group": gid, "bucket": 0, "blocking": True, "scale": 1.0})
flat = block(fc.asarray(np.full(3, float(r), np.float32)))
assert fc.calls == [("allReduce", 3, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, compute)], fc.calls
assert np.all(flat == sum(range(n)))

fc.calls.clear()
g.barrier()
assert fc.calls == [("synchronize", compute), ("synchronize", comm)], fc.calls
print(f"rank {r} nccl glue ok", flush=True)
