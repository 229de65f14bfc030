"""The BLAS thread pool the VM's kernels use (NumPy's OpenBLAS/MKL), sized so a shared machine is not oversubscribed.

BLAS libraries start one spinning thread per core. When other processes hold those cores,
each GEMM waits on descheduled threads: on a loaded 2-core machine a 32x128x128 product was
measured 50-500x slower with 2 threads than with 1. So the VM sizes the pool it uses once,
when the first program is loaded: ``$CGVM_NUM_THREADS`` if set, else the cores not already
busy, at least 1. Busy cores are read from the 1-minute load average and, where it says some
are busy, checked against a 50 ms sample of /proc/stat: the load average also counts tasks
waiting on I/O, which hold no core (on the project's machine it read 0.6-1.0 while /proc/stat
showed both cores idle). Only the BLAS that NumPy itself links is touched; other libraries in
the process (PyTorch's OpenMP pool) keep their settings.
"""
from __future__ import annotations

import os
import time
from typing import Optional, Tuple

_configured: Optional[int] = None


#: seconds of /proc/stat sampled when the load average says cores are busy
SAMPLE_S = 0.05


def sampled_busy_cores(seconds: float = SAMPLE_S) -> Optional[float]:
    """Cores busy over ``seconds`` by /proc/stat (time neither idle nor waiting on I/O), or None
    where there is no /proc/stat."""
    def read() -> Tuple[int, int, int]:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
        ticks = [int(v) for v in lines[0].split()[1:9]]   # user nice system idle iowait irq softirq steal
        cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
        return sum(ticks), ticks[3] + ticks[4], cpus
    try:
        total0, idle0, cpus = read()
        time.sleep(seconds)
        total1, idle1, _ = read()
    except (OSError, ValueError, IndexError):
        return None
    elapsed = total1 - total0
    return 0.0 if elapsed <= 0 else cpus * (elapsed - (idle1 - idle0)) / elapsed


def busy_cores() -> float:
    """Cores other processes keep busy: the 1-minute load average, or less where /proc/stat shows
    idle cores that the load average counts (tasks waiting on I/O)."""
    try:
        busy = os.getloadavg()[0]
    except OSError:
        return 0.0
    if busy >= 0.5:
        sampled = sampled_busy_cores()
        if sampled is not None:
            busy = min(busy, sampled)
    return busy


def default_num_threads() -> int:
    env = os.environ.get("CGVM_NUM_THREADS")
    if env:
        return max(1, int(env))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, int(cpus - busy_cores() + 0.5)))


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
