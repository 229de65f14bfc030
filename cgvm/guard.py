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

import multiprocessing
import os
import pickle
import traceback
from typing import Any, Callable, Optional

from .errors import ConfigError, LoadError, LoadTimeout

TIMEOUT_VAR = "CGVM_READ_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0
_BYTES_PER_SECOND = 50e6


def read_timeout(path: Optional[str] = None) -> float:
    """Seconds a guarded read of ``path`` may take: $CGVM_READ_TIMEOUT (default 60) + its size / 50 MB/s."""
    raw = os.environ.get(TIMEOUT_VAR, "").strip()
    try:
        base = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ConfigError(f"{TIMEOUT_VAR}={raw!r} is not a number of seconds") from None
    if not base > 0:
        raise ConfigError(f"{TIMEOUT_VAR}={raw!r}: give a positive number of seconds")
    size = os.path.getsize(path) if path and os.path.isfile(path) else 0
    return base + size / _BYTES_PER_SECOND


def _child(conn: Any, fn: Callable[..., Any], args: tuple) -> None:
    try:
        result = ("ok", fn(*args))
    except BaseException as exc:  # everything goes back to the parent, which decides
        result = ("raised", exc, traceback.format_exc())
    try:
        conn.send_bytes(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as exc:   # an unpicklable exception: send its text
        conn.send_bytes(pickle.dumps(("raised", LoadError(f"{type(exc).__name__}: {exc}"), ""), protocol=4))
    finally:
        conn.close()


def call_with_deadline(fn: Callable[..., Any], *args: Any, what: str, path: Optional[str] = None,
                       timeout: Optional[float] = None) -> Any:
    """``fn(*args)`` in a forked child; its result, or its exception raised again, or LoadTimeout.

    ``what`` names the read in errors (``"reading HDF5 weights from w.h5"``); ``fn`` and its result
    must be picklable (module-level functions, arrays, plain containers).
    """
    try:
        context = multiprocessing.get_context("fork")
    except ValueError:   # no fork on this platform: run unguarded
        return fn(*args)
    limit = read_timeout(path) if timeout is None else timeout
    parent_conn, child_conn = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(child_conn, fn, args), daemon=True)
    process.start()
    child_conn.close()
    try:
        if not parent_conn.poll(limit):
            raise LoadTimeout(f"{what}: no answer after {limit:.0f} s (the file is probably corrupt; "
                              f"{TIMEOUT_VAR} sets the limit)")
        try:
            payload = parent_conn.recv_bytes()
        except EOFError:
            process.join(5)
            raise LoadError(f"{what}: the reader died (exit code {process.exitcode}); the file is probably "
                            "corrupt") from None
    finally:
        parent_conn.close()
        if process.is_alive():
            process.kill()
        process.join(5)
    result = pickle.loads(payload)
    if result[0] == "ok":
        return result[1]
    raise result[1]
