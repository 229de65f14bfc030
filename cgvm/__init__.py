"""cgvm: a Computational Graph Virtual Machine.

Frontends (Caffe, Theano-style, Keras-style) build one graph IR; compiler passes optimize it;
a bytecode VM runs it on NumPy or CuPy over a shared Workspace of named tensors.

The Theano-style names are also here, as Theano users expect them: ``cgvm.function``,
``cgvm.grad``, ``cgvm.scan``, ``cgvm.shared``, ``cgvm.tensor``. ``cgvm.grad`` also takes plain IR
Values (and returns Values for them); ``cgvm.compile`` is the core compiler entry point.
"""
from . import autodiff, ops
from .backend import available_backends, get_backend
from .backend.threads import set_num_threads
from .compiled import compile
from .compiled_function import Function
from .dlpack import Tensor, from_dlpack
from .errors import CgvmError
from .ir import DType, Graph, TensorType, Value, input_value, param_value
from .vm import Workspace, default_workspace, eval_graph

from .frontends.theano import function, grad, scan, shared  # noqa: E402  (Theano-style names)
from .frontends.theano import tensor  # noqa: E402

__version__ = "0.1.0"

__all__ = ["ops", "autodiff", "available_backends", "get_backend", "set_num_threads", "CgvmError", "Function",
           "compile", "DType", "Graph", "TensorType", "Value", "input_value", "param_value", "Workspace",
           "default_workspace", "eval_graph", "Tensor", "from_dlpack", "function", "grad", "scan", "shared",
           "tensor", "__version__"]
