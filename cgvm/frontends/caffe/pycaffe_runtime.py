"""pycaffe's process-level helpers: ``Timer`` and ``init_log``/``log`` (the multi-process ones,
``solver_count``, ``has_nccl``, ``NCCL``..., are in data_shard.py and solver_parallel.py).

``Timer`` measures wall time in milliseconds (``start``/``stop``, ``ms``, ``seconds``).
``init_log(level=0, stderr=False)`` sets up the log as glog does (level 0 INFO, 1 WARNING,
2 ERROR, 3 FATAL: lines below the level are dropped); ``log(message)`` writes one INFO line in
glog's format to stderr.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Optional, TextIO

__all__ = ["Timer", "init_log", "log"]


class Timer:
    """Wall-clock timer: ``t = Timer(); t.start(); ...; t.stop(); t.ms``."""

    def __init__(self) -> None:
        self._began: Optional[float] = None
        self._elapsed = 0.0

    def start(self) -> None:
        self._began = time.perf_counter()

    def stop(self) -> None:
        if self._began is not None:
            self._elapsed = time.perf_counter() - self._began
            self._began = None

    @property
    def ms(self) -> float:
        """Milliseconds between the last start and stop (up to now while running)."""
        if self._began is not None:
            return (time.perf_counter() - self._began) * 1e3
        return self._elapsed * 1e3

    @property
    def seconds(self) -> float:
        return self.ms / 1e3


_LEVELS = "IWEF"   # glog severities 0..3
_log_state = {"level": 0, "stream": None}


def init_log(level: int = 0, stderr: bool = False) -> None:
    """Start logging at glog severity ``level`` (0 INFO .. 3 FATAL); lines go to stderr."""
    level = int(level)
    if not 0 <= level <= 3:
        raise ValueError(f"init_log: level must be 0 (INFO) to 3 (FATAL), got {level}")
    _log_state["level"] = level
    _log_state["stream"] = sys.stderr


def log(message: str, severity: int = 0) -> None:
    """Write one glog-formatted line (``I1202 03:04:05.678901  1234 pycaffe] message``)."""
    if severity < _log_state["level"]:
        return
    stream: TextIO = _log_state["stream"] or sys.stderr
    now = time.time()
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(now)) + f".{int((now % 1) * 1e6):06d}"
    stream.write(f"{_LEVELS[severity]}{stamp} {threading.get_native_id():>6} pycaffe] {message}\n")
    stream.flush()
