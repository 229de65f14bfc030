"""Limits a Keras file is checked against before anything it claims is allocated or parsed deeply.

- ``max_bytes()``: the most memory one load may allocate for weights (``CGVM_MAX_BYTES``, bytes,
  with an optional K/M/G/T suffix; default half the machine's memory). ``budget`` counts what the
  layers built while loading one file ask for, so a config with ``units = 10**12`` is refused with
  the bytes it needs before NumPy is asked for them.
- ``hdf5_timeout(size)``: how long the HDF5 worker may take (``CGVM_HDF5_TIMEOUT`` seconds; default
  5 s plus 1 s per 50 MB of file: libhdf5 reads a small file
  in milliseconds).
- ``parse_json(text, what)``: ``json.loads`` with the nesting depth checked first (deep nesting
  would exhaust Python's stack) and every failure a ``KerasConfigError`` naming ``what``.

``CGVM_MAX_BYTES`` is meant to be the one byte limit of every cgvm loader (the Caffe frontend's too).
"""
from __future__ import annotations

import json
import math
import os
import re
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, Sequence

import numpy as np

from .serialization import KerasConfigError

#: how deep JSON objects and lists may nest in a model config (Keras' own nest about 15 deep)
MAX_JSON_DEPTH = 100

_SUFFIXES = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}


def max_bytes() -> int:
    """The byte limit for one load (``CGVM_MAX_BYTES``; default half the physical memory)."""
    raw = os.environ.get("CGVM_MAX_BYTES", "").strip()
    if raw:
        m = re.fullmatch(r"(\d+)\s*([KMGT]?)i?B?", raw, re.IGNORECASE)
        if not m:
            raise KerasConfigError(f"CGVM_MAX_BYTES={raw!r} is not a byte count (e.g. 4000000000 or 4G)")
        return int(m.group(1)) * _SUFFIXES[m.group(2).upper()]
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 8 * 2 ** 30


def hdf5_timeout(file_bytes: int) -> float:
    raw = os.environ.get("CGVM_HDF5_TIMEOUT", "").strip()
    if raw:
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value > 0 or not math.isfinite(value):
            raise KerasConfigError(f"CGVM_HDF5_TIMEOUT={raw!r} is not a positive number of seconds")
        return value
    return 5.0 + file_bytes / 50e6


_budget: List[Optional[List[int]]] = [None]  # [used bytes, limit] while a file loads


@contextmanager
def budget() -> Iterator[None]:
    """Count the weight bytes allocated inside against ``max_bytes()`` (nested: the outer one counts)."""
    if _budget[0] is not None:
        yield
        return
    _budget[0] = [0, max_bytes()]
    try:
        yield
    finally:
        _budget[0] = None


def reserve(shape: Sequence[Any], dtype: Any, what: str) -> None:
    """Refuse, before allocating, an array of ``shape`` that is malformed or does not fit the limit."""
    dims = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise KerasConfigError(f"{what}: shape {tuple(shape)!r} holds {d!r}, not a size")
        if d < 0:
            raise KerasConfigError(f"{what}: shape {tuple(shape)} has a negative size")
        dims.append(int(d))
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:
        itemsize = 8
    nbytes = math.prod(dims) * itemsize
    state = _budget[0]
    limit = state[1] if state is not None else max_bytes()
    used = (state[0] if state is not None else 0) + nbytes
    if used > limit:
        raise KerasConfigError(f"{what}: shape {tuple(dims)} needs {_size(nbytes)}"
                               + (f" ({_size(used)} with the weights before it)" if used != nbytes else "")
                               + f", more than the limit of {_size(limit)} (set CGVM_MAX_BYTES to change it)")
    if state is not None:
        state[0] = used


def _size(n: int) -> str:
    for unit, scale in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} ({n} bytes)"
    return f"{n} bytes"


def _depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` in JSON ``text`` (brackets inside strings not counted)."""
    stripped = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    b = np.frombuffer(stripped.encode("utf-8", "replace"), np.uint8)
    steps = ((b == ord("[")) | (b == ord("{"))).astype(np.int64) - ((b == ord("]")) | (b == ord("}")))
    return int(np.cumsum(steps).max()) if steps.size else 0


def parse_json(text: Any, what: str) -> Any:
    """``text`` (str or UTF-8 bytes) parsed; ``what`` ("model.keras: config.json") names it in errors."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise KerasConfigError(f"{what} is not UTF-8 text: {exc}") from exc
    if not isinstance(text, str):
        raise KerasConfigError(f"{what}: expected JSON text, got {type(text).__name__}")
    depth = _depth(text)
    if depth > MAX_JSON_DEPTH:
        raise KerasConfigError(f"{what}: JSON nested {depth} deep, more than the {MAX_JSON_DEPTH} a model "
                               "config may use (a corrupt or hostile file)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise KerasConfigError(f"{what} is not valid JSON: {exc}") from exc
    except (RecursionError, ValueError) as exc:
        raise KerasConfigError(f"{what} cannot be parsed as JSON: {exc}") from exc
