"""``import cgvm.caffe as caffe``: the pycaffe module surface, backed by cgvm.

Net, Layer (base of Python layers), TRAIN/TEST, set_mode_cpu/set_mode_gpu/set_device,
set_random_seed, layer_type_list and ``caffe.proto.caffe_pb2``. Solvers, io, draw and net_spec
are added beside these as they land (see cgvm/frontends/caffe/).
"""
from cgvm.caffe import proto  # noqa: F401
from cgvm.frontends.caffe.pycaffe import (TEST, TRAIN, Blob, Layer, Net, __version__, layer_type_list,  # noqa: F401
                                          set_device, set_mode_cpu, set_mode_gpu, set_random_seed)

__all__ = ["Net", "Layer", "Blob", "TRAIN", "TEST", "set_mode_cpu", "set_mode_gpu", "set_device", "set_random_seed",
           "layer_type_list", "proto", "__version__"]
