"""Kernel scratch: the temporaries a kernel needs during one call, planned as memory like values.

A kernel that builds im2col columns, a padded copy or transformed weights needs memory that no
value of the program holds. Allocated inside the kernel, it comes on top of every planned
buffer and is faulted in afresh on each call. Instead the op declares its scratch
(``@op.scratch``, the bytes for given input types). The memory planner gives the scratch a
block alive during that one instruction, in memory that values freed earlier left, and the VM
passes the block to the kernel as ``scratch=`` (MXNet's temp-space request, TVM's workspace).

Both sides read one description, a ``Layout``: the temporaries' names, shapes and dtypes in
order. ``layout_bytes`` sizes the block from it, and ``take`` carves the block into
arrays from it, so the size and the carving cannot disagree. Without a block (no memory plan,
shapes unknown at planning time), or with one too small, ``take`` allocates instead.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from ...pycode import define

#: temporaries start at multiples of this many bytes (cache lines; every dtype's alignment)
ALIGN = 64

Layout = Sequence[Tuple[str, Tuple[int, ...], Any]]   # (name, shape, dtype) per temporary

def _nbytes(shape: Sequence[int], dtype: Any) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize

def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN

def layout_bytes(layout: Layout) -> int:
    """Bytes of a block that holds every temporary of ``layout``, each aligned to ALIGN."""
    return sum(_aligned(_nbytes(shape, dtype)) for _, shape, dtype in layout)

def aligned_empty(xp: Any, shape: Sequence[int], dtype: Any) -> Any:
    """``xp.empty(shape, dtype)`` starting at a multiple of ALIGN bytes. NumPy's allocator aligns to
    16 bytes; OpenBLAS multiplied 32x128 blocks 15-25% slower at 16- or 32-byte offsets than at 64
    (CuPy's allocations are already aligned)."""
    if getattr(xp, "__name__", "") != "numpy":
        return xp.empty(shape, dtype=dtype)
    nbytes = _nbytes(shape, dtype)
    raw = xp.empty(nbytes + ALIGN, dtype=xp.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes].view(dtype).reshape(shape)

def aligned(xp: Any, a: Any) -> Any:
    """``a`` itself when it starts at a multiple of ALIGN bytes (or is not a NumPy array), else an
    aligned copy: for a matrix that many GEMMs read (OpenBLAS took 13 us instead of 17 for a
    32x128 by 128x128 product with the right operand aligned)."""
    if getattr(xp, "__name__", "") != "numpy" or not isinstance(a, xp.ndarray) or a.ctypes.data % ALIGN == 0:
        return a
    copy = aligned_empty(xp, a.shape, a.dtype)
    copy[...] = a
    return copy

def take(xp: Any, block: Optional[Any], layout: Layout) -> Dict[str, Any]:
    """The temporaries of ``layout`` by name: views of ``block`` (uint8) when it holds them all, else
    new arrays of ``xp``. Their contents are undefined (the block held other values before)."""
    if block is None or block.nbytes < layout_bytes(layout):
        return {name: xp.empty(shape, dtype=dtype) for name, shape, dtype in layout}
    arrays = {}
    start = 0
    for name, shape, dtype in layout:
        n = _nbytes(shape, dtype)
        arrays[name] = block[start:start + n].view(dtype).reshape(shape)
        start += _aligned(n)
    return arrays

def writeable(a: Any) -> bool:
    """Whether ``a`` may be written (NumPy's flag; CuPy arrays have no such flag and always may)."""
    return getattr(a.flags, "writeable", True)

def _refs_seen_by_helper() -> int:
    """What ``sys.getrefcount`` reports inside a helper called on a local that one container holds."""
    probe = define("probe", ["def probe(d):", "    s = d[0]", "    return _refs(s)"],
                   {"_refs": lambda a: sys.getrefcount(a)}, "refcount probe")
    return probe([object()])

_REFS_SEEN_BY_HELPER = _refs_seen_by_helper()

def sole_reference(a: Any, *, in_container: bool = True) -> bool:
    """Whether the caller's local variable holding ``a`` and, with ``in_container``, one list or dict
    entry (or one array's ``.base``) are all that refer to ``a``: no user, view or DLPack export
    holds it. The one refcount test behind reusing arrays (loop stacks, recycled parameter arrays,
    parameters updated in place); called as ``sole_reference(local)``."""
    return sys.getrefcount(a) == _REFS_SEEN_BY_HELPER - (0 if in_container else 1)

def private_array(a: Any, *, in_container: bool = True) -> bool:
    """``sole_reference(a)``, and ``a`` owns its memory and may be written: safe to overwrite."""
    # the count taken here, not through sole_reference: one call deeper would see one more reference
    return (sys.getrefcount(a) == _REFS_SEEN_BY_HELPER - (0 if in_container else 1)
            and a.base is None and writeable(a))
