"""Environment switches read in one place: explicit opt-ins and the memory limit.

``env_flag`` reads a switch that lets a file run code (``CGVM_ALLOW_PYTHON_LAYERS``): only
``1``/``true``/``yes`` (any case) turn it on; ``0``/``false``/``no``/``off`` and an empty or
unset variable keep it off; anything else is a :class:`~cgvm.errors.ConfigError` naming the
variable, so a typo never silently enables (or disables) anything.

``max_bytes`` is the most memory one net or model may ask for (``CGVM_MAX_BYTES``: a byte count,
optionally with a K/M/G/T suffix, powers of 1024; default half the machine's memory), and
``check_bytes`` refuses a request past it before anything is allocated.
"""
from __future__ import annotations

import math
import os
import re
from typing import Iterable, Optional, Sequence

from .errors import ConfigError, ResourceLimitError

_ON = ("1", "true", "yes")
_OFF = ("0", "false", "no", "off", "")

#: The switches that let a file run code; each is read only through env_flag.
CODE_OPT_INS = ("CGVM_ALLOW_PYTHON_LAYERS",)

MAX_BYTES_VAR = "CGVM_MAX_BYTES"
#: Without CGVM_MAX_BYTES: this fraction of the machine's physical memory.
DEFAULT_MEMORY_FRACTION = 0.5
_FALLBACK_MAX_BYTES = 8 << 30   # where the machine's memory cannot be read


def env_flag(name: str) -> bool:
    """Whether the opt-in ``name`` is on: 1/true/yes on, 0/false/no/off/empty off, else an error."""
    raw = os.environ.get(name)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ConfigError(f"environment variable {name}={raw!r} is neither on (1, true, yes) nor off "
                      "(0, false, no, off, empty); set one of those")


_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_bytes(text: str, name: str = MAX_BYTES_VAR) -> int:
    """``"4096"``, ``"512M"``, ``"8G"``, ``"1.5T"`` as a byte count (a ConfigError naming ``name`` else)."""
    match = _SIZE.match(text)
    if not match:
        raise ConfigError(f"{name}={text!r} is not a size; write a byte count such as 8G, 512M or 1000000")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if value <= 0:
        raise ConfigError(f"{name}={text!r}: the limit must be positive")
    return int(value)


def machine_memory() -> Optional[int]:
    """The machine's physical memory in bytes, or None where it cannot be read."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def max_bytes() -> int:
    """The most bytes one net or model may ask for: $CGVM_MAX_BYTES, else half the machine's memory."""
    raw = os.environ.get(MAX_BYTES_VAR)
    if raw is not None and raw.strip():
        return parse_bytes(raw)
    total = machine_memory()
    return int(total * DEFAULT_MEMORY_FRACTION) if total else _FALLBACK_MAX_BYTES


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``; huge claims stay readable (``"32 TiB"``, ``"8.7e+09 TiB"``)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.4g} {unit}"
        n /= 1024
    return f"{n:.4g} TiB"


def shape_bytes(shape: Sequence[int], itemsize: int) -> int:
    """Bytes of an array of ``shape`` (exact integers: no overflow for claimed 10**12 dimensions)."""
    return math.prod(int(d) for d in shape) * int(itemsize)


def check_bytes(nbytes: int, what: str, *, limit: Optional[int] = None,
                parts: Iterable[tuple] = ()) -> None:
    """Refuse (ResourceLimitError) when ``nbytes`` is past the limit; ``what`` says who asks.

    ``parts``: (name, bytes) pairs, the largest of which the message names, so the user sees which
    blob or layer makes the total too big.
    """
    limit = max_bytes() if limit is None else limit
    if nbytes <= limit:
        return
    largest = sorted(parts, key=lambda p: -p[1])[:3]
    detail = "; largest: " + ", ".join(f"{name} {format_bytes(b)}" for name, b in largest) if largest else ""
    raise ResourceLimitError(
        f"{what} needs {format_bytes(nbytes)}, more than the limit of {format_bytes(limit)}{detail}. "
        f"Check the sizes the file gives; if they are right, raise the limit with {MAX_BYTES_VAR} "
        "(e.g. CGVM_MAX_BYTES=64G)")
