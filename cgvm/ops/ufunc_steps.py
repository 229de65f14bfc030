"""The program format of fused elementwise chains: steps, operands, literals, the ufuncs allowed.

A program is a tuple of steps ``(ufunc_name, operands)``; an operand is an input index ``k``,
``ACC`` (the result of the steps so far) or a literal ``lit(value, dtype)``. An op says how it
runs as such steps with ``@op.lowering`` (cgvm.ops.registry); the fusion pass chains the steps
of several nodes, and ``fused_elementwise`` (cgvm.ops.fused) runs the chain in one buffer.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

import numpy as np

from ..ir.types import DType

ACC = "acc"
LIT = "lit"

Operand = Any          # int (input index) | "acc" | ("lit", value, dtype_name)
Step = Tuple[str, Tuple[Operand, ...]]
Program = Tuple[Step, ...]

#: the ufuncs a program may call, with their number of operands
UFUNC_ARITY: Dict[str, int] = {
    **{name: 2 for name in ("add", "subtract", "multiply", "divide", "power", "maximum", "minimum", "remainder",
                            "floor_divide", "arctan2", "equal", "not_equal", "less", "less_equal", "greater",
                            "greater_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and",
                            "bitwise_or", "bitwise_xor")},
    **{name: 1 for name in ("negative", "positive", "square", "reciprocal", "absolute", "sign", "exp", "expm1",
                            "log", "log1p", "log2", "log10", "sqrt", "sin", "cos", "tan", "arcsin", "arccos",
                            "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh", "floor", "ceil",
                            "logical_not", "invert")},
}


def lit(value: Any, dtype: Any) -> Tuple[str, Any, str]:
    """A literal operand: ``value`` as a scalar of ``dtype``."""
    d = DType(dtype)
    return (LIT, np.asarray(value, d.np).item(), d.name)


def is_literal(operand: Operand) -> bool:
    return isinstance(operand, tuple)


def float_in_and_out(node: Any) -> bool:
    """Whether ``node`` reads a float input 0 and writes a float result (lowerings that compute in
    floating point, such as sigmoid's tanh form, need both)."""
    return node.outputs[0].dtype.is_float and node.inputs[0].dtype.is_float
