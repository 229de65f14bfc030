"""Data layers that need no files: Input, DummyData, MemoryData.

A data layer adds no graph nodes. Its tops are workspace entries that the graph reads; the net
calls ``next_batch()`` on the host before each forward that runs the layer and writes what it
returns into those entries (see base.DATA_LAYERS for the protocol).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.fillers import check_filler, fill
from cgvm.frontends.caffe.layers.base import DataContext, register_data_layer

Shape = Tuple[int, ...]


def _per_top(values: Sequence, tops: int, what: str, ctx: DataContext) -> List:
    """A field given once (for every top) or once per top, as Caffe reads DummyData and Input."""
    if len(values) == 1:
        return list(values) * tops
    if len(values) != tops:
        raise ctx.error(f"{what} is given {len(values)} times; give it once (for every top) or once per top ({tops})")
    return list(values)


class InputLayer:
    """Tops whose contents the user writes (net.blobs['data'].data[...] = x); they are net.inputs."""

    def __init__(self, layer: caffe_pb2.LayerParameter, phase: int, ctx: DataContext):
        shapes = layer.input_param.shape
        if not shapes:
            raise ctx.error("input_param gives no shape; give one shape (for every top) or one per top")
        self._shapes = [tuple(int(d) for d in s.dim) for s in _per_top(shapes, len(layer.top), "input_param.shape", ctx)]
        for shape in self._shapes:
            if any(d < 0 for d in shape):
                raise ctx.error(f"input shape {shape} has a negative dimension")

    def top_shapes(self) -> List[Shape]:
        return self._shapes

    def next_batch(self) -> Dict[str, np.ndarray]:
        return {}


class DummyDataLayer:
    """Tops filled by data_filler: constant tops once at setup, the others again every forward."""

    def __init__(self, layer: caffe_pb2.LayerParameter, phase: int, ctx: DataContext):
        param = layer.dummy_data_param
        tops = len(layer.top)
        if param.shape:
            if param.num or param.channels or param.height or param.width:
                raise ctx.error("give either shape or the legacy num/channels/height/width, not both")
            shapes = [tuple(int(d) for d in s.dim) for s in _per_top(param.shape, tops, "shape", ctx)]
        else:
            legacy = [_per_top(getattr(param, f), tops, f, ctx) if getattr(param, f) else None
                      for f in ("num", "channels", "height", "width")]
            if any(v is None for v in legacy):
                raise ctx.error("dummy_data_param needs shape, or all of num, channels, height and width")
            shapes = [tuple(int(v[i]) for v in legacy) for i in range(tops)]
        fillers: List[Optional[caffe_pb2.FillerParameter]]
        fillers = _per_top(param.data_filler, tops, "data_filler", ctx) if param.data_filler else [None] * tops
        for shape, filler in zip(shapes, fillers):
            if any(d < 0 for d in shape):
                raise ctx.error(f"dummy data shape {shape} has a negative dimension")
            check_filler(filler, shape, ctx.error)
        self._names = list(layer.top)
        self._shapes = shapes
        self._fillers = fillers
        self._rng = ctx.rng
        self._dtype = ctx.dtype
        self._constant = [f is None or f.type == "constant" for f in fillers]
        self._first = True

    def top_shapes(self) -> List[Shape]:
        return self._shapes

    def next_batch(self) -> Dict[str, np.ndarray]:
        batch = {}
        for name, shape, filler, constant in zip(self._names, self._shapes, self._fillers, self._constant):
            if self._first or not constant:
                batch[name] = fill(filler, shape, self._rng).astype(self._dtype, copy=False)
        self._first = False
        return batch


class MemoryDataLayer:
    """Batches from arrays given with net.set_input_arrays(data, labels), in order, wrapping around."""

    def __init__(self, layer: caffe_pb2.LayerParameter, phase: int, ctx: DataContext):
        param = layer.memory_data_param
        if not (param.batch_size and param.channels and param.height and param.width):
            raise ctx.error("memory_data_param needs batch_size, channels, height and width, all positive")
        if len(layer.top) != 2:
            raise ctx.error(f"MemoryData has two tops (data and label), got {len(layer.top)}")
        self.batch_size = int(param.batch_size)
        self._shapes = [(self.batch_size, int(param.channels), int(param.height), int(param.width)),
                        (self.batch_size,)]
        self._names = list(layer.top)
        self._dtype = ctx.dtype
        self._error = ctx.error
        self._data: Optional[np.ndarray] = None
        self._labels: Optional[np.ndarray] = None
        self._position = 0

    def top_shapes(self) -> List[Shape]:
        return self._shapes

    def set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        """Keep ``data`` (N, C, H, W) and ``labels`` (N or N x 1 x 1 x 1); N a multiple of batch_size."""
        data = np.asarray(data)
        labels = np.asarray(labels)
        if data.ndim != 4 or tuple(data.shape[1:]) != self._shapes[0][1:]:
            raise self._error(f"set_input_arrays: data must be (N,) + {self._shapes[0][1:]}, got {data.shape}")
        if labels.shape[0] != data.shape[0] or labels.size != data.shape[0]:
            raise self._error(f"set_input_arrays: {labels.shape[0]} labels for {data.shape[0]} images")
        if data.shape[0] % self.batch_size:
            raise self._error(f"set_input_arrays: the number of images ({data.shape[0]}) must be a multiple of "
                              f"the batch size {self.batch_size}")
        self._data = data.astype(self._dtype, copy=False)
        self._labels = labels.reshape(-1).astype(self._dtype, copy=False)
        self._position = 0

    def next_batch(self) -> Dict[str, np.ndarray]:
        if self._data is None:
            raise self._error("MemoryData has no arrays; call net.set_input_arrays(data, labels) before forward")
        stop = self._position + self.batch_size
        batch = {self._names[0]: self._data[self._position:stop],
                 self._names[1]: self._labels[self._position:stop]}
        self._position = stop % self._data.shape[0]
        return batch


register_data_layer("Input")(InputLayer)
register_data_layer("DummyData")(DummyDataLayer)
register_data_layer("MemoryData")(MemoryDataLayer)
