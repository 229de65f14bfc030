"""``import cgvm.caffe as caffe``: the pycaffe module surface, backed by cgvm.

Net, Layer (base of Python layers), TRAIN/TEST, set_mode_cpu/set_mode_gpu/set_device,
set_random_seed, layer_type_list and ``caffe.proto.caffe_pb2``; the solvers and get_solver,
``caffe.io``, ``caffe.draw``, ``caffe.net_spec`` (``layers``, ``params``, ``NetSpec``,
``to_proto``), ``Classifier``, ``Detector``, ``coord_map``, ``Timer``, ``init_log``/``log``,
``has_nccl`` (see cgvm/frontends/caffe/); beyond pycaffe, ``symbolic_net`` (a
prototxt applied to symbolic inputs, for mixing with the other frontends).
"""
from cgvm.caffe import proto  # noqa: F401
from cgvm.frontends.caffe.pycaffe import (TEST, TRAIN, Blob, Layer, Net, __version__, layer_type_list,  # noqa: F401
                                          set_device, set_mode_cpu, set_mode_gpu, set_random_seed)

from cgvm.frontends.caffe import classifier, draw, io, net_spec  # noqa: E402
from cgvm.frontends.caffe.classifier import Classifier  # noqa: E402
from cgvm.frontends.caffe import coord_map, detector  # noqa: E402
from cgvm.frontends.caffe.detector import Detector  # noqa: E402
from cgvm.frontends.caffe.pycaffe_runtime import Timer, init_log, log  # noqa: E402
from cgvm.frontends.caffe.net_spec import NetSpec, layers, params, to_proto  # noqa: E402
from cgvm.frontends.caffe.symbolic import SymbolicNet, symbolic_net  # noqa: E402
from cgvm.frontends.caffe.solver import (AdaDeltaSolver, AdaGradSolver, AdamSolver, NesterovSolver,  # noqa: E402
                                         RMSPropSolver, SGDSolver, get_solver)

from cgvm.frontends.caffe.data_shard import (multiprocess, set_multiprocess, set_solver_count,  # noqa: E402
                                             set_solver_rank, solver_count, solver_rank)
from cgvm.frontends.caffe.solver_parallel import NCCL, has_nccl  # noqa: E402

# `import caffe.io` / `import caffe.draw` work as in pycaffe: the submodules are these modules
import sys as _sys  # noqa: E402

for _name, _module in (("io", io), ("draw", draw), ("net_spec", net_spec), ("classifier", classifier),
                      ("coord_map", coord_map), ("detector", detector)):
    _sys.modules[f"{__name__}.{_name}"] = _module

__all__ = ["Net", "Layer", "Blob", "TRAIN", "TEST", "set_mode_cpu", "set_mode_gpu", "set_device", "set_random_seed",
           "layer_type_list", "proto", "__version__", "io", "draw", "net_spec", "classifier", "Classifier",
           "NetSpec", "layers", "params", "to_proto", "SGDSolver", "NesterovSolver", "AdaGradSolver",
           "RMSPropSolver", "AdaDeltaSolver", "AdamSolver", "get_solver", "symbolic_net", "SymbolicNet",
           "solver_count", "solver_rank", "set_solver_count", "set_solver_rank", "set_multiprocess", "multiprocess",
           "has_nccl", "NCCL", "coord_map", "detector", "Detector", "Timer", "init_log", "log"]
