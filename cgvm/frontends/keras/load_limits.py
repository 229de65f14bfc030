"""Limits a Keras file is checked against before anything it claims is allocated or parsed deeply.

- ``max_bytes()``: the most memory one load may allocate for weights (``CGVM_MAX_BYTES``, bytes,
  with an optional K/M/G/T suffix; default half the machine's memory). ``budget`` counts what the
  layers built while loading one file ask for, so a config with ``units = 10**12`` is refused with
  the bytes it needs before NumPy is asked for them.
- ``hdf5_timeout(size)``: how long the HDF5 worker may take (``CGVM_READ_TIMEOUT``, cgvm.guard's one
  read deadline: 60 s by default plus 1 s per 50 MB of file).
- ``parse_json(text, what)``: ``json.loads`` with the nesting depth checked first (deep nesting
  would exhaust Python's stack) and every failure a ``KerasConfigError`` naming ``what``.

Both limits are cgvm's own (cgvm.env, cgvm.guard), shared with the Caffe frontend's loaders.
"""
from __future__ import annotations

import json
import math
import re
from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, Sequence

import numpy as np

from cgvm import env
from cgvm.errors import ConfigError
from cgvm.guard import read_timeout

from .serialization import KerasConfigError

#: how deep JSON objects and lists may nest in a model config (Keras' own nest about 15 deep)
MAX_JSON_DEPTH = 100

def max_bytes() -> int:
    """The byte limit for one load: cgvm's one limit (``CGVM_MAX_BYTES``, see cgvm.env)."""
    try:
        return env.max_bytes()
    except ConfigError as exc:
        raise KerasConfigError(str(exc)) from exc


def hdf5_timeout(file_bytes: int) -> float:
    """Seconds the HDF5 worker may take on a file of ``file_bytes``: cgvm's one read deadline
    (``CGVM_READ_TIMEOUT``, see cgvm.guard)."""
    try:
        return read_timeout(size=file_bytes)
    except ConfigError as exc:
        raise KerasConfigError(str(exc)) from exc


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
