"""cgvm: a Computational Graph Virtual Machine.

Frontends (Caffe, Theano-style, Keras-style) build one graph IR; compiler passes optimize it;
a bytecode VM runs it on NumPy or CuPy over a shared Workspace of named tensors.
"""
from . import ops
from .autodiff import grad
from .backend import available_backends, get_backend
from .backend.threads import set_num_threads
from .dlpack import Tensor, from_dlpack
from .errors import CgvmError
from .function import Function, compile
from .ir import DType, Graph, TensorType, Value, input_value, param_value
from .vm import Workspace, default_workspace, eval_graph

__version__ = "0.1.0"

__all__ = ["ops", "grad", "available_backends", "get_backend", "set_num_threads", "CgvmError", "Function", "compile", "DType",
           "Graph", "TensorType", "Value", "input_value", "param_value", "Workspace", "default_workspace",
           "eval_graph", "Tensor", "from_dlpack", "__version__"]
