"""Workspace: named tensors shared by every program (parameters, shared variables, blobs, solver state)."""
from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

from ..backend.base import Backend, get_backend
from ..dlpack import Tensor
from ..errors import WorkspaceError


class Workspace:
    """A dict of named arrays on one backend.

    Programs read parameters by name at every call, so two programs over one workspace see the
    same arrays. ``shape_epoch`` changes whenever an entry changes shape or dtype, which tells
    compiled programs to re-plan their memory.
    """

    def __init__(self, backend: Optional[Backend | str] = None):
        self.backend = get_backend(backend)
        self._data: Dict[str, Any] = {}
        self.shape_epoch = 0

    # -- dict-like --------------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        try:
            return self._data[name]
        except KeyError:
            raise WorkspaceError(f"workspace has no tensor {name!r}" + self._near(name)) from None

    def __setitem__(self, name: str, value: Any) -> None:
        self.set(name, value)

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __delitem__(self, name: str) -> None:
        del self._data[name]
        self.shape_epoch += 1

    def keys(self):
        return self._data.keys()

    def items(self):
        return self._data.items()

    def get(self, name: str, default: Any = None) -> Any:
        return self._data.get(name, default)

    # -- feed and fetch -----------------------------------------------------------
    def set(self, name: str, value: Any, dtype: Any = None) -> Any:
        """Bind ``name`` to ``value`` (no copy for arrays of this backend or DLPack producers)."""
        arr = self.backend.asarray(value, dtype)
        old = self._data.get(name)
        if old is None or old.shape != arr.shape or old.dtype != arr.dtype:
            self.shape_epoch += 1
        self._data[name] = arr
        return arr

    feed = set

    def fetch(self, name: str) -> Any:
        return self[name]

    def tensor(self, name: str) -> Tensor:
        """A ``cgvm.Tensor`` of the array bound to ``name`` now, to export through DLPack without a copy.

        Safe to hand out: entries are never memory-planned buffers, and ``set`` (and function
        updates) rebind the name to a new array, so the exported memory is never reused under
        its consumer; the Tensor keeps the values of the array it was taken from.
        """
        return Tensor(self[name], name=name)

    def assign(self, name: str, value: Any) -> Any:
        """Write ``value`` into the existing array of ``name`` (holders of that array see it).

        The one in-place write: Tensors exported with ``tensor(name)`` and their DLPack consumers
        see it too (the zero-copy contract).
        """
        old = self[name]
        arr = self.backend.asarray(value)
        if old.shape != arr.shape:
            raise WorkspaceError(f"cannot assign shape {arr.shape} into {name!r} of shape {old.shape}")
        old[...] = arr
        return old

    def _near(self, name: str) -> str:
        import difflib

        close = difflib.get_close_matches(name, list(self._data), n=3)
        return f"; did you mean {', '.join(map(repr, close))}?" if close else ""

    def __repr__(self) -> str:
        return f"<Workspace {self.backend.name}: {len(self._data)} tensors>"


_default: Optional[Workspace] = None


def default_workspace() -> Workspace:
    """The process-wide workspace used when a function is compiled without one."""
    global _default
    if _default is None:
        _default = Workspace()
    return _default
