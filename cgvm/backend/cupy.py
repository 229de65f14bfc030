"""The CuPy backend (NVIDIA GPUs). Imported only when asked for."""
from __future__ import annotations

from typing import Any

from ..errors import BackendUnavailable
from .base import Backend


class CupyBackend(Backend):
    name = "cupy"

    def __init__(self) -> None:
        try:
            import cupy
        except ImportError as exc:
            raise BackendUnavailable("the cupy backend needs CuPy: pip install 'cgvm[gpu]' "
                                     f"(cupy-cuda12x or cupy-cuda13x to match your driver): {exc}") from None
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # CUDA driver missing or broken
            raise BackendUnavailable(f"CuPy is installed but no CUDA device is usable: {exc}") from None
        if n == 0:
            raise BackendUnavailable("CuPy is installed but this machine has no CUDA device")
        self.xp = cupy

    def asarray(self, x: Any, dtype: Any = None) -> Any:
        cp = self.xp
        if isinstance(x, cp.ndarray):
            return x if dtype is None or x.dtype == dtype else x.astype(dtype)
        if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__") and x.__dlpack_device__()[0] == 2:
            arr = cp.from_dlpack(x)
        else:
            arr = cp.asarray(x)
        return arr if dtype is None or arr.dtype == dtype else arr.astype(dtype)

    def to_numpy(self, x: Any) -> Any:
        return self.xp.asnumpy(x)

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()
