"""Library reads that may never return, run where they can be stopped.

Some corrupt HDF5 files send libhdf5 into a loop that never returns (and holds h5py's lock, so a
thread cannot help). ``call_with_deadline`` runs such a read in a forked child process and
returns its (pickled) result; a child that does not answer in time is killed and the caller
gets :class:`~cgvm.errors.LoadTimeout`, one that dies gets :class:`~cgvm.errors.LoadError`, and
an exception the child raises is raised again here. Where ``fork`` does not exist (Windows) the
read runs in this process, unguarded.

The deadline is ``CGVM_READ_TIMEOUT`` seconds (default 60) plus one second per 50 MB of the file.
"""
from __future__ import annotations

import os
import pickle
import select
import signal
import time
from typing import Any, Callable, Optional

from .errors import ConfigError, LoadError, LoadTimeout

TIMEOUT_VAR = "CGVM_READ_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
_BYTES_PER_SECOND = 50e6


def read_timeout(path: Optional[str] = None, size: Optional[int] = None) -> float:
    """Seconds a guarded read of ``path`` (or of ``size`` bytes) may take: $CGVM_READ_TIMEOUT
    (default 60) + the size / 50 MB/s. Every guarded read of cgvm (Caffe's HDF5 weights and
    solver states, the Keras HDF5 worker) takes its deadline from here."""
    raw = os.environ.get(TIMEOUT_VAR, "").strip()
    try:
        base = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ConfigError(f"{TIMEOUT_VAR}={raw!r} is not a number of seconds") from None
    if not base > 0:
        raise ConfigError(f"{TIMEOUT_VAR}={raw!r}: give a positive number of seconds")
    if size is None:
        size = os.path.getsize(path) if path and os.path.isfile(path) else 0
    return base + size / _BYTES_PER_SECOND


def _run_child(write_fd: int, fn: Callable[..., Any], args: tuple) -> None:
    """In the forked child: run, send the pickled outcome, and leave without running any cleanup."""
    try:
        try:
            result = ("ok", fn(*args))
        except BaseException as exc:  # everything goes back to the parent, which decides
            result = ("raised", exc)
        try:
            payload = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:   # an unpicklable result or exception: send its text
            payload = pickle.dumps(("raised", LoadError(f"{type(exc).__name__}: {exc}")))
        view = memoryview(payload)
        while view:
            view = view[os.write(write_fd, view):]
    finally:
        os._exit(0)


def call_with_deadline(fn: Callable[..., Any], *args: Any, what: str, path: Optional[str] = None,
                       timeout: Optional[float] = None) -> Any:
    """``fn(*args)`` in a forked child; its result, or its exception raised again, or LoadTimeout.

    ``what`` names the read in errors (``"reading HDF5 weights from w.h5"``); ``fn``'s result and
    exceptions must be picklable (arrays, plain containers, cgvm errors).
    """
    if not hasattr(os, "fork"):   # no fork on this platform: run unguarded
        return fn(*args)
    limit = read_timeout(path) if timeout is None else timeout
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _run_child(write_fd, fn, args)
    os.close(write_fd)
    chunks = []
    deadline = time.monotonic() + limit
    try:
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([read_fd], [], [], max(left, 0))
            if not ready:
                raise LoadTimeout(f"{what}: no answer after {limit:.0f} s (the file is probably corrupt; "
                                  f"{TIMEOUT_VAR} sets the limit)")
            chunk = os.read(read_fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_fd)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
    if not chunks:
        raise LoadError(f"{what}: the reader died ({_describe(status)}); the file is probably corrupt")
    result = pickle.loads(b"".join(chunks))
    if result[0] == "ok":
        return result[1]
    raise result[1]


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit code {os.WEXITSTATUS(status) if os.WIFEXITED(status) else status}"
