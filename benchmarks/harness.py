"""Timing harness: peers measured interleaved in one run, medians compared as ratios."""
from __future__ import annotations

import ctypes
import gc
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional


@dataclass
class Row:
    """One benchmark: the same work done by several implementations."""

    name: str
    unit: str = "us"
    impls: Dict[str, Callable[[], object]] = field(default_factory=dict)
    number: int = 100          # calls per timed batch
    rounds: int = 7            # interleaved batches per implementation
    note: str = ""
    results: Dict[str, float] = field(default_factory=dict)  # seconds per call (median)
    fixed: Dict[str, float] = field(default_factory=dict)    # values measured another way (compile times)

    def add(self, name: str, fn: Optional[Callable[[], object]]) -> None:
        if fn is not None:
            self.impls[name] = fn


#: seconds to pause between implementations when BLAS runs several threads: OpenBLAS and OpenMP
#: workers spin for up to ~0.1 s after a call, and a library that ran just before would otherwise
#: hold a core the next one's threads need (cgvm's MLP step measured 3.5 ms alone, 6.7 ms right
#: after PyTensor's, on 2 cores with 2 threads)
SETTLE_S = 0.2


#: glibc mallopt parameters: M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: allocations up to this size come from the heap, not from fresh mmap'd pages
STEADY_MMAP_BYTES = 64 << 20


def steady_allocator() -> bool:
    """Make every peer's large temporaries come from reused heap memory (glibc only; True if set).

    glibc serves an allocation above its mmap threshold (128 KiB at start) with fresh pages, which
    the kernel zero-fills on first touch, and raises the threshold only after such a block is
    freed. So a library whose step allocates megabytes (PyTorch's autograd does, cgvm's planned
    buffers do not) runs at two speeds in one process: its Keras-CNN step measured 13-14 ms with
    2,800 page faults a step, 9.5 ms with 55 once the threshold had risen, and which one a row
    got depended on what ran before it. Fixing the thresholds up front gives every peer the fast
    steady state from the first call."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, STEADY_MMAP_BYTES)) and \
            bool(libc.mallopt(_M_TRIM_THRESHOLD, 4 * STEADY_MMAP_BYTES))
    except (OSError, AttributeError):
        return False


#: cgvm's warm-up goes on past its first calls until its compiled tiers are hot, or for this long
WARM_UP_S = 10.0


def warm_up(fn: Callable[[], object], calls: int, tiered: bool = False) -> None:
    """Compile caches, memory plans, BLAS threads: ``calls`` calls; for cgvm (``tiered``) more, until
    its compiled kernels and loops have compiled (CGVM_JIT_HOT calls, cgvm.ops.kernels.scan_jit) or
    WARM_UP_S has passed, so that no timed batch holds a compilation, or the NumPy kernels that
    run before one."""
    from cgvm.ops.kernels.scan_jit import hot_threshold

    hot = hot_threshold() if tiered else None
    start = time.perf_counter()
    for done in range(max(calls, 0 if hot is None else hot + 2)):
        if done >= calls and time.perf_counter() - start > WARM_UP_S:
            break
        fn()


def measure(row: Row) -> Row:
    from cgvm.backend.threads import num_threads

    for name, fn in row.impls.items():
        warm_up(fn, min(3, row.number), tiered=name == "cgvm")
    settle = SETTLE_S if (num_threads() or 1) > 1 and len(row.impls) > 1 else 0.0
    samples: Dict[str, List[float]] = {k: [] for k in row.impls}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(row.rounds):
            for name, fn in row.impls.items():
                if settle:
                    time.sleep(settle)
                n = row.number
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                samples[name].append((time.perf_counter() - t0) / n)
    finally:
        if gc_was:
            gc.enable()
    row.results = {k: statistics.median(v) for k, v in samples.items()}
    row.results.update(row.fixed)
    return row


def fmt_time(sec: float) -> str:
    if sec < 1e-3:
        return f"{sec * 1e6:.2f} us"
    if sec < 1:
        return f"{sec * 1e3:.2f} ms"
    return f"{sec:.2f} s"


def table(rows: List[Row], base: str = "cgvm") -> str:
    peers: List[str] = []
    for r in rows:
        for k in r.results:
            if k != base and k not in peers:
                peers.append(k)
    head = ["benchmark", base] + peers + [f"{base}/{p}" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.name, fmt_time(r.results[base]) if base in r.results else "-"]
        cells += [fmt_time(r.results[p]) if p in r.results else "-" for p in peers]
        for p in peers:
            if base in r.results and p in r.results and r.results[p] > 0:
                cells.append(f"{r.results[base] / r.results[p]:.2f}x")
            else:
                cells.append("-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def machine() -> str:
    import numpy as np

    from cgvm.backend.threads import num_threads

    bits = [platform.platform(), f"Python {platform.python_version()}", f"NumPy {np.__version__}",
            f"{os.cpu_count()} CPUs", f"threads {num_threads()} (every BLAS, torch)",
            f"load average {os.getloadavg()[0]:.1f}"]
    for mod in ("torch", "pytensor"):
        try:
            m = __import__(mod)
            bits.append(f"{mod} {m.__version__}")
        except ImportError:
            pass
    return ", ".join(bits)
