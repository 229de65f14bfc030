"""The Backend protocol: an array module plus the few things the VM needs beyond it.

Device code that kernels call lives in this package too (kernels are written once against
``xp``; where NumPy and CuPy need different code, it is here): ``scatter_add``, the BLAS
binding (cgvm.backend.blas) and CUDA code generation (cgvm.backend.cuda_elementwise).
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any, Dict, Optional

import numpy as np


class Backend(ABC):
    """An array module (``xp``) and its device. Kernels are written once against ``xp``."""

    name: str = "abstract"
    xp: Any = None

    @abstractmethod
    def asarray(self, x: Any, dtype: Any = None) -> Any:
        """An array of this backend for ``x`` (DLPack producers without a copy where possible)."""

    @abstractmethod
    def to_numpy(self, x: Any) -> Any:
        """A NumPy array with the same contents (a copy off the device)."""

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on the CPU)."""

    def plan_buffers(self, sizes: Any) -> Optional[list]:
        """The buffers of a memory plan (``sizes`` in bytes) as uint8 arrays, or None: the VM then
        allocates each on its own (the CPU's way). CuPy takes one arena (cgvm.backend.transfer)."""
        return None

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


_BACKENDS: Dict[str, Backend] = {}


def host_array(x: Any) -> np.ndarray:
    """``x`` as a NumPy array, copied off the device when it lives on one (a CuPy array), else as is.
    Counted in cgvm.backend.transfer.COUNTS (a device-to-host copy, or a host read)."""
    from .transfer import COUNTS

    COUNTS.host_read()
    if hasattr(x, "get") and hasattr(x, "__cuda_array_interface__"):
        COUNTS.device_to_host(x.nbytes)
        return np.asarray(x.get())
    return np.asarray(x.get() if hasattr(x, "get") else x)


def scatter_add(xp: Any, target: Any, index: Any, values: Any) -> None:
    """``target[index] += values`` where repeated indices accumulate (NumPy and CuPy alike)."""
    if hasattr(xp, "add") and hasattr(xp.add, "at"):
        xp.add.at(target, index, values)
    else:
        import cupyx  # only array modules without ufunc.at (CuPy) get here

        cupyx.scatter_add(target, index, values)


_REDUCE_UFUNCS = {"add": "add", "mul": "multiply", "max": "maximum", "min": "minimum"}


def scatter_reduce(xp: Any, target: Any, index: Any, values: Any, reduction: str) -> None:
    """``target[index] (reduction)= values`` where repeated indices combine (add, mul, max, min)."""
    ufunc = getattr(xp, _REDUCE_UFUNCS[reduction])
    if hasattr(ufunc, "at"):
        ufunc.at(target, index, values)
        return
    import cupyx  # only array modules without ufunc.at (CuPy) get here

    device_scatter = {"add": cupyx.scatter_add, "max": cupyx.scatter_max, "min": cupyx.scatter_min}.get(reduction)
    if device_scatter is not None:
        device_scatter(target, index, values)
        return
    # CuPy has no scatter-multiply: combine on the host (index arrays and values are copied there)
    host = host_array(target)
    np.multiply.at(host, tuple(host_array(i) for i in index) if isinstance(index, tuple) else host_array(index),
                   host_array(values))
    target[...] = xp.asarray(host)


def get_backend(name: Optional[str] = None) -> Backend:
    """The backend named ``name``, else ``$CGVM_BACKEND``, else NumPy. CuPy is imported lazily."""
    if isinstance(name, Backend):
        return name
    from_env = not name and bool((os.environ.get("CGVM_BACKEND") or "").strip())
    name = (name or os.environ.get("CGVM_BACKEND", "").strip() or "numpy").lower()
    hit = _BACKENDS.get(name)
    if hit is not None:
        return hit
    if name in ("numpy", "cpu"):
        from .numpy import NumpyBackend

        hit = NumpyBackend()
    elif name in ("cupy", "gpu", "cuda"):
        from .cupy import CupyBackend

        hit = CupyBackend()
    else:
        from ..errors import BackendUnavailable

        where = " (from the environment variable CGVM_BACKEND)" if from_env else ""
        raise BackendUnavailable(f"unknown backend {name!r}{where}; use 'numpy' or 'cupy'")
    _BACKENDS[name] = hit
    return hit


def available_backends() -> list:
    """Names of the backends that can run here (cupy only with a visible GPU)."""
    names = ["numpy"]
    try:
        get_backend("cupy")
        names.append("cupy")
    except Exception:  # any failure to import cupy or find a device means: not available
        pass
    return names
