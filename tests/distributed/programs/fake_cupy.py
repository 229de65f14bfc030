"""A CPU stand-in for the parts of CuPy and cupy.cuda.nccl that cgvm.distributed.nccl uses, for driving
NCCLGroup without a GPU: host arrays pose as device arrays (``.data.ptr`` is their address), streams and
events only record what is asked of them, and the communicator reduces over MPI's COMM_WORLD at call time
(a real NCCL call runs when its stream reaches it). Every call is appended to ``calls``."""
import ctypes
import itertools
from types import SimpleNamespace

import numpy as np
from mpi4py import MPI

calls = []
_ids = itertools.count(1)


class _Pointer:
    def __init__(self, ptr):
        self.ptr = ptr


class ndarray(np.ndarray):
    """Host memory posing as device memory, like a cupy.ndarray: ``.data.ptr`` is its address."""

    @property
    def data(self):
        return _Pointer(self.__array_interface__["data"][0])


def empty(shape, dtype=np.float32):
    return np.empty(shape, dtype).view(ndarray)


def asarray(a, dtype=None):
    return np.array(a, dtype=dtype).view(ndarray)    # a copy, as host -> device is


def ascontiguousarray(a):
    return np.ascontiguousarray(a).view(ndarray)


def asnumpy(a):
    return np.array(a).view(np.ndarray)


multiply = np.multiply


class Stream:
    def __init__(self, non_blocking=False):
        self.ptr = 0x1000 * next(_ids)
        self.non_blocking = non_blocking

    def wait_event(self, event):
        calls.append(("wait_event", self.ptr, event.id))

    def synchronize(self):
        calls.append(("synchronize", self.ptr))


class Event:
    def __init__(self, disable_timing=False):
        self.id = next(_ids)

    def record(self, stream=None):
        calls.append(("record", self.id, (stream or default_stream).ptr))


class Device:
    def __init__(self, index):
        self.index = index

    def use(self):
        calls.append(("use_device", self.index))


default_stream = Stream()
cuda = SimpleNamespace(Stream=Stream, Event=Event, Device=Device, get_current_stream=lambda: default_stream,
                       runtime=SimpleNamespace(getDeviceCount=lambda: 1))

_TYPES = {1: np.int32, 2: np.int64, 3: np.float16, 4: np.float32, 5: np.float64}
_OPS = {0: MPI.SUM, 1: MPI.MAX, 2: MPI.MIN}


def _view(ptr, count, datatype):
    kind = np.dtype(_TYPES[datatype])
    raw = (ctypes.c_byte * (count * kind.itemsize)).from_address(ptr)
    return np.frombuffer(raw, dtype=kind, count=count)


class NcclCommunicator:
    def __init__(self, ndev, uid, rank):
        self.ndev, self.uid, self.rank = ndev, uid, rank
        calls.append(("communicator", ndev, rank))

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        calls.append(("allReduce", count, datatype, op, stream))
        if sendbuf != recvbuf:
            _view(recvbuf, count, datatype)[:] = _view(sendbuf, count, datatype)
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, _view(recvbuf, count, datatype), op=_OPS[op])

    def bcast(self, buff, count, datatype, root, stream):
        calls.append(("bcast", count, datatype, root, stream))
        MPI.COMM_WORLD.Bcast(_view(buff, count, datatype), root=root)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        calls.append(("allGather", count, datatype, stream))
        size = MPI.COMM_WORLD.Get_size()
        MPI.COMM_WORLD.Allgather(_view(sendbuf, count, datatype).copy(), _view(recvbuf, count * size, datatype))

    def abort(self):
        calls.append(("abort",))


made_ids = []


def _get_unique_id():
    uid = tuple(int(b) for b in np.random.default_rng().integers(-128, 128, 128))
    made_ids.append(uid)
    return uid


nccl = SimpleNamespace(NcclCommunicator=NcclCommunicator, get_unique_id=_get_unique_id, made_ids=made_ids,
                       available=True, NCCL_INT32=1, NCCL_INT64=2, NCCL_FLOAT16=3, NCCL_FLOAT32=4, NCCL_FLOAT64=5,
                       NCCL_SUM=0, NCCL_MAX=1, NCCL_MIN=2)
