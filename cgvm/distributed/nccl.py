"""NCCL for CuPy buffers: one communicator per process (one GPU each), its unique id sent over MPI.

CUDA-aware MPI is not assumed: MPI carries only the 128-byte NCCL id (and host arrays); device
arrays are reduced by ``ncclAllReduce`` on the current CuPy stream. A "request" is a CUDA event
recorded after the reduction; finishing it makes the current stream wait on that event, so the
update that reads the gradients is ordered after the reduction without blocking the host.

Untested on a device in cgvm's CI (it has no GPU); the CPU paths are tested with 2 MPI ranks.
"""
from __future__ import annotations

from typing import Any, List

import numpy as np

from ..errors import DistributedError

_NCCL_TYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
               "int32": "NCCL_INT32", "int64": "NCCL_INT64"}
_NCCL_OPS = {"sum": "NCCL_SUM", "mean": "NCCL_SUM", "max": "NCCL_MAX", "min": "NCCL_MIN"}


class NCCLGroup:
    """The MPI group's ranks, with device buffers reduced by NCCL and host buffers by MPI."""

    device = "gpu"

    def __init__(self, mpi_group: Any):
        try:
            import cupy
            from cupy.cuda import nccl
        except ImportError as e:
            raise DistributedError(f"the GPU group needs CuPy with NCCL: pip install 'cgvm[gpu]' ({e})") from None
        self.mpi, self.cupy, self.nccl = mpi_group, cupy, nccl
        self.rank, self.size, self.local_rank = mpi_group.rank, mpi_group.size, mpi_group.local_rank
        self.launcher = mpi_group.launcher
        self.timeout = mpi_group.timeout
        devices = cupy.cuda.runtime.getDeviceCount()
        if devices == 0:
            raise DistributedError(f"rank {self.rank}: device='gpu' but this host has no CUDA device")
        cupy.cuda.Device(self.local_rank % devices).use()
        uid = nccl.get_unique_id() if self.rank == 0 else None
        uid = mpi_group.comm.bcast(uid, root=0)
        self.comm = nccl.NcclCommunicator(self.size, uid, self.rank)

    def _is_device(self, array: Any) -> bool:
        return isinstance(array, self.cupy.ndarray)

    def _dtype(self, array: Any) -> int:
        name = _NCCL_TYPES.get(str(array.dtype))
        if name is None:
            raise DistributedError(f"NCCL cannot reduce {array.dtype} arrays; use one of {sorted(_NCCL_TYPES)}")
        return getattr(self.nccl, name)

    def _stream(self) -> int:
        return self.cupy.cuda.get_current_stream().ptr

    def allreduce(self, array: Any, op: str = "sum") -> Any:
        if not self._is_device(array):
            return self.mpi.allreduce(array, op)
        if op not in _NCCL_OPS:
            raise DistributedError(f"unknown reduction {op!r}; use 'sum', 'mean', 'max' or 'min'")
        if not array.flags.c_contiguous:
            raise DistributedError("allreduce works in place and needs a contiguous array")
        self.comm.allReduce(array.data.ptr, array.data.ptr, array.size, self._dtype(array),
                            getattr(self.nccl, _NCCL_OPS[op]), self._stream())
        if op == "mean":
            array *= 1.0 / self.size
        return array

    def broadcast(self, array: Any, root: int = 0) -> Any:
        if not self._is_device(array):
            return self.mpi.broadcast(array, root)
        self.comm.bcast(array.data.ptr, array.size, self._dtype(array), root, self._stream())
        return array

    def allgather(self, array: Any) -> Any:
        if not self._is_device(array):
            return self.mpi.allgather(array)
        a = self.cupy.ascontiguousarray(array)
        out = self.cupy.empty((self.size,) + a.shape, a.dtype)
        self.comm.allGather(a.data.ptr, out.data.ptr, a.size, self._dtype(a), self._stream())
        return out

    def allgather_object(self, obj: Any) -> List[Any]:
        return self.mpi.allgather_object(obj)

    def barrier(self) -> None:
        self.cupy.cuda.get_current_stream().synchronize()
        self.mpi.barrier()

    def start_allreduce(self, array: Any, blocking: bool = False) -> Any:
        if not self._is_device(array):
            return self.mpi.start_allreduce(np.asarray(array), blocking)
        self.allreduce(array, "sum")
        if blocking:
            self.cupy.cuda.get_current_stream().synchronize()
            return None
        event = self.cupy.cuda.Event(disable_timing=True)
        event.record()
        return event

    def finish(self, handle: Any, what: str = "collective") -> None:
        if handle is None:
            return
        if isinstance(handle, self.cupy.cuda.Event):
            self.cupy.cuda.get_current_stream().wait_event(handle)
            return
        self.mpi.finish(handle, what)

    def abort(self, code: int = 1) -> None:
        try:
            self.comm.abort()
        finally:
            self.mpi.abort(code)
