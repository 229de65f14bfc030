"""The files and values ``cgvm run`` reads besides the net: .npy inputs, a labels file, integer lists.

Each failure is a CgvmError (a UsageError for a flag's value) that names the file or flag, with
the library's exception chained; a .npy header's shape is checked against the file's length (it
is memory-mapped) and the memory limit before any array is made.
"""
from __future__ import annotations

from typing import List

import numpy as np

from cgvm.commands import UsageError
from cgvm.env import check_bytes
from cgvm.errors import CgvmError


def load_npy(path: str) -> np.ndarray:
    """A numeric .npy array; its header's shape is checked against the file's length before reading."""
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:   # numpy's ValueError / EOFError / tokenize.TokenError... on a corrupt header
        raise CgvmError(f"{path}: not a readable NumPy .npy file ({type(exc).__name__}: {exc})") from exc
    if not isinstance(mapped, np.ndarray) or mapped.dtype.kind not in "biuf":
        raise CgvmError(f"{path}: holds {getattr(mapped, 'dtype', type(mapped).__name__)} values; give a numeric "
                        "array (an image: H x W [x K], or preprocessed C x H x W)")
    check_bytes(mapped.size * 4, f"{path}: the input array")
    try:
        return np.array(mapped, dtype=np.float32)
    except (ValueError, OSError) as exc:
        raise CgvmError(f"{path}: cannot read the array ({exc})") from exc


def int_list(text: str, flag: str) -> tuple:
    """``"2,1,0"`` -> ``(2, 1, 0)``; a UsageError naming ``flag`` for anything else."""
    try:
        return tuple(int(c) for c in text.split(","))
    except ValueError:
        raise UsageError(f"{flag} {text!r}: give comma-separated integers") from None


def read_labels(path: str) -> List[str]:
    """One class name per line of a UTF-8 text file (none for an empty path)."""
    if not path:
        return []
    try:
        with open(path, "rb") as f:
            data = f.read()
    except IsADirectoryError:
        raise CgvmError(f"--labels {path}: this is a directory; give a text file, one class name per line") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise CgvmError(f"--labels {path}:{line}: not UTF-8 text; give a text file, one class name per line") \
            from exc
    return [line.strip() for line in text.splitlines()]
