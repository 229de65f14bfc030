"""Compiled CPU kernels: a few op kernels written once more as explicit Numba loops.

Some kernels are bound by what NumPy pays per strided run rather than by arithmetic: im2col and
col2im copy runs of one output row (5 to 26 elements for small images), and max pooling's
gradient needs several elementwise passes over strided window views to route each window's
gradient to its first maximum. A loop compiled by Numba does each in one pass. The NumPy
kernels stay the reference and the fallback: these run only

* with numba installed (the ``jit`` extra), CGVM_JIT not off, on the NumPy backend;
* once hot: a kernel compiles after ``CGVM_JIT_HOT`` calls (the switches and their defaults are
  cgvm.ops.kernels.scan_jit's), so programs that call a kernel a few times never pay the ~1 s;
* for the dtypes in ``NATIVE_DTYPES``; a kernel that fails to compile stays NumPy for good.

``NativeKernel.run(xp, *args)`` runs the compiled form when it may and says whether it did (else
the caller runs the NumPy kernel; ``ready`` and ``call`` are its two halves); the functions it wraps are ordinary Python, which the tests
also run uncompiled against the NumPy kernels. Compiled code is cached on disk by Numba (``cache=True``), so later processes load it.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Callable, Optional

import numpy as np

from . import scan_jit

#: dtypes the compiled kernels take; others (float16, integers) stay NumPy
NATIVE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class NativeKernel:
    """A Python loop function compiled by Numba once hot (see the module doc)."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self.calls = 0
        self.compiled: Optional[Callable[..., Any]] = None
        self.failed = False
        self._lock = threading.Lock()

    def ready(self, xp: Any, *arrays: Any) -> bool:
        """Whether the compiled form may run on ``arrays`` now (see the module doc); counts one
        call while the kernel is not yet hot, and compiles it once it is."""
        if self.failed or xp is not np or any(isinstance(a, np.ndarray) and a.dtype not in NATIVE_DTYPES
                                               for a in arrays):
            return False
        hot = scan_jit.hot_threshold()     # read at each call, as the scan tier does: CGVM_JIT may change
        if hot is None:
            return False
        if self.compiled is None:
            self.calls += 1
            if self.calls <= hot:
                return False
            with self._lock:
                if self.compiled is None and not self.failed:
                    import numba   # only here: importing numba costs ~0.5 s, paid by hot kernels alone
                    self.compiled = numba.njit(cache=True, nogil=True, error_model="numpy")(self.fn)
        return True

    def call(self, *args: Any) -> bool:
        """Run the compiled form (after ready()); False when Numba cannot compile it for these
        arguments: the kernel then stays NumPy for good."""
        try:
            self.compiled(*args)
        except Exception as exc:
            from numba.core.errors import NumbaError
            if not isinstance(exc, NumbaError):
                raise
            warnings.warn(f"cgvm: compiled kernel {self.fn.__name__} unavailable ({exc}); using the NumPy kernel",
                          RuntimeWarning)
            self.failed = True
            return False
        return True

    def run(self, xp: Any, *args: Any) -> bool:
        """ready() and call(): whether the compiled form ran on ``args`` (else use the NumPy kernel)."""
        return self.ready(xp, *args) and self.call(*args)


def native(fn: Callable[..., Any]) -> NativeKernel:
    """Decorator: ``fn`` (explicit loops over NumPy arrays, results written into its arguments)
    as a NativeKernel."""
    return NativeKernel(fn)
