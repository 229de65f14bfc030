"""HDF5 files read without trusting them: in a worker process with a timeout, sizes checked first.

``open_h5(source, name)`` gives an ``H5Snapshot``: the whole tree of groups, attributes and dataset
shapes and dtypes, read up front, so loaders check a file against the model before reading any
weight; ``snapshot.read([...])`` then reads the datasets they chose. The reading runs in
``h5_worker`` in a separate process: a corrupt file that makes libhdf5 loop forever is killed after
``load_limits.hdf5_timeout`` and reported, and h5py's ``OSError`` / ``KeyError`` / ``RuntimeError``
become ``KerasConfigError`` naming the file and the HDF5 path, with the library's exception (rebuilt
from the worker's report) as the cause.
"""
from __future__ import annotations

import atexit
import math
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import h5_worker
from .load_limits import hdf5_timeout, max_bytes
from .serialization import KerasConfigError

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_BUILTIN_ERRORS = {e.__name__: e for e in (OSError, KeyError, RuntimeError, ValueError, TypeError, IndexError,
                                            OverflowError, AttributeError, EOFError)}


class _NoClasses(pickle.Unpickler):
    """The worker's replies are plain data: any class in them means something is wrong."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"unexpected {module}.{name} in a reply of the HDF5 worker")


class _Timeout(Exception):
    pass


class _Worker:
    """One ``h5_worker`` process; killed and forgotten when a request runs past its timeout."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        address_space = 2 * max_bytes() + (2 << 30)  # the data, its copy, and Python with h5py
        self.proc = subprocess.Popen([sys.executable, h5_worker.__file__, str(address_space)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        self.pid = os.getpid()
        self.ready = False

    def _wait_ready(self) -> None:
        """The worker's first frame says h5py is imported; a start is not counted in a read's timeout."""
        try:
            self._receive(120.0)
        except BaseException:
            self.kill()
            raise
        self.ready = True

    def alive(self) -> bool:
        return self.pid == os.getpid() and self.proc.poll() is None

    def call(self, request: Tuple[Any, ...], timeout: float) -> Any:
        if not self.ready:
            self._wait_ready()
        payload = pickle.dumps(request, protocol=4)
        try:
            self.proc.stdin.write(struct.pack("<Q", len(payload)) + payload)
            self.proc.stdin.flush()
            reply = self._receive(timeout)
        except (BrokenPipeError, OSError) as exc:
            self.kill()
            raise _Timeout("the HDF5 worker stopped") from exc
        except BaseException:  # interrupted (Ctrl-C, an alarm) between request and reply: out of step now
            self.kill()
            raise
        if not isinstance(reply, tuple) or not reply or reply[0] not in ("ok", "error"):
            self.kill()
            raise _Timeout("the HDF5 worker answered out of protocol")
        return reply

    def _receive(self, timeout: float) -> Any:
        head = self._read_exactly(8, timeout)
        (n,) = struct.unpack("<Q", head)
        if n == 0:
            return None
        import io

        return _NoClasses(io.BytesIO(self._read_exactly(n, timeout))).load()

    def _read_exactly(self, n: int, timeout: float) -> bytes:
        import time

        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        chunks, got = [], 0
        while got < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                self.kill()
                raise _Timeout(f"no answer within {timeout:.0f} s")
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                self.kill()
                raise _Timeout("the HDF5 worker died (libhdf5 crashed on the file)")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.wait(5)
        except Exception:
            pass
        self._close_pipes()

    def stop(self) -> None:
        """End the worker the polite way (its stdin closes, it returns), at exit."""
        try:
            self.proc.stdin.close()
            self.proc.wait(2)
        except Exception:
            self.kill()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except Exception:
                pass


_worker: List[Optional[_Worker]] = [None]
_lock = threading.Lock()


@atexit.register
def _stop_worker() -> None:
    w = _worker[0]
    if w is not None and w.pid == os.getpid():
        w.stop()


def _respawn() -> None:
    try:
        _worker[0] = _Worker()
    except OSError:
        _worker[0] = None


def _get_worker() -> Optional[_Worker]:
    w = _worker[0]
    if w is not None and w.alive():
        return w
    try:
        _worker[0] = _Worker()
        _worker[0]._wait_ready()
    except (OSError, _Timeout, pickle.UnpicklingError, struct.error):
        _worker[0] = None  # no subprocesses here: read in-process, without the hang guard
    return _worker[0]


def _cause(name: str, message: str) -> BaseException:
    cls = _BUILTIN_ERRORS.get(name)
    return cls(message) if cls is not None else RuntimeError(f"{name}: {message}")


class H5Node:
    """A group, dataset or link of the file, as the worker described it."""

    def __init__(self, path: str, raw: Tuple[Any, ...]):
        self.path = path
        self.kind = raw[0]
        self.attrs: Dict[str, Any] = {}
        self.children: Dict[str, "H5Node"] = {}
        self.shape: Optional[Tuple[int, ...]] = None
        self.dtype: Optional[np.dtype] = None
        self.dtype_text = ""
        self.filtered = self.external = False
        if self.kind == "group":
            self.attrs = raw[1]
            for name, child in raw[2]:
                self.children[name] = H5Node(f"{path.rstrip('/')}/{name}", child)
        elif self.kind == "dataset":
            self.shape, self.dtype_text, self.filtered, self.external, self.attrs = raw[1:]
            if not self.dtype_text.startswith("unsupported:"):
                self.dtype = np.dtype(self.dtype_text)

    def get(self, rel: str) -> Optional["H5Node"]:
        node: Optional[H5Node] = self
        for part in rel.strip("/").split("/"):
            if not part:
                continue
            if node is None or node.kind != "group":
                return None
            node = node.children.get(part)
        return node

    def __contains__(self, rel: str) -> bool:
        return self.get(rel) is not None

    def keys(self) -> List[str]:
        return list(self.children)


class H5Snapshot:
    """The tree of one HDF5 file, and the means to read datasets from it."""

    def __init__(self, name: str, length: int, root: H5Node, call: Any):
        self.name = name
        self.length = length
        self.root = root
        self._call = call

    def read(self, nodes: Sequence[H5Node], what: Sequence[str]) -> List[np.ndarray]:
        """The arrays of dataset ``nodes`` (``what`` names each in errors), sizes checked first."""
        limit = max_bytes()
        total = 0
        for node, label in zip(nodes, what):
            if node.kind != "dataset":
                raise KerasConfigError(f"{self.name}: {label}: {node.path!r} is a {node.kind}, not a dataset")
            if node.external:
                raise KerasConfigError(f"{self.name}: {label}: dataset {node.path!r} keeps its data in another "
                                       "file (external or virtual storage); weights must be inside the file")
            if node.dtype is None or node.dtype.kind not in "biuf":
                raise KerasConfigError(f"{self.name}: {label}: dataset {node.path!r} has dtype "
                                       f"{node.dtype_text.replace('unsupported:', '')}, not numbers")
            nbytes = math.prod(node.shape or ()) * node.dtype.itemsize
            if not node.filtered and nbytes > self.length:
                raise KerasConfigError(f"{self.name}: {label}: dataset {node.path!r} claims {nbytes} bytes, more "
                                       f"than the whole file ({self.length} bytes): the file is corrupt")
            total += nbytes
            if total > limit:
                raise KerasConfigError(f"{self.name}: {label}: the weights read so far need {total} bytes, more "
                                       f"than the limit of {limit} (CGVM_MAX_BYTES)")
        raw = self._call(("read", [n.path for n in nodes], self.length, limit), f"reading {len(nodes)} datasets")
        out = []
        for node, (dtype, shape, data) in zip(nodes, raw):
            arr = np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape)
            if node.shape is not None and arr.shape != node.shape:
                raise KerasConfigError(f"{self.name}: dataset {node.path!r} read as shape {arr.shape}, its "
                                       f"header says {node.shape}: the file is corrupt")
            out.append(arr)
        return out


@contextmanager
def open_h5(source: Union[str, bytes], name: str) -> Iterator[H5Snapshot]:
    """The HDF5 file ``source`` (a path, or the file's bytes); ``name`` is how errors call it."""
    if isinstance(source, (bytes, bytearray)):
        length = len(source)
        sig_at = _signature_offset(bytes(source))
    else:
        if os.path.isdir(source):
            raise KerasConfigError(f"{name} is a directory, not an HDF5 file")
        try:
            length = os.path.getsize(source)
            with open(source, "rb") as fh:
                sig_at = _signature_offset(fh.read(min(length, 1 << 20)))
        except OSError as exc:
            raise KerasConfigError(f"{name} cannot be read: {exc}") from exc
    if sig_at is None:
        raise KerasConfigError(f"{name} is not an HDF5 file (no HDF5 signature)")
    timeout = hdf5_timeout(length)

    with _lock:
        worker = _get_worker()
        local: Dict[str, Any] = {}

        def call(request: Tuple[Any, ...], doing: str) -> Any:
            if worker is None:
                try:
                    return _in_process(local, request)
                except KerasConfigError as exc:
                    raise KerasConfigError(f"{name}: {exc} ({doing})") from exc.__cause__
            try:
                reply = worker.call(request, timeout)
            except _Timeout as exc:
                _respawn()  # the next file need not wait for a new worker to start
                raise KerasConfigError(f"{name}: the HDF5 library gave no answer {doing} ({exc}); the file is "
                                       "corrupt (or raise CGVM_READ_TIMEOUT for a very slow disk)") from exc
            if reply[0] == "error":
                _, where, exc_name, message = (tuple(reply) + ("", "", ""))[:4]
                raise KerasConfigError(f"{name}: HDF5 object {where!r} cannot be read {doing}: {exc_name}: "
                                       f"{message}") from _cause(exc_name, message)
            return reply[1]

        call(("open", source), "opening the file")
        try:
            root = H5Node("/", call(("describe",), "listing the file"))
            yield H5Snapshot(name, length, root, call)
        finally:
            if worker is not None and worker.alive():
                try:
                    worker.call(("close",), timeout)
                except _Timeout:
                    _worker[0] = None
            elif worker is None and "file" in local:
                local["file"].close()


def _signature_offset(head: bytes) -> Optional[int]:
    offset = 0
    while offset + 8 <= len(head):
        if head[offset:offset + 8] == HDF5_SIGNATURE:
            return offset
        offset = 512 if offset == 0 else offset * 2
    return None


def _in_process(local: Dict[str, Any], request: Tuple[Any, ...]) -> Any:
    try:
        if request[0] == "open":
            local["file"] = h5_worker.open_file(request[1])
            return None
        if request[0] == "describe":
            return h5_worker.describe(local["file"])
        return h5_worker.read(local["file"], *request[1:])
    except h5_worker.WorkerError as exc:
        raise KerasConfigError(f"HDF5 object {exc.where!r} cannot be read: {exc.exc}") from exc.exc
