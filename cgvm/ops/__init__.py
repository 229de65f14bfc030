"""The op library: every op declared once (type rule, kernel, gradient, pattern, in-place) by family."""
from . import (control, conv, creation, elementwise, indexing, linalg, loss, nn,  # noqa: F401  (registers ops)
               pool, reduce, shape)
from .registry import BROADCAST, ELEMWISE, INJECTIVE, OPAQUE, REDUCE, OpDef, all_ops, defop, lookup
