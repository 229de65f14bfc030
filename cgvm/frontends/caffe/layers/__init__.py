"""Caffe layer converters, one module per family, all registered in ``CONVERTERS`` by type name.

Data layers (no graph nodes; tops filled on the host) are registered in ``DATA_LAYERS``.
"""
from cgvm.frontends.caffe.layers import common, data, loss, neuron, norm, recurrent, vision  # noqa: F401  (registers)
from cgvm.frontends.caffe.layers import ssd  # noqa: F401  (the SSD fork's layers; docs/caffe_forks.md)
from cgvm.frontends.caffe import data_layers  # noqa: F401  (registers Data, HDF5Data, ImageData, ...)
from cgvm.frontends.caffe.layers.base import (AUTO_TOP_TYPES, CONVERTERS, DATA_LAYERS, LOSS_TYPES, DataContext,
                                              LayerContext, register, register_data_layer)

__all__ = ["AUTO_TOP_TYPES", "CONVERTERS", "DATA_LAYERS", "LOSS_TYPES", "DataContext", "LayerContext", "register",
           "register_data_layer"]
