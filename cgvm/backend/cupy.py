"""The CuPy backend (NVIDIA GPUs). Imported only when asked for.

Transfers: host arrays come in through pinned staging buffers, one asynchronous copy each on
the current stream (cgvm.backend.transfer.PinnedStaging); arrays on the device stay there
(CuPy arrays as they are, CUDA DLPack producers such as torch.cuda tensors without a copy);
``to_numpy`` is the one way back, and every copy either way is counted (transfer.COUNTS).
Memory plans are one arena from CuPy's memory pool (``plan_buffers``). The device is CuPy's
current one: ``cgvm ... --gpu N`` and ``caffe.set_device(N)`` make device N current.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ..errors import BackendUnavailable
from .base import Backend
from .transfer import COUNTS, PinnedStaging, arena_buffers

#: the install commands, named in every error about a missing CuPy or CUDA
INSTALL_HINT = ("pip install 'cgvm[gpu]' (CuPy for a CUDA 12 driver, the same as 'cgvm[gpu-cuda12]'), or "
                "pip install 'cgvm[gpu-cuda13]' for a CUDA 13 driver (nvidia-smi shows the driver's CUDA version)")
#: DLPack device types whose memory CuPy can take without a copy (kDLCUDA, kDLCUDAManaged)
_CUDA_DLPACK_TYPES = (2, 13)


class CupyBackend(Backend):
    name = "cupy"

    def __init__(self) -> None:
        try:
            import cupy
        except ImportError as exc:
            raise BackendUnavailable(f"the cupy backend needs CuPy: {INSTALL_HINT} ({exc})") from None
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # CUDA driver missing or broken, or a CuPy build for another CUDA
            raise BackendUnavailable(f"CuPy is installed but no CUDA device is usable ({exc}); check "
                                     f"nvidia-smi, and that the CuPy build matches the driver: {INSTALL_HINT}") from None
        if n == 0:
            raise BackendUnavailable("CuPy is installed but this machine has no CUDA device")
        self.xp = cupy
        self._staging: Optional[PinnedStaging] = None

    def _stager(self) -> PinnedStaging:
        if self._staging is None:
            import cupyx

            cp = self.xp
            self._staging = PinnedStaging(
                cp, lambda nbytes: cupyx.empty_pinned((nbytes,), dtype="uint8"), cp.cuda.Event,
                lambda device, host: device.set(host, stream=cp.cuda.get_current_stream()))
        return self._staging

    def asarray(self, x: Any, dtype: Any = None) -> Any:
        cp = self.xp
        if isinstance(x, cp.ndarray):
            return x if dtype is None or x.dtype == dtype else x.astype(dtype)
        if (hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__")
                and x.__dlpack_device__()[0] in _CUDA_DLPACK_TYPES):
            arr = cp.from_dlpack(x)
        elif hasattr(x, "__cuda_array_interface__"):
            arr = cp.asarray(x)          # another library's device array: no copy
        else:
            import numpy as np

            host = np.asarray(x)
            if dtype is not None and host.dtype != dtype:
                host = host.astype(dtype)   # convert on the host: one copy of the final dtype
            if host.dtype.kind in "biufc" and host.ndim:
                arr = self._stager().to_device(host)
            else:
                COUNTS.host_to_device(host.nbytes)
                arr = cp.asarray(host)
        return arr if dtype is None or arr.dtype == dtype else arr.astype(dtype)

    def to_numpy(self, x: Any) -> Any:
        COUNTS.host_read()
        if isinstance(x, self.xp.ndarray):
            COUNTS.device_to_host(x.nbytes)
        return self.xp.asnumpy(x)

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()

    def plan_buffers(self, sizes: Sequence[int]) -> list:
        """The plan's buffers as aligned slices of one block from CuPy's memory pool."""
        _, buffers = arena_buffers(self.xp, sizes)
        return buffers

    def device_id(self) -> int:
        return int(self.xp.cuda.Device().id)


def use_device(device_id: int, where: str) -> None:
    """Make CUDA device ``device_id`` CuPy's current one, or a BackendUnavailable naming ``where``
    (the flag or call that asked) and the ids this machine has."""
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if not 0 <= int(device_id) < count:
        raise BackendUnavailable(f"{where}: there is no CUDA device {device_id}; this machine has {count} "
                                 f"(ids 0 to {count - 1})")
    cupy.cuda.Device(int(device_id)).use()
