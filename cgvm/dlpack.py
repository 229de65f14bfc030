"""DLPack interop: ``from_dlpack`` to take tensors in, ``Tensor`` to hand them out.

    w = cgvm.from_dlpack(torch_tensor)        # a NumPy view of torch's memory, no copy
    t = torch.from_dlpack(ws.tensor("w"))     # torch sees the workspace entry, no copy

Both follow the array API's DLPack protocol (``__dlpack__(*, stream, max_version, dl_device,
copy)``, ``__dlpack_device__()``), with guards that peers do not all have:

- negative strides are never handed out or kept (torch 2.13 aborts the process on them): they
  are copied to a contiguous buffer, or BufferError when ``copy=False`` forbids the copy;
- read-only data stays read-only: a READ_ONLY capsule imports as a non-writeable view, and a
  non-writeable array exports with READ_ONLY set (or BufferError on the legacy protocol, which
  cannot say so);
- ``stream`` must be None for CPU tensors (BufferError otherwise);
- a host tensor going into the CuPy backend is copied to the device explicitly (CuPy itself
  refuses CPU producers).

Why an exported tensor stays valid (pinning). The capsule holds a reference to the array it
describes, so the memory lives as long as the consumer's view. What could still go wrong is a
*reuse* of that memory by cgvm, and there is none: Workspace entries and the outputs of compiled
functions are never memory-planned buffers (the planner leaves inputs, parameters, outputs and
whatever aliases them alone, see cgvm/compiler/memory.py), and updates rebind a name to a new
array instead of writing into the old one. A ``Tensor`` taken from the workspace therefore keeps
the values it was exported with after later updates; take a fresh ``ws.tensor(name)`` to see the
new ones. The one in-place write is ``Workspace.assign``, and exported views see it: that is the
zero-copy contract, the same as writing through the consumer's side.
"""
from __future__ import annotations

import ctypes
from enum import IntEnum
from typing import Any, NamedTuple, Optional, Tuple

import numpy as np

from .backend.base import Backend, get_backend
from .backend.transfer import COUNTS
from .errors import CgvmError

__all__ = ["DLDeviceType", "DLPackCopyError", "CapsuleInfo", "Tensor", "capsule_info", "from_dlpack"]

#: the newest DLPack major.minor version cgvm's consumers understand (NumPy and CuPy import 1.x)
MAX_VERSION = (1, 0)


class DLDeviceType(IntEnum):
    """``DLDeviceType`` of dlpack.h 1.1 (the first member of ``__dlpack_device__()``)."""

    CPU = 1
    CUDA = 2
    CPU_PINNED = 3          # kDLCUDAHost: page-locked host memory
    OPENCL = 4
    VULKAN = 7
    METAL = 8
    VPI = 9
    ROCM = 10
    ROCM_HOST = 11
    EXT_DEV = 12
    CUDA_MANAGED = 13
    ONE_API = 14
    WEBGPU = 15
    HEXAGON = 16
    MAIA = 17
    TRN = 18


# host memory NumPy can read as it is; anything else is asked for a host copy (dl_device=CPU)
_HOST_TYPES = frozenset({DLDeviceType.CPU, DLDeviceType.CPU_PINNED, DLDeviceType.ROCM_HOST})
_CUDA_TYPES = frozenset({DLDeviceType.CUDA, DLDeviceType.CUDA_MANAGED})

FLAG_READ_ONLY = 1 << 0
FLAG_IS_COPIED = 1 << 1
FLAG_IS_SUBBYTE_TYPE_PADDED = 1 << 2


class DLPackCopyError(CgvmError, BufferError, ValueError):
    """The exchange needs a copy but ``copy=False`` forbids it.

    A BufferError as the DLPack text says and a ValueError as the array API's ``from_dlpack``
    stub says, so callers written against either catch it.
    """


# ---------------------------------------------------------------------------------------- capsules

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):           # legacy: the tensor comes first
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedTensorVersioned(ctypes.Structure):  # 1.x: version and flags first, the tensor last
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype, _capsule_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


class CapsuleInfo(NamedTuple):
    """What an unconsumed DLPack capsule describes (strides in elements, as DLPack counts them)."""

    name: str                          # "dltensor" (legacy) or "dltensor_versioned"
    version: Optional[Tuple[int, int]]  # None for the legacy struct
    flags: int
    device: Tuple[DLDeviceType, int]
    dtype: Tuple[int, int, int]        # (code, bits, lanes): kDLInt=0, kDLUInt=1, kDLFloat=2, kDLBool=6, ...
    shape: Optional[Tuple[int, ...]]   # None where the producer left the pointer NULL (0-d tensors)
    strides: Optional[Tuple[int, ...]]  # None: compact row-major
    data: int                          # the data pointer plus byte_offset
    byte_offset: int

    @property
    def read_only(self) -> bool:
        return bool(self.flags & FLAG_READ_ONLY)

    @property
    def is_copied(self) -> bool:
        return bool(self.flags & FLAG_IS_COPIED)


def capsule_info(capsule: Any) -> CapsuleInfo:
    """Read a DLPack capsule's struct without consuming it (the capsule stays usable once)."""
    raw = _capsule_name(capsule)
    name = raw.decode() if raw else ""
    if name == "dltensor_versioned":
        managed = _DLManagedTensorVersioned.from_address(_capsule_pointer(capsule, raw))
        version: Optional[Tuple[int, int]] = (managed.major, managed.minor)
        flags = managed.flags
    elif name == "dltensor":
        managed = _DLManagedTensor.from_address(_capsule_pointer(capsule, raw))
        version, flags = None, 0
    else:
        raise ValueError(f"not an unconsumed DLPack capsule (its name is {name!r}); a capsule is consumed once")
    if version is not None and version[0] > MAX_VERSION[0]:
        # past a major version only the fields up to flags are guaranteed: do not read the tensor
        return CapsuleInfo(name, version, flags, (DLDeviceType.CPU, 0), (0, 0, 0), None, None, 0, 0)
    t = managed.dl_tensor
    shape = tuple(t.shape[i] for i in range(t.ndim)) if t.shape else None
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
    return CapsuleInfo(name, version, flags, (_device_type(t.device.device_type), t.device.device_id),
                       (t.dtype.code, t.dtype.bits, t.dtype.lanes), shape, strides,
                       (t.data or 0) + t.byte_offset, t.byte_offset)


_DEVICE_TYPES = {int(member): member for member in DLDeviceType}


def _device_type(code: int) -> Any:
    """The DLDeviceType member of ``code`` (a plain int for a type newer than this table)."""
    return _DEVICE_TYPES.get(code, code)


class _Exported:
    """A capsule already taken from its producer, handed to a consumer's ``from_dlpack``."""

    __slots__ = ("capsule", "device")

    def __init__(self, capsule: Any, device: Tuple[int, int]):
        self.capsule = capsule
        self.device = device

    def __dlpack__(self, **_consumer_keywords: Any) -> Any:
        return self.capsule  # the keywords were settled when the capsule was made

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self.device


def _export(x: Any, *, stream: Any) -> Any:
    """``x``'s capsule: ``max_version=(1, 0)`` first, the legacy signature when ``x`` answers TypeError."""
    try:
        return x.__dlpack__(stream=stream, max_version=MAX_VERSION)
    except TypeError:
        return x.__dlpack__() if stream is None else x.__dlpack__(stream=stream)


# ---------------------------------------------------------------------------------------- from_dlpack

def from_dlpack(x: Any, *, device: Any = None, copy: Optional[bool] = None, backend: Any = None) -> Any:
    """An array of a cgvm backend over the memory of DLPack producer ``x`` (no copy where possible).

    ``device``: None (the producer's device: host memory gives a NumPy array, CUDA memory a
    CuPy array), ``"cpu"``/``"cuda"``, a backend name, or a DLPack ``(device_type, id)`` pair.
    ``backend``: a cgvm backend (or its name) to import into; it must agree with ``device``.
    ``copy``: True always copies, False never does (DLPackCopyError, a BufferError and a
    ValueError, where a copy is needed), None copies only where it must.

    The result is read-only where the producer marked its memory read-only (or could not say, on
    the legacy protocol); negative strides are copied away, and so are torch's lazily negated
    views (torch exports their memory without the sign). Errors from the producer propagate.
    """
    x = _resolve_torch_negation(x, copy)
    src_type, src_id = x.__dlpack_device__()
    src = (_device_type(src_type), int(src_id))
    if device is None and backend is None and src_type in _HOST_TYPES:
        return _import_host(x, src, copy)  # the common case, straight through
    be, want_id = _target(src, device, backend)
    if be.xp is np:
        return _import_host(x, src, copy)
    return _import_cupy(x, src, copy, be.xp, want_id)


def _resolve_torch_negation(x: Any, copy: Optional[bool]) -> Any:
    """torch exports a neg-bit view's memory without the pending negation: resolve it first (a copy)."""
    is_neg = getattr(x, "is_neg", None)
    if is_neg is None or not callable(is_neg) or not is_neg():
        return x
    if copy is False:
        raise DLPackCopyError("this torch tensor is a lazily negated view; importing its values needs "
                              "resolve_neg(), a copy, which copy=False forbids")
    return x.resolve_neg()


def _target(src: Tuple[Any, int], device: Any, backend: Any) -> Tuple[Backend, Optional[int]]:
    """The backend to import into and the device id asked for (None: the current one)."""
    want_id = None
    if device is None:
        name = None
    elif isinstance(device, Backend):
        name = device.name
    elif isinstance(device, str):
        name = {"cpu": "numpy", "cuda": "cupy", "gpu": "cupy"}.get(device.lower(), device.lower())
    elif isinstance(device, tuple) and len(device) == 2:
        name, want_id = _backend_for_type(device[0]), int(device[1])
    else:
        name = _backend_for_type(device)
    if backend is not None:
        be = get_backend(backend)
        if name is not None and name != be.name:
            raise ValueError(f"from_dlpack: device={device!r} is not on backend {be.name!r}")
        return be, want_id
    if name is None:
        name = _backend_for_type(src[0])
    return get_backend(name), want_id


def _backend_for_type(device_type: Any) -> str:
    if device_type in _HOST_TYPES:
        return "numpy"
    if device_type in _CUDA_TYPES:
        return "cupy"
    raise BufferError(f"cgvm has no backend for DLPack device type {device_type!r}; "
                      "ask the producer for a host copy (device='cpu')")


def _import_host(x: Any, src: Tuple[Any, int], copy: Optional[bool]) -> np.ndarray:
    on_host = src[0] in _HOST_TYPES
    try:
        # NumPy is the consumer: it asks for max_version=(1, 0) (and dl_device=CPU for memory
        # elsewhere), retries the legacy signature on TypeError, checks the version field
        # (BufferError past 1.x, the capsule left to its deleter) and makes READ_ONLY and legacy
        # capsules non-writeable
        arr = np.from_dlpack(x, copy=copy) if on_host else np.from_dlpack(x, device="cpu", copy=copy)
    except TypeError:
        if copy is None or not on_host:
            raise
        # NumPy retries the legacy signature only when no copy= was asked for: retry it here
        arr = np.from_dlpack(_Exported(x.__dlpack__(), src))
        if copy:
            arr = arr.copy()
    except RuntimeError as exc:  # NumPy's word for a dtype it cannot hold; cgvm says BufferError
        dtype = _exported_dtype(x)
        if dtype is None or dtype[0] in _NUMPY_DTYPE_CODES:
            raise
        raise BufferError(f"the NumPy backend cannot hold DLPack dtype {_dtype_label(dtype)} "
                          f"(code {dtype[0]}, {dtype[1]} bits); convert it first, e.g. to float32") from exc
    return _without_negative_strides(arr, copy, np)


# DLDataType codes NumPy holds (int, uint, float, complex, bool) and the names of the others
_NUMPY_DTYPE_CODES = frozenset({0, 1, 2, 5, 6})
_DTYPE_NAMES = {3: "opaque handle", 4: "bfloat", 7: "float8_e3m4", 8: "float8_e4m3", 9: "float8_e4m3b11fnuz",
                10: "float8_e4m3fn", 11: "float8_e4m3fnuz", 12: "float8_e5m2", 13: "float8_e5m2fnuz",
                14: "float8_e8m0fnu", 15: "float6_e2m3fn", 16: "float6_e3m2fn", 17: "float4_e2m1fn"}


def _exported_dtype(x: Any) -> Optional[Tuple[int, int, int]]:
    """The DLPack dtype ``x`` exports as, to explain a failed import (None if it cannot be told)."""
    try:
        return capsule_info(_export(x, stream=None)).dtype
    except Exception:  # the import already failed; this only decides how to word that failure
        return None


def _dtype_label(dtype: Tuple[int, int, int]) -> str:
    code, bits, _ = dtype
    name = _DTYPE_NAMES.get(code, f"type code {code}")
    return name + str(bits) if code == 4 else name


def _without_negative_strides(arr: Any, copy: Optional[bool], xp: Any) -> Any:
    if arr.ndim and min(arr.strides) < 0:
        if copy is False:
            raise DLPackCopyError(f"the imported {arr.dtype}{list(arr.shape)} tensor has negative strides "
                                  f"{arr.strides}; cgvm copies them away (DLPack peers such as torch abort on "
                                  "them), which copy=False forbids")
        return xp.ascontiguousarray(arr)
    return arr


def _import_cupy(x: Any, src: Tuple[Any, int], copy: Optional[bool], cp: Any, want_id: Optional[int]) -> Any:
    if src[0] in _CUDA_TYPES:
        if want_id is not None and want_id != src[1]:
            raise BufferError(f"from_dlpack: the tensor is on CUDA device {src[1]}, not {want_id}; "
                              "cgvm does not copy between GPUs")
        with cp.cuda.Device(src[1]):
            # the consumer names its stream and the producer orders its work before it; DLPack
            # reserves 0 as ambiguous, so CuPy's null stream is passed as 1, the legacy default
            stream = cp.cuda.get_current_stream().ptr or 1
            # copy=True is not passed on: CuPy producers refuse same-device copies, so cgvm copies below
            capsule = _export(x, stream=stream)
            read_only = capsule_info(capsule).read_only
            arr = cp.from_dlpack(_Exported(capsule, src))
            if read_only and copy is False:
                raise DLPackCopyError("the tensor is read-only and CuPy arrays cannot be; importing it "
                                      "needs a copy, which copy=False forbids")
            if copy or read_only:
                arr = arr.copy()
            return _without_negative_strides(arr, copy, cp)
    if copy is False:
        raise DLPackCopyError(f"a {src[0]!r} tensor into the CuPy backend needs a host-to-device copy, "
                              "which copy=False forbids")
    host = _import_host(x, src, None)
    COUNTS.host_to_device(host.nbytes)
    if want_id is None:
        return cp.asarray(host)
    with cp.cuda.Device(want_id):
        return cp.asarray(host)


# ---------------------------------------------------------------------------------------- Tensor

def _is_cupy_array(x: Any) -> bool:
    cls = type(x)
    return cls.__name__ == "ndarray" and cls.__module__.partition(".")[0] == "cupy"


class Tensor:
    """A cgvm tensor: a handle on one backend array that exports through DLPack, with cgvm's guards.

    ``Workspace.tensor(name)`` gives one for a workspace entry; ``Tensor(x)`` wraps a NumPy or
    CuPy array as it is, imports any other DLPack producer with ``from_dlpack`` and anything else
    with ``numpy.asarray``. The handle keeps the array it was made with (see the module text on
    why an exported array stays valid).
    """

    __slots__ = ("_array", "name")

    def __init__(self, data: Any, *, name: Optional[str] = None):
        if isinstance(data, Tensor):
            data = data._array
        elif not isinstance(data, np.ndarray) and not _is_cupy_array(data):
            data = from_dlpack(data) if hasattr(data, "__dlpack__") else np.asarray(data)
        self._array = data
        self.name = name

    # -- what it holds ------------------------------------------------------------------------
    @property
    def array(self) -> Any:
        """The backing NumPy or CuPy array (no copy)."""
        return self._array

    @property
    def shape(self) -> Tuple[int, ...]:
        return self._array.shape

    @property
    def dtype(self) -> np.dtype:
        return self._array.dtype

    @property
    def ndim(self) -> int:
        return self._array.ndim

    @property
    def size(self) -> int:
        return self._array.size

    @property
    def device(self) -> Tuple[DLDeviceType, int]:
        return self.__dlpack_device__()

    def __len__(self) -> int:
        return len(self._array)

    def numpy(self) -> np.ndarray:
        """The data as a NumPy array: the backing array itself on the CPU, a host copy from CuPy."""
        arr = self._array
        if not _is_cupy_array(arr):
            return arr
        COUNTS.device_to_host(arr.nbytes)
        return arr.get()

    def __array__(self, dtype: Any = None, copy: Optional[bool] = None) -> np.ndarray:
        arr = self._array
        if not _is_cupy_array(arr):
            return np.array(arr, dtype=dtype, copy=copy)
        if copy is False:
            raise ValueError("a CuPy-backed cgvm.Tensor reaches NumPy only through a device-to-host copy")
        COUNTS.device_to_host(arr.nbytes)
        host = arr.get()
        return host if dtype is None else host.astype(dtype, copy=False)

    # -- DLPack ----------------------------------------------------------------------------------
    def __dlpack_device__(self) -> Tuple[DLDeviceType, int]:
        device_type, device_id = self._array.__dlpack_device__()
        return _device_type(device_type), int(device_id)

    def __dlpack__(self, *, stream: Any = None, max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None, copy: Optional[bool] = None) -> Any:
        """A DLPack capsule of the backing array (zero-copy unless a copy is asked for or needed).

        Negative strides are exported as a contiguous copy (IS_COPIED set on the versioned
        protocol), or BufferError under ``copy=False``. A non-writeable array exports READ_ONLY.
        """
        arr = self._array
        on_cpu = not _is_cupy_array(arr)
        if on_cpu and stream is not None:
            raise BufferError(f"stream must be None for a CPU tensor, got {stream!r}")
        if arr.ndim and min(arr.strides) < 0:
            if copy is False:
                raise BufferError(f"cannot export {arr.dtype}{list(arr.shape)} with negative strides {arr.strides} "
                                  "without a copy (DLPack consumers such as torch abort on them); pass copy=None")
            if on_cpu:
                copy = True  # NumPy's copy is a fresh buffer (positive strides) and sets IS_COPIED
            else:
                arr = _cupy().ascontiguousarray(arr)
        if copy and not on_cpu and (dl_device is None or int(dl_device[0]) != DLDeviceType.CPU):
            # CuPy copies on request only to the host: copy on the device and export the copy
            arr, copy = arr.copy(), None
        if on_cpu:  # keywords spelled out: a ``**dict`` call into NumPy costs more than the export
            return arr.__dlpack__(stream=None, max_version=max_version, dl_device=dl_device, copy=copy)
        keywords = {}  # only what was asked: older producers (CuPy < 13) know fewer keywords
        if stream is not None:
            keywords["stream"] = stream
        if max_version is not None:
            keywords["max_version"] = max_version
        if dl_device is not None:
            keywords["dl_device"] = dl_device
        if copy is not None:
            keywords["copy"] = copy
        return arr.__dlpack__(**keywords)

    def __repr__(self) -> str:
        device_type, device_id = self.__dlpack_device__()
        where = getattr(device_type, "name", device_type)
        label = f" {self.name!r}" if self.name else ""
        return f"<cgvm.Tensor{label} {self.dtype}{list(self.shape)} on {where}:{device_id}>"


def _cupy() -> Any:
    """CuPy, imported only once a CuPy array is at hand."""
    import cupy

    return cupy
