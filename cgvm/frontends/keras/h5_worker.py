"""The HDF5 reading that may never return: walking a file's groups and reading its datasets with h5py.

Some corrupt HDF5 files send libhdf5 into a loop that never ends (a B-tree or heap pointing back at
itself), with the GIL held. So ``h5_guard`` runs this module as a separate worker process
(``python h5_worker.py MAX_ADDRESS_SPACE``) that it can kill after a timeout. The module imports nothing of cgvm,
so it runs by its path alone; ``h5_guard`` also calls ``describe`` and ``read`` in-process where no
worker can be started.

The worker's address space is limited to what the parent allows (its byte limit plus room for
Python and h5py), so a length field that claims terabytes fails there, not in the machine.
Everything sent back is plain data (tuples, lists, dicts, str, bytes, int, float, bool, None), so
the parent unpickles it with no classes allowed. Protocol: frames of an 8-byte little-endian length
and a pickle, one request, one reply; a reply is ``("ok", result)`` or ``("error", where, exception
type name, message)``.
"""
from __future__ import annotations

import io
import math
import pickle
import struct
import sys
from typing import Any, Dict, List, Tuple

#: how deep groups may nest and how many objects a file may hold before it is refused as corrupt
MAX_DEPTH = 64
MAX_OBJECTS = 200_000
MAX_ATTR_ELEMENTS = 1_000_000


class WorkerError(Exception):
    """A failure at an HDF5 path: carries the path and the original exception."""

    def __init__(self, where: str, exc: BaseException):
        super().__init__(where, type(exc).__name__, str(exc))
        self.where = where
        self.exc = exc


def _plain(value: Any) -> Any:
    """An attribute value as plain Python data (numbers, str, bytes and lists of them)."""
    import numpy as np

    if isinstance(value, (bytes, str, bool, int, float)) or value is None:
        return value
    if isinstance(value, np.generic):
        value = value.item()
        if isinstance(value, complex):
            return repr(value)
        return value if isinstance(value, (bytes, str, bool, int, float)) else repr(value)
    if isinstance(value, np.ndarray):
        if value.size > MAX_ATTR_ELEMENTS:
            return ("__too_large__", value.size)
        if value.dtype.kind in "biuf":
            return value.tolist()
        if value.dtype.kind in "OSU":
            return [_plain(v) for v in value.ravel().tolist()]
        return repr(value.dtype)
    return repr(type(value))


def _attrs(obj: Any, where: str) -> Dict[str, Any]:
    out = {}
    try:
        names = list(obj.attrs.keys())
    except Exception as exc:
        raise WorkerError(f"{where} (attributes)", exc) from exc
    for name in names:
        try:
            out[str(name)] = _plain(obj.attrs[name])
        except Exception as exc:
            raise WorkerError(f"{where} attribute {name!r}", exc) from exc
    return out


def _dataset_info(ds: Any, where: str) -> Tuple[Any, ...]:
    try:
        shape = ds.shape
        dtype = ds.dtype
        plist = ds.id.get_create_plist()
        filtered = plist.get_nfilters() > 0
        external = plist.get_external_count() > 0 or bool(getattr(ds, "is_virtual", False))
    except Exception as exc:
        raise WorkerError(where, exc) from exc
    simple = dtype.kind in "biufc" and dtype.fields is None and dtype.subdtype is None
    return ("dataset", None if shape is None else tuple(int(d) for d in shape),
            dtype.str if simple else f"unsupported:{dtype}", filtered, external, _attrs(ds, where))


def describe(f: Any) -> Tuple[Any, ...]:
    """The tree of ``f``: ``("group", attrs, [(name, node), ...])``, datasets as ``("dataset", shape,
    dtype str, filtered, external, attrs)``, soft and external links as ``("link", kind)``."""
    import h5py

    count = [0]

    def node(obj: Any, where: str, depth: int) -> Tuple[Any, ...]:
        count[0] += 1
        if count[0] > MAX_OBJECTS:
            raise WorkerError(where, ValueError(f"more than {MAX_OBJECTS} objects (a corrupt or looping file)"))
        if depth > MAX_DEPTH:
            raise WorkerError(where, ValueError(f"groups nested more than {MAX_DEPTH} deep"))
        if isinstance(obj, h5py.Dataset):
            return _dataset_info(obj, where)
        attrs = _attrs(obj, where)
        children: List[Tuple[str, Any]] = []
        try:
            names = list(obj.keys())
        except Exception as exc:
            raise WorkerError(where, exc) from exc
        for name in names:
            path = f"{where.rstrip('/')}/{name}"
            try:
                link = obj.get(name, getlink=True)
                if not isinstance(link, h5py.HardLink):
                    children.append((str(name), ("link", type(link).__name__)))
                    continue
                child = obj[name]
            except Exception as exc:
                raise WorkerError(path, exc) from exc
            if not isinstance(child, (h5py.Group, h5py.Dataset)):
                children.append((str(name), ("link", type(child).__name__)))
                continue
            children.append((str(name), node(child, path, depth + 1)))
        return ("group", attrs, children)

    return node(f, "/", 0)


def read(f: Any, paths: List[str], file_length: int, max_bytes: int) -> List[Tuple[str, Tuple[int, ...], bytes]]:
    """The data of the datasets at ``paths`` as ``(dtype str, shape, C-order bytes)``, each size checked
    against the file's length (unfiltered data cannot be larger) and ``max_bytes`` before reading."""
    import numpy as np

    out = []
    total = 0
    for path in paths:
        try:
            ds = f[path]
            shape = tuple(int(d) for d in (ds.shape or ()))
            nbytes = math.prod(shape) * ds.dtype.itemsize
            filtered = ds.id.get_create_plist().get_nfilters() > 0
            if not filtered and nbytes > file_length:
                raise ValueError(f"claims {nbytes} bytes of data, more than the whole file ({file_length} bytes)")
            total += nbytes
            if total > max_bytes:
                raise ValueError(f"needs {total} bytes, more than the limit of {max_bytes}")
            arr = np.ascontiguousarray(ds[()]) if ds.shape is not None else np.zeros((0,), ds.dtype)
        except Exception as exc:
            raise WorkerError(path, exc) from exc
        out.append((arr.dtype.str, tuple(arr.shape), arr.tobytes()))
    return out


def open_file(data: Any) -> Any:
    """``data`` (a path, or the file's bytes) opened read-only with h5py."""
    import h5py

    try:
        return h5py.File(io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data, "r")
    except Exception as exc:
        raise WorkerError("/", exc) from exc


def _serve() -> None:
    """Answer requests on stdin until it closes: ``("open", data)``, ``("describe",)``,
    ``("read", paths, file_length, max_bytes)``, ``("close",)``."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames may reach the parent
    if len(sys.argv) > 1:  # a corrupt length inside the file must not let libhdf5 take the machine's memory
        try:
            import resource

            limit = int(sys.argv[1])
            soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            if hard != resource.RLIM_INFINITY:
                limit = min(limit, hard)
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        except (ImportError, ValueError, OSError):
            pass
    import h5py  # noqa: F401  (imported before the first request: the parent's timeout is for reading)

    stdout.write(struct.pack("<Q", 0))
    stdout.flush()
    f = None
    while True:
        head = stdin.read(8)
        if len(head) < 8:
            return
        (n,) = struct.unpack("<Q", head)
        request = pickle.loads(stdin.read(n))
        try:
            if request[0] == "open":
                if f is not None:
                    f.close()
                f = open_file(request[1])
                reply: Any = ("ok", None)
            elif request[0] == "describe":
                reply = ("ok", describe(f))
            elif request[0] == "read":
                reply = ("ok", read(f, request[1], request[2], request[3]))
            else:
                if f is not None:
                    f.close()
                f = None
                reply = ("ok", None)
        except WorkerError as exc:
            reply = ("error", exc.where, type(exc.exc).__name__, str(exc.exc))
        except Exception as exc:
            reply = ("error", "/", type(exc).__name__, str(exc))
        payload = pickle.dumps(reply, protocol=4)
        stdout.write(struct.pack("<Q", len(payload)) + payload)
        stdout.flush()


if __name__ == "__main__":
    _serve()
