"""The NumPy backend (CPU)."""
from __future__ import annotations

from typing import Any

import numpy as np

from .base import Backend
from .transfer import COUNTS


class NumpyBackend(Backend):
    name = "numpy"
    xp = np

    def asarray(self, x: Any, dtype: Any = None) -> np.ndarray:
        if isinstance(x, np.ndarray):
            return x if dtype is None or x.dtype == dtype else x.astype(dtype)
        if hasattr(x, "__dlpack__") and not isinstance(x, np.generic):
            try:
                arr = np.from_dlpack(x)
            except (BufferError, TypeError, RuntimeError):
                arr = np.asarray(x)
            return arr if dtype is None or arr.dtype == dtype else arr.astype(dtype)
        return np.asarray(x, dtype=dtype)

    def to_numpy(self, x: Any) -> np.ndarray:
        COUNTS.host_read()   # no copy here; counted so CPU tests check what a GPU step must not do
        return np.asarray(x)
