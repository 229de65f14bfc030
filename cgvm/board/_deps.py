"""The one place that imports the ``tensorboard`` package, with an install hint where it is missing."""
from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import CgvmError

INSTALL_HINT = "install it with `pip install 'cgvm[board]'` (or `pip install tensorboard`)"


class TensorBoardUnavailable(CgvmError):
    """The ``tensorboard`` package (cgvm's ``board`` extra) is not installed."""


def tb(module: str) -> ModuleType:
    """``tensorboard.<module>``, or TensorBoardUnavailable saying how to install it."""
    try:
        return importlib.import_module(f"tensorboard.{module}")
    except ImportError as exc:
        raise TensorBoardUnavailable(f"writing TensorBoard logs needs the tensorboard package ({exc}); "
                                     f"{INSTALL_HINT}") from None
