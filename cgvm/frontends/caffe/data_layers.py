"""Host-side Caffe data layers: Data (LMDB), HDF5Data, HDF5Output, ImageData, WindowData.

A data layer makes no graph nodes: the net asks it for ``top_shapes()`` once and for
``next_batch()`` (a ``{top name: float32 array}`` dict) before every forward, and feeds those
arrays to the compiled program. Importing this module registers the factories
``factory(layer_param, phase, ctx) -> layer`` in ``layers.base.DATA_LAYERS``. HDF5Output is a sink: it has
no tops and ``write({bottom name: array})`` appends what it is given.

Paths are relative to the working directory, as in Caffe. Layers that read in sequence have
``get_state()``/``set_state()`` (a JSON-able read position) for solver snapshots. Random choices (crop offsets,
mirroring, shuffling, window sampling) come from the net's generator ``ctx.rng`` (else one
seeded by ``data_common.set_random_seed``), so seeded runs repeat.

The layers live in data_lmdb.py, data_hdf5.py and data_images.py; what they share (the generator,
errors, list files, DataTransformer) in data_common.py. This module registers them.
"""
from __future__ import annotations

from typing import Any, Callable, Dict

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.data_hdf5 import HDF5DataLayer, HDF5OutputLayer
from cgvm.frontends.caffe.data_images import ImageDataLayer, WindowDataLayer
from cgvm.frontends.caffe.data_lmdb import LMDBDataLayer
from cgvm.frontends.caffe.data_shard import sharded
from cgvm.frontends.caffe.layers.base import DATA_LAYERS, register_data_layer

DataLayerFactory = Callable[[caffe_pb2.LayerParameter, int, Any], Any]

FACTORIES: Dict[str, DataLayerFactory] = {
    "Data": LMDBDataLayer,
    "HDF5Data": HDF5DataLayer,
    "HDF5Output": HDF5OutputLayer,
    "ImageData": ImageDataLayer,
    "WindowData": WindowDataLayer,
}

for _name, _factory in FACTORIES.items():
    if _name not in DATA_LAYERS:
        register_data_layer(_name)(sharded(_name, _factory))   # several solvers: each rank's share
