"""The op library: every op declared once (type rule, kernel, gradient, pattern, in-place) by family."""
from . import control, conv, elementwise, linalg, loss, nn, reduce, shape  # noqa: F401  (registers the ops)
from .registry import BROADCAST, ELEMWISE, INJECTIVE, OPAQUE, REDUCE, OpDef, all_ops, defop, lookup
