"""CUDA code generation for CuPy: a fused elementwise program as one ``cupy.ElementwiseKernel``.

The program format is cgvm.ops.fused's (plain tuples, so this module needs nothing of the IR):
a tuple of steps ``(ufunc_name, operands)``, an operand being an input index ``k``, ``"acc"``
(the chain so far) or a literal ``("lit", value, dtype_name)``. The chain is kept in a register
and written to ``y`` once. ``cuda_operation`` returns None for a program with a step CUDA has no
expression for; ``elementwise_kernel`` then returns None too and the op runs its ufunc path.
"""
from __future__ import annotations

import functools
import hashlib
import math
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

ACC = "acc"

# NumPy's names of the float functions and the C/Python math library's, where they differ
LIBM_NAME = {"arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh", "arccosh": "acosh",
             "arctanh": "atanh"}
#: the float functions (NumPy's names) a program may call
FLOAT_FUNCS = ("exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "sin", "cos", "tan", "arcsin", "arccos",
               "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh", "floor", "ceil")

# CUDA C++ expressions; arithmetic operands are first cast to the output type, which is the type
# NumPy's loop computes in for these ufuncs. Comparisons and logic read their operands as they are.
_CUDA_ARITH: Dict[str, str] = {
    "add": "{0} + {1}", "subtract": "{0} - {1}", "multiply": "{0} * {1}", "divide": "{0} / {1}",
    "negative": "-{0}", "positive": "{0}", "square": "{0} * {0}",
    "maximum": "(({0} > {1} || {0} != {0}) ? {0} : {1})", "minimum": "(({0} < {1} || {0} != {0}) ? {0} : {1})",
}
_CUDA_FLOAT: Dict[str, str] = {
    "power": "pow({0}, {1})", "reciprocal": "1 / {0}", "absolute": "fabs({0})",
    "sign": "(({0} != {0}) ? {0} : ({0} > 0 ? 1 : ({0} < 0 ? -1 : 0)))",
    "arctan2": "atan2({0}, {1})", **{f: LIBM_NAME.get(f, f) + "({0})" for f in FLOAT_FUNCS},
}
# integer and bool results only (NumPy has no float loop for these); ~ of a bool is its logical NOT
_CUDA_BITWISE: Dict[str, str] = {"bitwise_and": "{0} & {1}", "bitwise_or": "{0} | {1}", "bitwise_xor": "{0} ^ {1}",
                                 "invert": "~{0}"}
_CUDA_LOGIC: Dict[str, str] = {
    "equal": "{0} == {1}", "not_equal": "{0} != {1}", "less": "{0} < {1}", "less_equal": "{0} <= {1}",
    "greater": "{0} > {1}", "greater_equal": "{0} >= {1}", "logical_and": "{0} && {1}",
    "logical_or": "{0} || {1}", "logical_xor": "(bool){0} != (bool){1}", "logical_not": "!{0}",
}
#: the C type of each dtype a program may compute in or name in a literal
CTYPES = {"float16": "float16", "float32": "float", "float64": "double", "int8": "signed char",
          "int16": "short", "int32": "int", "int64": "long long", "uint8": "unsigned char",
          "uint16": "unsigned short", "uint32": "unsigned int", "uint64": "unsigned long long", "bool": "bool"}


def cuda_operation(program: Tuple[Any, ...], dtype_name: str) -> Optional[str]:
    """The body of an ElementwiseKernel computing ``program`` into ``y`` (None: a step has no CUDA form)."""
    kind = np.dtype(dtype_name).kind
    is_float, is_bool = kind == "f", kind == "b"
    if dtype_name == "float16":  # CuPy's half type lacks the math overloads: use the ufunc path
        return None
    ctype = CTYPES[dtype_name]
    lines = [f"{ctype} acc;"]
    for name, operands in program:
        if name in _CUDA_LOGIC:
            template, cast = _CUDA_LOGIC[name], False
        elif name in _CUDA_ARITH:
            template, cast = _CUDA_ARITH[name], True
        elif name in _CUDA_FLOAT and is_float:
            template, cast = _CUDA_FLOAT[name], True
        elif name in _CUDA_BITWISE and not is_float:
            template, cast = ("!{0}" if name == "invert" and is_bool else _CUDA_BITWISE[name]), True
        else:
            return None
        args = []
        for r in operands:
            if isinstance(r, tuple):
                value = r[1]
                if isinstance(value, float) and not math.isfinite(value):
                    return None
                text = ("true" if value else "false") if isinstance(value, bool) else repr(value)
                args.append(f"(({ctype}){text})" if cast else f"(({CTYPES[r[2]]}){text})")
            else:
                ref = "acc" if r == ACC else f"x{r}"
                args.append(f"(({ctype}){ref})" if cast else ref)
        lines.append(f"acc = ({ctype})({template.format(*args)});")
    lines.append("y = acc;")
    return "\n".join(lines)


@functools.lru_cache(maxsize=256)
def _compiled_kernel(program: Tuple[Any, ...], dtype_name: str, n_inputs: int) -> Optional[Any]:
    import cupy  # only reached with the CuPy backend

    body = cuda_operation(program, dtype_name)
    if body is None:
        return None
    params = ", ".join(f"T{k} x{k}" for k in range(n_inputs))
    # a name stable across processes, so CuPy's on-disk kernel cache finds it again
    name = "cgvm_fused_" + hashlib.sha1(repr((program, dtype_name)).encode()).hexdigest()[:16]
    return cupy.ElementwiseKernel(params, f"{dtype_name} y", body, name)


def elementwise_kernel(program: Tuple[Any, ...], dtype_name: str, n_inputs: int) -> Optional[Callable]:
    """``fused(*xs, out=None)`` running ``program`` over ``n_inputs`` CuPy arrays as one generated
    kernel (compiled once per program and dtype), or None where the program has no CUDA form."""
    kernel = _compiled_kernel(program, dtype_name, n_inputs) if n_inputs else None
    if kernel is None:
        return None

    def fused(*xs: Any, out: Any = None) -> Any:
        return kernel(*xs) if out is None else kernel(*xs, out)
    return fused
