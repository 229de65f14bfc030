"""The BLAS thread pool the VM's kernels use (NumPy's OpenBLAS/MKL), sized so a shared machine is not oversubscribed.

BLAS libraries start one spinning thread per core. When other processes hold those cores,
each GEMM waits on descheduled threads: on a loaded 2-core machine a 32x128x128 product was
measured 50-500x slower with 2 threads than with 1. So the VM sizes the pool it uses once,
when the first program is loaded: ``$CGVM_NUM_THREADS`` if set, else the cores not already
busy (from the 1-minute load average), at least 1. Only the BLAS that NumPy itself links is
touched; other libraries in the process (PyTorch's OpenMP pool) keep their settings.
"""
from __future__ import annotations

import os
from typing import Optional

_configured: Optional[int] = None


def default_num_threads() -> int:
    env = os.environ.get("CGVM_NUM_THREADS")
    if env:
        return max(1, int(env))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        busy = os.getloadavg()[0]
    except OSError:
        busy = 0.0
    return max(1, min(cpus, int(cpus - busy + 0.5)))


def set_num_threads(n: Optional[int] = None) -> int:
    """Size NumPy's BLAS pool to ``n`` threads (default: see module doc). Returns the size used."""
    global _configured
    n = default_num_threads() if n is None else max(1, int(n))
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # without threadpoolctl the BLAS keeps its own default
        _configured = n
        return n
    import numpy as np

    numpy_dir = os.path.dirname(os.path.dirname(np.__file__))
    ctl = ThreadpoolController()
    for lib in ctl.lib_controllers:
        if lib.user_api == "blas" and lib.filepath.startswith(numpy_dir) and "torch" not in lib.filepath:
            lib.set_num_threads(n)
    _configured = n
    return n


def ensure_configured() -> None:
    """Size the pool once per process (called when the VM loads a program)."""
    if _configured is None:
        set_num_threads()


def num_threads() -> Optional[int]:
    return _configured
