"""pycaffe's Blob and Layer views over a Workspace.

A Blob names a workspace entry: ``data`` is the array stored there and ``diff`` the one at
``<entry>@diff``. They are read at every access, so a Blob object stays valid across forwards
(which store new arrays) and reshapes. Writing into ``blob.data[...]`` writes the net's memory.
"""
from __future__ import annotations

from typing import Any, List

import numpy as np

from cgvm.vm.workspace import Workspace


class Blob:
    """A named blob (or learnable parameter) of a net."""

    __slots__ = ("_ws", "_entry")

    def __init__(self, workspace: Workspace, entry: str):
        self._ws = workspace
        self._entry = entry

    @property
    def data(self) -> Any:
        return self._ws[self._entry]

    @property
    def diff(self) -> Any:
        return self._ws[self._entry + "@diff"]

    @property
    def shape(self) -> tuple:
        return tuple(int(d) for d in self._ws[self._entry].shape)

    @property
    def count(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def _legacy(self, index: int) -> int:
        shape = self.shape
        if len(shape) > 4:
            raise ValueError(f"num/channels/height/width are for blobs of at most 4 axes; this one is {shape}")
        return shape[index] if index < len(shape) else 1

    @property
    def num(self) -> int:
        return self._legacy(0)

    @property
    def channels(self) -> int:
        return self._legacy(1)

    @property
    def height(self) -> int:
        return self._legacy(2)

    @property
    def width(self) -> int:
        return self._legacy(3)

    def reshape(self, *dims: int) -> None:
        """New zeroed data and diff of shape ``dims`` (the net reshapes on its next forward)."""
        shape = tuple(int(d) for d in dims)
        if any(d < 0 for d in shape):
            raise ValueError(f"negative dimension in {shape}")
        dtype = self._ws[self._entry].dtype
        self._ws.set(self._entry, np.zeros(shape, dtype))
        self._ws.set(self._entry + "@diff", np.zeros(shape, dtype))

    def __repr__(self) -> str:
        return f"<Blob {self._entry} {self.shape}>"


ParamBlob = Blob


class LayerView:
    """pycaffe's Layer as the net exposes it: type, name, learnable blobs, phase."""

    def __init__(self, info: Any, workspace: Workspace):
        self._info = info
        self.type: str = info.type
        self.name: str = info.name
        self.blobs: List[Blob] = [Blob(workspace, p.name) for p in info.params]
        self.phase: int = info.param.phase

    def __repr__(self) -> str:
        return f"<Layer {self.name} ({self.type})>"
