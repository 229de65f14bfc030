"""NCCL for CuPy buffers: one communicator per process (one GPU each), its unique id sent over MPI.

CUDA-aware MPI is not assumed: MPI carries only NCCL's unique id (and host arrays); device arrays
are reduced by NCCL. Blocking collectives run on the current CuPy stream, so whatever reads the
result is ordered after them without the host waiting. A non-blocking gradient allreduce
(``start_allreduce``, one per bucket) runs on a separate communication stream so that the
backward kernels issued after it overlap with it:

    ready.record(compute)           # the bucket has been packed (on the compute stream)
    comm.wait_event(ready)          # NCCL starts only after that
    ncclAllReduce(flat, ..., comm)  # in place
    done.record(comm)               # the handle
    finish: compute.wait_event(done)   # the update that reads the bucket waits on the GPU, not the host

The flat buffer is alive until ``allreduce_wait`` has read it (it is that op's input), and work
queued after the wait on the compute stream is ordered after ``done``, so CuPy's memory pool
cannot hand the buffer out while NCCL still writes it.

``NCCLGroup(mpi_group, cupy=..., nccl=...)`` takes the modules explicitly for tests that drive
this code with a fake CuPy on the CPU (tests/distributed/programs/nccl_fake.py); the GPU run is
tests/distributed/test_nccl_gpu.py.
"""
from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from ..errors import DistributedError

_NCCL_TYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
               "int32": "NCCL_INT32", "int64": "NCCL_INT64"}
_NCCL_OPS = {"sum": "NCCL_SUM", "mean": "NCCL_SUM", "max": "NCCL_MAX", "min": "NCCL_MIN"}


def _import_cupy_nccl() -> Any:
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as e:
        raise DistributedError(f"the GPU group needs CuPy with NCCL: pip install 'cgvm[gpu]' ({e})") from None
    if not getattr(nccl, "available", True):
        raise DistributedError("this CuPy was built without NCCL support; install a CuPy wheel that ships NCCL "
                               "(pip install 'cgvm[gpu]'), or train with device='cpu'")
    return cupy, nccl


class NCCLGroup:
    """The MPI group's ranks, with device buffers reduced by NCCL and host buffers by MPI."""

    device = "gpu"

    def __init__(self, mpi_group: Any, cupy: Any = None, nccl: Any = None):
        if cupy is None or nccl is None:
            cupy, nccl = _import_cupy_nccl()
        self.mpi, self.cupy, self.nccl = mpi_group, cupy, nccl
        self.rank, self.size, self.local_rank = mpi_group.rank, mpi_group.size, mpi_group.local_rank
        self.launcher = mpi_group.launcher
        self.timeout = mpi_group.timeout
        self.peers = getattr(mpi_group, "peers", None)
        devices = cupy.cuda.runtime.getDeviceCount()
        if devices == 0:
            raise DistributedError(f"rank {self.rank}: device='gpu' but this host has no CUDA device")
        self.device_id = self.local_rank % devices
        cupy.cuda.Device(self.device_id).use()
        # rank 0 makes the id; MPI (host memory) carries it to the others
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = mpi_group.bcast_object(uid, root=0)
        try:
            self.comm = nccl.NcclCommunicator(self.size, uid, self.rank)
        except Exception as e:   # NcclError: e.g. two ranks on one GPU ("Duplicate GPU detected")
            raise DistributedError(f"rank {self.rank} of {self.size}: NCCL could not open its communicator on GPU "
                                   f"{self.device_id} ({devices} on this host): {e}. NCCL needs one GPU per rank: "
                                   "start at most as many ranks per host as it has GPUs") from None
        self.comm_stream = cupy.cuda.Stream(non_blocking=True)

    # -- helpers ---------------------------------------------------------------------
    def _is_device(self, array: Any) -> bool:
        return isinstance(array, self.cupy.ndarray)

    def _dtype(self, array: Any) -> int:
        name = _NCCL_TYPES.get(str(array.dtype))
        if name is None:
            raise DistributedError(f"NCCL cannot reduce {array.dtype} arrays; use one of {sorted(_NCCL_TYPES)}")
        return getattr(self.nccl, name)

    @staticmethod
    def _contiguous(array: Any, what: str) -> None:
        if not array.flags.c_contiguous:
            raise DistributedError(f"{what} works in place and needs a contiguous array")

    def _current(self) -> Any:
        return self.cupy.cuda.get_current_stream()

    def _reduce(self, array: Any, op: str, stream: Any) -> None:
        if op not in _NCCL_OPS:
            raise DistributedError(f"unknown reduction {op!r}; use 'sum', 'mean', 'max' or 'min'")
        self._contiguous(array, "allreduce")
        self.comm.allReduce(array.data.ptr, array.data.ptr, array.size, self._dtype(array),
                            getattr(self.nccl, _NCCL_OPS[op]), stream.ptr)

    # -- blocking collectives (ordered on the current stream) ---------------------------
    def allreduce(self, array: Any, op: str = "sum") -> Any:
        if not self._is_device(array):
            return self.mpi.allreduce(array, op)
        self._reduce(array, op, self._current())
        if op == "mean":
            self.cupy.multiply(array, 1.0 / self.size, out=array, casting="unsafe")
        return array

    def broadcast(self, array: Any, root: int = 0) -> Any:
        if not self._is_device(array):
            return self.mpi.broadcast(array, root)
        self._contiguous(array, "broadcast")
        self.comm.bcast(array.data.ptr, array.size, self._dtype(array), root, self._current().ptr)
        return array

    def allgather(self, array: Any) -> Any:
        if not self._is_device(array):
            return self.mpi.allgather(array)
        a = self.cupy.ascontiguousarray(array)
        out = self.cupy.empty((self.size,) + a.shape, a.dtype)
        self.comm.allGather(a.data.ptr, out.data.ptr, a.size, self._dtype(a), self._current().ptr)
        return out

    def allgather_object(self, obj: Any) -> List[Any]:
        return self.mpi.allgather_object(obj)

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        return self.mpi.bcast_object(obj, root)

    def barrier(self) -> None:
        self._current().synchronize()
        self.comm_stream.synchronize()
        self.mpi.barrier()

    # -- the gradient buckets ----------------------------------------------------------
    def start_allreduce(self, array: Any, blocking: bool = False) -> Optional[Any]:
        """Start summing ``array`` in place over the ranks; the handle goes to ``finish``."""
        if not self._is_device(array):
            return self.mpi.start_allreduce(np.asarray(array), blocking)
        compute = self._current()
        if blocking:   # on the compute stream: later kernels wait for it (no overlap, for comparison)
            self._reduce(array, "sum", compute)
            return None
        ready = self.cupy.cuda.Event(disable_timing=True)
        ready.record(compute)
        self.comm_stream.wait_event(ready)
        self._reduce(array, "sum", self.comm_stream)
        done = self.cupy.cuda.Event(disable_timing=True)
        done.record(self.comm_stream)
        return done

    def finish(self, handle: Any, what: str = "collective") -> None:
        """Order the current stream after ``handle`` (a device reduction), or wait for an MPI request."""
        if handle is None:
            return
        if isinstance(handle, self.cupy.cuda.Event):
            self._current().wait_event(handle)
            return
        self.mpi.finish(handle, what)

    def abort(self, code: int = 1) -> None:
        try:
            self.comm.abort()
        finally:
            self.mpi.abort(code)
