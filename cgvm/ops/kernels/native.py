"""Compiled CPU kernels: op kernels written once more as explicit loops that Numba compiles.

Some kernels are bound by what NumPy pays per strided pass rather than by arithmetic: max
pooling's gradient takes eight elementwise passes over strided window views to route each
window's gradient to its first maximum, where one compiled loop does it in one
(cgvm.ops.kernels.pool_native); the batch-last convolution's col2im adds nine strided blocks
where one loop adds each destination row's terms while it is in cache (conv_batchlast). The
NumPy kernels stay the reference and the fallback; the compiled form runs only

* with numba installed (the ``jit`` extra), CGVM_JIT not off, on the NumPy backend;
* once hot: a kernel compiles after ``CGVM_JIT_HOT`` calls (the switches and their defaults are
  cgvm.ops.kernels.scan_jit's), so programs that call a kernel a few times never pay the ~1 s;
* for the dtypes in ``NATIVE_DTYPES``; a kernel Numba cannot compile stays NumPy for good.

``NativeKernel.run(xp, *args)`` runs the compiled form when it may and says whether it did; on
False the caller runs its NumPy kernel. Numba caches the machine code on disk (``cache=True``),
so later processes load it instead of compiling.
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

    def run(self, xp: Any, *args: Any) -> bool:
        """Run the compiled form on ``args`` (results written into them) when it may run now, and
        say whether it did. Counts one call while the kernel is not yet hot; compiles it once it is."""
        if self.failed or xp is not np or any(isinstance(a, np.ndarray) and a.dtype not in NATIVE_DTYPES
                                               for a in args):
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
                    try:
                        self.compiled = numba.njit(cache=True, nogil=True, error_model="numpy")(self.fn)
                    except RuntimeError:   # no writable cache directory: compile in memory
                        self.compiled = numba.njit(nogil=True, error_model="numpy")(self.fn)
        try:
            self.compiled(*args)
        except Exception as exc:
            from numba.core.errors import NumbaError
            if not isinstance(exc, NumbaError):
                raise
            # Numba compiles at the first call of a signature, before running: nothing was written
            warnings.warn(f"cgvm: compiled kernel {self.fn.__name__} unavailable ({exc}); using the NumPy kernel",
                          RuntimeWarning)
            self.failed = True
            return False
        return True


def native(fn: Callable[..., Any]) -> NativeKernel:
    """Decorator: ``fn`` (explicit loops over NumPy arrays, results written into its arguments)
    as a NativeKernel."""
    return NativeKernel(fn)
