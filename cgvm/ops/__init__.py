"""The op library: every op declared once (type rule, kernel, gradient, pattern, in-place) by family."""
from . import (control, conv, creation, elementwise, indexing, linalg, loss, nn,  # noqa: F401  (registers ops)
               join, pool, reduce, selection, shape)
from . import grad_control, random, sorting  # noqa: F401  (ops the Theano frontend needs)
from . import fused  # noqa: F401  (ops the fusion passes produce)
from . import tensor_math  # noqa: F401  (ops the ONNX frontend needs: bit_shift, cumprod, einsum, det)
from .registry import BROADCAST, ELEMWISE, INJECTIVE, OPAQUE, REDUCE, OpDef, all_ops, defop, lookup
