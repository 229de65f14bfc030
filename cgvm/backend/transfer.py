"""Host/device traffic: a counter of copies, pinned staging for inputs, one arena for a memory plan.

Written against an array module ``xp`` so that NumPy exercises the same logic on a CPU machine.

* ``TransferCounter`` (the process-wide ``COUNTS``): every copy the backends make between host
  and device is counted here (``Backend.to_numpy``, ``host_array``, ``CupyBackend.asarray`` of a
  host array). On NumPy nothing is copied, but reads through ``to_numpy``/``host_array`` are
  counted all the same (``host_reads``), so a test on the CPU can assert what a GPU run must
  satisfy: no read back to the host inside a step. ``counting()`` gives the counts of a block;
  on CuPy ``counting(strict=True)`` also turns any device synchronization CuPy itself performs
  (``.item()``, ``bool(array)``, an implicit ``get``) into an error (``cupyx.allow_synchronize``),
  so copies that bypass the backend are caught too.
* ``PinnedStaging``: host arrays go to the device through page-locked buffers, reused per size,
  so each input is copied once per step by an asynchronous DMA on the current stream. A buffer
  is written again only after the copy that last read it has finished (its event).
* ``arena_buffers``: the buffers of a memory plan as aligned slices of one allocation (CuPy's
  memory pool hands out one block, and the plan's offsets are within it).
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple

#: the alignment of each plan buffer in an arena (cudaMalloc's, and enough for cuBLAS/cuDNN vector loads)
ARENA_ALIGN = 256


@dataclass
class TransferCounts:
    """Copies between host and device (and host reads on NumPy) with their bytes."""

    host_to_device: int = 0
    host_to_device_bytes: int = 0
    device_to_host: int = 0
    device_to_host_bytes: int = 0
    host_reads: int = 0            # to_numpy / host_array calls, on any backend

    def copy(self) -> "TransferCounts":
        return TransferCounts(**self.__dict__)

    def minus(self, before: "TransferCounts") -> "TransferCounts":
        return TransferCounts(**{k: v - getattr(before, k) for k, v in self.__dict__.items()})


class TransferCounter:
    """The running totals; ``counting()`` yields a TransferCounts filled in when the block ends."""

    def __init__(self) -> None:
        self.totals = TransferCounts()

    def device_to_host(self, nbytes: int) -> None:
        t = self.totals
        t.device_to_host += 1
        t.device_to_host_bytes += int(nbytes)

    def host_to_device(self, nbytes: int) -> None:
        t = self.totals
        t.host_to_device += 1
        t.host_to_device_bytes += int(nbytes)

    def host_read(self) -> None:
        self.totals.host_reads += 1

    @contextlib.contextmanager
    def counting(self, strict: bool = False) -> Iterator[TransferCounts]:
        """Counts of the copies made inside the block (filled in on exit). ``strict`` on CuPy: any
        device synchronization inside the block raises ``cupyx.DeviceSynchronized``."""
        result = TransferCounts()
        before = self.totals.copy()
        try:
            with warnings.catch_warnings():
                # CuPy 14 warns that the detection may go away; it works meanwhile
                warnings.filterwarnings("ignore", message="cupyx.allow_synchronize", category=UserWarning)
                with _no_synchronize() if strict else contextlib.nullcontext():
                    yield result
        finally:
            result.__dict__.update(self.totals.minus(before).__dict__)


def _no_synchronize() -> Any:
    """cupyx.allow_synchronize(False) where CuPy is importable and has it, else a no-op."""
    try:
        import cupyx
    except ImportError:
        return contextlib.nullcontext()
    allow = getattr(cupyx, "allow_synchronize", None)
    return allow(False) if allow is not None else contextlib.nullcontext()


#: the process's counter: backends report to it, tests and benchmarks read it
COUNTS = TransferCounter()


def counting(strict: bool = False) -> Any:
    """``with counting() as c: ...`` then ``c.device_to_host`` (see TransferCounter.counting)."""
    return COUNTS.counting(strict=strict)


# ------------------------------------------------------------------------------------ staging

class PinnedStaging:
    """Host arrays onto the device through reused page-locked buffers, one asynchronous copy each.

    ``empty_pinned(nbytes) -> host uint8 array`` (``cupyx.empty_pinned``), ``make_event()`` (a
    CUDA event: ``record()``, ``synchronize()``) and ``upload(device_array, host_view)`` (the
    asynchronous copy) are given, so the bookkeeping runs with NumPy stand-ins in tests. Buffers
    are kept per size class (the next power of two); each has the event of the last copy that read
    it, waited on before the buffer is written again (steady state: a step later, long done).
    """

    def __init__(self, xp: Any, empty_pinned: Callable[[int], Any], make_event: Callable[[], Any],
                 upload: Callable[[Any, Any], None], slots_per_size: int = 4):
        self.xp = xp
        self._empty_pinned = empty_pinned
        self._make_event = make_event
        self._upload = upload
        self.slots_per_size = slots_per_size
        self._free: Dict[int, List[Tuple[Any, Any]]] = {}   # size class -> [(buffer, event)], oldest first
        self.allocated_bytes = 0

    @staticmethod
    def size_class(nbytes: int) -> int:
        return 1 << max(int(nbytes) - 1, 0).bit_length() if nbytes > 1 else 1

    def _buffer(self, nbytes: int) -> Tuple[Any, Any]:
        cls = self.size_class(nbytes)
        ring = self._free.setdefault(cls, [])
        if len(ring) < self.slots_per_size:
            buf = self._empty_pinned(cls)
            self.allocated_bytes += cls
            return buf, self._make_event()
        buf, event = ring.pop(0)
        if not getattr(event, "done", False):
            event.synchronize()  # the copy that last read this buffer has not finished yet
        return buf, event

    def to_device(self, host: Any) -> Any:
        """A device copy of host array ``host`` (C order), made through a pinned buffer."""
        import numpy as np

        host = np.ascontiguousarray(host)
        out = self.xp.empty(host.shape, dtype=host.dtype)
        if host.nbytes == 0:
            return out
        buf, event = self._buffer(host.nbytes)
        view = buf[:host.nbytes].view(host.dtype).reshape(host.shape)
        view[...] = host
        self._upload(out, view)
        event.record()
        self._free[self.size_class(host.nbytes)].append((buf, event))
        COUNTS.host_to_device(host.nbytes)
        return out


# ------------------------------------------------------------------------------------ arena

def data_pointer(a: Any) -> int:
    """The address of ``a``'s first byte (NumPy: ``ctypes.data``; CuPy: ``data.ptr``)."""
    data = getattr(a, "data", None)
    ptr = getattr(data, "ptr", None)
    return int(ptr) if ptr is not None else int(a.ctypes.data)


def arena_layout(sizes: Sequence[int], align: int = ARENA_ALIGN) -> Tuple[List[int], int]:
    """Offsets of buffers of ``sizes`` bytes packed in one block, each at a multiple of ``align``,
    and the block's size."""
    offsets, end = [], 0
    for n in sizes:
        end = -(-end // align) * align
        offsets.append(end)
        end += max(int(n), 1)
    return offsets, end


def arena_buffers(xp: Any, sizes: Sequence[int], align: int = ARENA_ALIGN) -> Tuple[Any, List[Any]]:
    """One uint8 allocation holding every buffer of a memory plan, and each buffer as a slice of it
    (each starting at a multiple of ``align`` bytes in memory)."""
    offsets, total = arena_layout(sizes, align)
    raw = xp.empty(total + align, dtype=xp.uint8)
    start = -data_pointer(raw) % align
    arena = raw[start:start + total]
    return arena, [arena[o:o + max(int(n), 1)] for o, n in zip(offsets, sizes)]


__all__ = ["ARENA_ALIGN", "COUNTS", "PinnedStaging", "TransferCounter", "TransferCounts", "arena_buffers",
           "arena_layout", "counting", "data_pointer"]
