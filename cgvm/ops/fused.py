"""Fused ops: what the compiler's fusion passes put in place of several nodes.

``fused_elementwise(*inputs, program=..., dtype=..., shape_from_first=...)`` runs a chain of
elementwise ops as one kernel. Its ``program`` is a tuple of steps ``(ufunc_name, operands)``;
an operand is an input index ``k``, ``"acc"`` (the result of the steps so far) or a literal
``("lit", value, dtype_name)``. Every step's result has the output's dtype, and the result of
each step is the ``acc`` of the next, so the whole chain lives in ONE buffer:

* NumPy: one generated function calling the ufuncs in place (``ufunc(acc, x3, out=out)``), no
  temporaries. When every input holds one element (a float result), the chain is evaluated on
  scalars instead, which costs a fraction of a ufunc call on a 1-element array: float32 and
  float16 chains on NumPy scalars (NumPy's own arithmetic and promotion, so results agree with
  the array path bit for bit on + - * /), float64 chains on Python floats (IEEE double, ~5x
  cheaper still); a Python arithmetic error there (division by zero, a domain or range error)
  falls back to the ufunc path, so special values come out as NumPy's.
* CuPy: one generated ``cupy.ElementwiseKernel`` per program (cached), the chain kept in a
  register; programs with a step CUDA has no expression for run as in-place ufunc calls.

Input 0 is read by the first step only, so the output may overwrite it (``inplace=((0, 0),)``).
``shape_from_first`` says the first step's result already has the output's shape (the compiler
proved it), so a kernel without a planned buffer allocates by running that step.

``gemm_accumulate(a, b, c[, scale], alpha=..., beta=...)`` is ``beta * c + alpha [* scale] * a @ b``,
added into c's values by BLAS (see cgvm.compiler.accumulate).

``gemm_bias_act(a, b, bias, act=..., trans_a=..., trans_b=...)`` is ``act(op(a) @ op(b) + bias)``
and ``conv_bias_act(x, w[, b], act=..., <conv attributes>)`` is ``act(conv(x, w, b))``: the
product or convolution is written into the output buffer, the bias added and the activation
applied in place there. The fusion passes run after autodiff, so these ops carry no gradient.
"""
from __future__ import annotations

import functools
import hashlib
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import ShapeError
from ..ir.attrs import Any_, Bool, DTypeAttr, Float, Str
from ..ir.types import DType, TensorType, result_dtype
from . import conv as cv
from .conv_geometry import ConvGeometry
from .kernels.conv_im2col import conv_forward, conv_forward_scratch
from . import linalg as la
from .registry import OPAQUE, defop
from .rules import broadcast_shapes

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

# NumPy's names of the float functions and the C/Python math library's, where they differ
_LIBM_NAME = {"arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh", "arccosh": "acosh",
              "arctanh": "atanh"}
_FLOAT_FUNCS = ("exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "sin", "cos", "tan", "arcsin", "arccos",
                "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh", "floor", "ceil")
_PY_MATH_FUNCS = tuple(f for f in _FLOAT_FUNCS if f not in ("floor", "ceil"))

# float64 one-element chains: Python expressions over floats ({0}, {1} are operand names). Only
# ufuncs whose Python form agrees with NumPy on every value it does not raise for are here.
_PY_EXPR: Dict[str, str] = {
    "add": "({0} + {1})", "subtract": "({0} - {1})", "multiply": "({0} * {1})", "divide": "({0} / {1})",
    "negative": "(-{0})", "positive": "(+{0})", "square": "({0} * {0})", "reciprocal": "(1.0 / {0})",
    "absolute": "abs({0})", "power": "_pow({0}, {1})",
    "maximum": "({0} if ({0} >= {1} or {0} != {0}) else {1})",   # NaN wins, as in NumPy
    "minimum": "({0} if ({0} <= {1} or {0} != {0}) else {1})",
    **{f: f"_{f}({{0}})" for f in _PY_MATH_FUNCS}, "arctan2": "_arctan2({0}, {1})",
    "floor": "float(_floor({0}))", "ceil": "float(_ceil({0}))",
}
_PY_ENV = {"_pow": math.pow, "_arctan2": math.atan2, "_floor": math.floor, "_ceil": math.ceil,
           **{f"_{f}": getattr(math, _LIBM_NAME.get(f, f)) for f in _PY_MATH_FUNCS}}

# float32/float16 one-element chains on NumPy scalars: operators where NumPy's scalar math is
# the ufunc's (same promotion, same IEEE result), else the ufunc itself called on scalars
_NP_SCALAR_OPERATORS: Dict[str, str] = {
    "add": "({0} + {1})", "subtract": "({0} - {1})", "multiply": "({0} * {1})", "divide": "({0} / {1})",
    "negative": "(-{0})",
}

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
    "arctan2": "atan2({0}, {1})", **{f: _LIBM_NAME.get(f, f) + "({0})" for f in _FLOAT_FUNCS},
}
# integer and bool results only (NumPy has no float loop for these); ~ of a bool is its logical NOT
_CUDA_BITWISE: Dict[str, str] = {"bitwise_and": "{0} & {1}", "bitwise_or": "{0} | {1}", "bitwise_xor": "{0} ^ {1}",
                                 "invert": "~{0}"}
_CUDA_LOGIC: Dict[str, str] = {
    "equal": "{0} == {1}", "not_equal": "{0} != {1}", "less": "{0} < {1}", "less_equal": "{0} <= {1}",
    "greater": "{0} > {1}", "greater_equal": "{0} >= {1}", "logical_and": "{0} && {1}",
    "logical_or": "{0} || {1}", "logical_xor": "(bool){0} != (bool){1}", "logical_not": "!{0}",
}
_CTYPES = {"float16": "float16", "float32": "float", "float64": "double", "int8": "signed char",
           "int16": "short", "int32": "int", "int64": "long long", "uint8": "unsigned char",
           "uint16": "unsigned short", "uint32": "unsigned int", "uint64": "unsigned long long", "bool": "bool"}


def lit(value: Any, dtype: Any) -> Tuple[str, Any, str]:
    """A literal operand: ``value`` as a scalar of ``dtype``."""
    d = DType(dtype)
    return (LIT, np.asarray(value, d.np).item(), d.name)


def is_literal(operand: Operand) -> bool:
    return isinstance(operand, tuple)


# --------------------------------------------------------------------------- program checks

@functools.lru_cache(maxsize=1024)
def program_inputs(program: Program) -> int:
    """The number of inputs ``program`` reads; ValueError if it is malformed."""
    if not isinstance(program, tuple) or not program:
        raise ValueError("a fused program is a non-empty tuple of (ufunc, operands) steps")
    used: set = set()
    for i, step in enumerate(program):
        if not (isinstance(step, tuple) and len(step) == 2 and isinstance(step[1], tuple)):
            raise ValueError(f"step {i} of the fused program is not (ufunc, operands): {step!r}")
        name, operands = step
        if UFUNC_ARITY.get(name) != len(operands):
            want = UFUNC_ARITY.get(name)
            raise ValueError(f"step {i}: {name!r} " + ("is not a fusible ufunc" if want is None else
                                                       f"takes {want} operands, got {len(operands)}"))
        for r in operands:
            if r == ACC:
                if i == 0:
                    raise ValueError("the first step of a fused program has no accumulator to read")
            elif is_literal(r):
                if len(r) != 3 or r[0] != LIT or r[2] not in _CTYPES:
                    raise ValueError(f"step {i}: bad literal {r!r}; write it as ('lit', value, dtype name)")
            elif isinstance(r, int) and not isinstance(r, bool) and r >= 0:
                used.add(r)
            else:
                raise ValueError(f"step {i}: operand {r!r} is not an input index, 'acc' or a literal")
    n = max(used) + 1 if used else 0
    if used != set(range(n)):
        raise ValueError(f"the fused program skips inputs {sorted(set(range(n)) - used)}")
    if n and (0 not in program[0][1] or any(0 in ops for _, ops in program[1:])):
        raise ValueError("input 0 must be read by the first step only (the output may overwrite it)")
    return n


def _fused_infer(types: Sequence[TensorType], program: Program, dtype: DType, shape_from_first: bool) -> TensorType:
    n = program_inputs(program)
    if len(types) != n:
        raise ValueError(f"the fused program reads {n} inputs, the node has {len(types)}")
    return TensorType(broadcast_shapes(*[t.shape for t in types]), dtype)


fused_elementwise = defop(
    "fused_elementwise", num_inputs=(0, None), pattern=OPAQUE, inplace=((0, 0),), infer=_fused_infer,
    attrs={"program": Any_(), "dtype": DTypeAttr(), "shape_from_first": Bool(False)},
    doc="A chain of elementwise ufuncs run into one buffer: program = ((ufunc, operands), ...), an operand "
        "being an input index, 'acc' (the chain so far) or ('lit', value, dtype). Made by the fusion pass.")


# --------------------------------------------------------------------------- NumPy: generated code

def _literal_key(r: Operand) -> Tuple[str, str]:
    return (repr(r[1]), r[2])   # repr keeps -0.0 apart from 0.0


def _literal_numbers(program: Program) -> Dict[Tuple[str, str], int]:
    """A number per distinct literal: the generated code names it ``_c<k>`` (0-d array) or ``_s<k>`` (scalar)."""
    numbers: Dict[Tuple[str, str], int] = {}
    for _, operands in program:
        for r in operands:
            if is_literal(r):
                numbers.setdefault(_literal_key(r), len(numbers))
    return numbers


def _scalar_mode(program: Program, dtype: DType) -> Optional[str]:
    """How a one-element chain may skip the ufuncs: "python" (float64), "numpy" (other floats) or None."""
    if not dtype.is_float:
        return None
    if dtype.name == "float64" and all(name in _PY_EXPR for name, _ in program) and all(
            math.isfinite(float(r[1])) for _, ops in program for r in ops if is_literal(r)):
        return "python"
    return "numpy"


def _scalar_lines(program: Program, n: int, mode: str, lits: Dict[Tuple[str, str], int]) -> List[str]:
    """The one-element path: evaluate on scalars, then fill a one-element output."""
    xs = [f"x{k}" for k in range(n)]
    lines = ["  if " + " and ".join(f"{x}.size == 1" for x in xs) + ":"]
    body = []
    for name, operands in program:
        if mode == "python":
            args = [(repr(float(r[1])) if DType(r[2]).is_float else repr(r[1])) if is_literal(r)
                    else ("a" if r == ACC else f"v{r}") for r in operands]
            body.append(f"a = {_PY_EXPR[name].format(*args)}")
        else:
            args = [f"_s{lits[_literal_key(r)]}" if is_literal(r) else ("a" if r == ACC else f"v{r}")
                    for r in operands]
            expr = _NP_SCALAR_OPERATORS.get(name)
            body.append(f"a = {expr.format(*args)}" if expr else f"a = _{name}({', '.join(args)})")
    ndim = "x0.ndim" if n == 1 else f"max({', '.join(x + '.ndim' for x in xs)})"
    finish = ["if out is None:", f"  out = _empty(_ones[{ndim}], _D)", "out.fill(a)", "return out"]
    if mode == "python":
        lines += ["    try:"] + [f"      v{k} = {x}.item()" for k, x in enumerate(xs)]
        lines += ["      " + b for b in body]
        lines += ["    except _errors:", "      pass", "    else:"] + ["      " + f for f in finish]
    else:
        lines += [f"    v{k} = {x}.flat[0]" for k, x in enumerate(xs)]
        lines += ["    " + b for b in body] + ["    " + f for f in finish]
    return lines


@functools.lru_cache(maxsize=256)
def numpy_fused_kernel(program: Program, dtype_name: str, shape_from_first: bool) -> Callable:
    """The generated NumPy function ``fused(x0, x1, ..., out=None)`` for ``program`` (cached)."""
    dtype = DType(dtype_name)
    n = program_inputs(program)
    xs = [f"x{k}" for k in range(n)]
    env: Dict[str, Any] = dict(_PY_ENV, _empty=np.empty, _D=dtype.np, _errors=(ArithmeticError, ValueError),
                               _ones=tuple((1,) * d for d in range(65)), _broadcast=np.broadcast,
                               _bshapes=np.broadcast_shapes)
    lits = _literal_numbers(program)
    for _, operands in program:
        for r in operands:
            if is_literal(r):
                k = lits[_literal_key(r)]
                env[f"_c{k}"] = np.asarray(r[1], DType(r[2]).np)    # 0-d: the fastest ufunc operand
                env[f"_s{k}"] = DType(r[2]).np.type(r[1])          # a NumPy scalar, for the one-element path
    for name, _ in program:
        env[f"_{name}"] = getattr(np, name)
    lines = [f"def fused({''.join(x + ', ' for x in xs)}out=None):"]
    mode = _scalar_mode(program, dtype) if n else None
    if mode is not None:
        lines += _scalar_lines(program, n, mode, lits)

    def call(step: Step, target: Optional[str]) -> str:
        name, operands = step
        args = [f"_c{lits[_literal_key(r)]}" if is_literal(r) else ("out" if r == ACC else f"x{r}") for r in operands]
        if target is not None:
            args.append(f"out={target}")
        return f"_{name}({', '.join(args)})"

    if shape_from_first:
        first_into_out = call(program[0], "out")
        lines += ["  if out is None:", f"    out = {call(program[0], None)}", "  else:", f"    {first_into_out}"]
    else:
        if n == 0:
            shape = "()"
        elif n <= 32:
            shape = f"_broadcast({', '.join(xs)}).shape"
        else:
            shape = f"_bshapes({', '.join(x + '.shape' for x in xs)})"
        lines += ["  if out is None:", f"    out = _empty({shape}, _D)", f"  {call(program[0], 'out')}"]
    lines += [f"  {call(step, 'out')}" for step in program[1:]]
    lines.append("  return out")
    source = "\n".join(lines)
    exec(compile(source, f"<cgvm fused kernel {len(program)} steps>", "exec"), env)
    fused = env["fused"]
    fused.__cgvm_source__ = source
    return fused


def _generic_fused_kernel(xp: Any, program: Program, dtype: DType) -> Callable:
    """The program as in-place ufunc calls of array module ``xp`` (any backend)."""
    resolved = [(getattr(xp, name), operands) for name, operands in program]
    literals = {_literal_key(r): xp.asarray(r[1], dtype=DType(r[2]).np)
                for _, operands in program for r in operands if is_literal(r)}

    def fused(*xs: Any, out: Any = None) -> Any:
        if out is None:
            out = xp.empty(xp.broadcast(*xs).shape if xs else (), dtype=dtype.np)
        for ufunc, operands in resolved:
            ufunc(*[literals[_literal_key(r)] if is_literal(r) else (out if r == ACC else xs[r]) for r in operands],
                  out=out)
        return out
    return fused


# --------------------------------------------------------------------------- CuPy: one generated kernel

def cuda_operation(program: Program, dtype_name: str) -> Optional[str]:
    """The body of an ElementwiseKernel computing ``program`` into ``y`` (None: a step has no CUDA form)."""
    dtype = DType(dtype_name)
    if dtype.name == "float16":  # CuPy's half type lacks the math overloads: use the ufunc path
        return None
    ctype = _CTYPES[dtype.name]
    lines = [f"{ctype} acc;"]
    for name, operands in program:
        if name in _CUDA_LOGIC:
            template, cast = _CUDA_LOGIC[name], False
        elif name in _CUDA_ARITH:
            template, cast = _CUDA_ARITH[name], True
        elif name in _CUDA_FLOAT and dtype.is_float:
            template, cast = _CUDA_FLOAT[name], True
        elif name in _CUDA_BITWISE and not dtype.is_float:
            template, cast = ("!{0}" if name == "invert" and dtype.is_bool else _CUDA_BITWISE[name]), True
        else:
            return None
        args = []
        for r in operands:
            if is_literal(r):
                value = r[1]
                if isinstance(value, float) and not math.isfinite(value):
                    return None
                text = ("true" if value else "false") if isinstance(value, bool) else repr(value)
                args.append(f"(({ctype}){text})" if cast else f"(({_CTYPES[r[2]]}){text})")
            else:
                ref = "acc" if r == ACC else f"x{r}"
                args.append(f"(({ctype}){ref})" if cast else ref)
        lines.append(f"acc = ({ctype})({template.format(*args)});")
    lines.append("y = acc;")
    return "\n".join(lines)


@functools.lru_cache(maxsize=256)
def _cupy_elementwise_kernel(program: Program, dtype_name: str) -> Optional[Any]:
    import cupy  # only reached with the CuPy backend

    body = cuda_operation(program, dtype_name)
    if body is None:
        return None
    n = program_inputs(program)
    params = ", ".join(f"T{k} x{k}" for k in range(n))
    # a name stable across processes, so CuPy's on-disk kernel cache finds it again
    name = "cgvm_fused_" + hashlib.sha1(repr((program, dtype_name)).encode()).hexdigest()[:16]
    return cupy.ElementwiseKernel(params, f"{dtype_name} y", body, name)


def _cupy_fused_kernel(xp: Any, program: Program, dtype: DType) -> Callable:
    kernel = _cupy_elementwise_kernel(program, dtype.name) if program_inputs(program) else None
    if kernel is None:
        return _generic_fused_kernel(xp, program, dtype)

    def fused(*xs: Any, out: Any = None) -> Any:
        return kernel(*xs) if out is None else kernel(*xs, out)
    return fused


@fused_elementwise.kernel_factory
def _(xp, program, dtype, shape_from_first):
    if xp is np:
        return numpy_fused_kernel(program, dtype.name, shape_from_first)
    if getattr(xp, "ElementwiseKernel", None) is not None:
        return _cupy_fused_kernel(xp, program, dtype)
    return _generic_fused_kernel(xp, program, dtype)


# --------------------------------------------------------------------------- epilogues: bias + activation

ACTIVATIONS = ("none", "relu", "tanh", "sigmoid")


def apply_activation(xp: Any, act: str, y: Any) -> Any:
    """``act(y)`` computed in place in ``y`` (sigmoid as 0.5 tanh(y / 2) + 0.5, as the sigmoid op does)."""
    if act == "relu":
        xp.maximum(y, xp.asarray(0, dtype=y.dtype), out=y)
    elif act == "tanh":
        xp.tanh(y, out=y)
    elif act == "sigmoid":
        half = xp.asarray(0.5, dtype=y.dtype)
        xp.multiply(y, half, out=y)
        xp.tanh(y, out=y)
        xp.multiply(y, half, out=y)
        xp.add(y, half, out=y)
    return y


def _check_bias_fits(bias: TensorType, result: TensorType, what: str) -> None:
    """``bias`` must broadcast into ``result`` without growing it (it is added in place)."""
    if bias.ndim > result.ndim or any(b not in (1, None) and r is not None and b != r
                                      for b, r in zip(bias.shape[::-1], result.shape[::-1])):
        raise ShapeError(f"{what}: the bias {bias!r} does not broadcast into the result {result!r}")
    if result_dtype(result.dtype, bias.dtype) is not result.dtype:
        raise ShapeError(f"{what}: the bias {bias!r} would change the result's dtype {result.dtype}")


def _gemm_bias_act_infer(types, act, trans_a, trans_b):
    a, b, bias = types
    if trans_a or trans_b:
        result = la.gemm.infer([a, b], {"trans_a": trans_a, "trans_b": trans_b, "alpha": 1.0, "beta": 1.0})[0]
    else:
        result = la.matmul.infer([a, b], {})[0]
    if result.ndim == 0:
        raise ShapeError("gemm_bias_act needs a matrix or vector result, got a scalar")
    _check_bias_fits(bias, result, "gemm_bias_act")
    return result


gemm_bias_act = defop(
    "gemm_bias_act", num_inputs=3, pattern=OPAQUE, infer=_gemm_bias_act_infer,
    attrs={"act": Str("none", choices=ACTIVATIONS), "trans_a": Bool(False), "trans_b": Bool(False)},
    doc="act(op(a) @ op(b) + bias): matmul into the output buffer, then the bias added and the activation "
        "(none, relu, tanh, sigmoid) applied in place. op transposes a 2-D operand where asked.")


@gemm_bias_act.kernel_factory
def _(xp, act, trans_a, trans_b):
    def kernel(a, b, bias, out=None):
        y = xp.matmul(a.T if trans_a else a, b.T if trans_b else b, out=out)
        xp.add(y, bias, out=y)
        return apply_activation(xp, act, y)
    return kernel


# --------------------------------------------------------------------------- accumulating products

def _gemm_accumulate_infer(types, alpha, beta):
    a, b, c = types[:3]
    product = la.gemm.infer([a, b], {"trans_a": False, "trans_b": False, "alpha": 1.0, "beta": 1.0})[0]
    if len(types) == 4 and types[3].ndim != 0:
        raise ShapeError(f"gemm_accumulate: the scale must be a scalar, got {types[3]!r}")
    return TensorType(broadcast_shapes(product.shape, c.shape), result_dtype(product.dtype, c.dtype))


gemm_accumulate = defop(
    "gemm_accumulate", num_inputs=(3, 4), pattern=OPAQUE, infer=_gemm_accumulate_infer, inplace=((2, 0),),
    attrs={"alpha": Float(1.0), "beta": Float(1.0)},
    doc="beta * c + alpha [* scale] * a @ b for matrices a, b, c and the product broadcasting against each other as "
        "in the add it replaces: a weight update w - lr * (x.T @ g) added into w's values while BLAS "
        "writes the product (see cgvm.compiler.accumulate). c may be overwritten by the result.")


@gemm_accumulate.kernel_factory
def _(xp, alpha, beta):
    def kernel(a, b, c, scale=None, out=None):
        return la.product_plus(xp, a, b, c, alpha if scale is None else alpha * float(scale), beta, out)
    return kernel


def _conv_bias_act_infer(types, act, stride, pad, dilation, groups):
    return cv.conv.infer(types, {"stride": stride, "pad": pad, "dilation": dilation, "groups": groups})[0]


conv_bias_act = defop(
    "conv_bias_act", num_inputs=(2, 3), pattern=OPAQUE, infer=_conv_bias_act_infer,
    attrs=dict(cv.conv.attr_spec, act=Str("none", choices=ACTIVATIONS)),
    doc="act(conv(x, w[, b])): the convolution (its bias riding in the GEMM) written into the output buffer, "
        "then the activation (none, relu, tanh, sigmoid) applied in place.")


@conv_bias_act.kernel
def _(xp, x, w, b=None, *, act, stride, pad, dilation, groups, out=None, scratch=None):
    y = conv_forward(xp, x, w, b, ConvGeometry(x.ndim - 2, stride, pad, dilation, groups), out, scratch)
    return apply_activation(xp, act, y)


@conv_bias_act.scratch
def _(types, *, act, stride, pad, dilation, groups):
    return conv_forward_scratch(types, stride, pad, dilation, groups)

