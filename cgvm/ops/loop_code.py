"""The format of Numba lowerings: how an op writes itself as source inside one compiled loop.

The compiled loop tier (cgvm.ops.kernels.scan_jit) turns a whole scan -- every step, carry,
sequence and stack -- into one Numba function. Every value of the body gets a buffer of its
concrete shape, allocated once before the loop; each node writes its result into its buffer
with explicit loops over constant bounds (for the tiny arrays of a hot small loop these beat
any library call, and need no BLAS inside Numba). An op says how, beside its other facts:

    @matmul.numba_lowering
    def _(node, em, ins, outs):      # ins, outs: Buf (a source name, a concrete shape, a dtype)
        if <not these types>:
            return False             # the loop runs in Python, as without the tier
        with em.loops(outs[0].shape) as idx:
            em.line(f"{outs[0].at(idx)} = ...")

Elementwise ops need no lowering of their own: their ufunc steps (``op.elementwise_steps``, the
ones fusion reads) are written through ``SCALAR_EXPR``, one scalar expression per ufunc.
``emit_node`` is the one dispatch; ``Unsupported`` stops the tier for a body.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..ir.types import DType
from .ufunc_steps import ACC, is_literal

#: dtypes the tier computes in (the buffers' and every intermediate scalar's)
DTYPES = frozenset({"float64", "float32", "int64", "int32", "bool"})

#: each ufunc as a Numba scalar expression; {0}, {1} are operand expressions. Numba's NumPy
#: functions on scalars keep float32 as float32; each result is cast to the step's dtype after
_FUNCS = ("exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "sin", "cos", "tan", "arcsin", "arccos",
          "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh", "floor", "ceil", "sign")
SCALAR_EXPR: Dict[str, str] = {
    "add": "({0} + {1})", "subtract": "({0} - {1})", "multiply": "({0} * {1})", "divide": "np.divide({0}, {1})",
    "negative": "(-{0})", "positive": "(+{0})", "square": "({0} * {0})", "reciprocal": "np.reciprocal({0})",
    "absolute": "np.abs({0})", "power": "np.power({0}, {1})", "maximum": "np.maximum({0}, {1})",
    "minimum": "np.minimum({0}, {1})", "arctan2": "np.arctan2({0}, {1})",
    "equal": "({0} == {1})", "not_equal": "({0} != {1})", "less": "({0} < {1})", "less_equal": "({0} <= {1})",
    "greater": "({0} > {1})", "greater_equal": "({0} >= {1})",
    "logical_and": "np.logical_and({0}, {1})", "logical_or": "np.logical_or({0}, {1})",
    "logical_not": "np.logical_not({0})",
    **{f: f"np.{f}({{0}})" for f in _FUNCS},
}


class Unsupported(Exception):
    """The body has something the tier cannot write (an op without a lowering, a dtype, a shape)."""


class Buf:
    """A value inside the generated loop: its source ``name``, concrete ``shape`` and ``dtype``.
    ``lead`` indexes it first (a sequence's row ``i``, a stack's row ``t``)."""

    __slots__ = ("name", "shape", "dtype", "lead", "flat")

    def __init__(self, name: str, shape: Sequence[int], dtype: DType, lead: Optional[str] = None,
                 flat: bool = False):
        self.name, self.shape, self.dtype, self.lead = name, tuple(int(d) for d in shape), dtype, lead
        # flat: a C-ordered run of a 1-D array, indexed by constant strides (which LLVM folds into
        # the addresses; a shaped view's strides are values it reads at run time)
        self.flat = flat

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def at(self, idx: Sequence[str]) -> str:
        """The element at index expressions ``idx`` (one per axis)."""
        if self.flat:
            terms = [f"({i}) * {int(np.prod(self.shape[k + 1:], dtype=np.int64))}" if k + 1 < len(idx) else f"({i})"
                     for k, i in enumerate(idx)]
            return f"{self.name}[{' + '.join(terms) or '0'}]"
        parts = ([self.lead] if self.lead else []) + list(idx)
        return f"{self.name}[{', '.join(parts)}]" if parts else f"{self.name}[()]"

    def at_broadcast(self, idx: Sequence[str], shape: Sequence[int]) -> str:
        """The element read at ``idx`` of the broadcast ``shape`` (NumPy's rules: aligned right,
        size-1 axes repeat)."""
        off = len(shape) - self.ndim
        return self.at(["0" if d == 1 else idx[j + off] for j, d in enumerate(self.shape)])

    def __repr__(self) -> str:
        return f"Buf({self.name}, {self.shape}, {self.dtype.name})"


class Emitter:
    """Source lines of one generated function, at the current indentation, and the globals they use."""

    def __init__(self, env: Dict[str, Any]):
        self.lines: List[str] = []
        self.env = env
        self.depth = 1
        self._names = 0

    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def fresh(self, stem: str = "x") -> str:
        self._names += 1
        return f"_{stem}{self._names}"

    def const(self, value: Any, dtype: Any) -> str:
        """A global holding the scalar ``value`` of ``dtype`` (Numba freezes it as a constant)."""
        d = DType(dtype)
        name = self.fresh("k")
        self.env[name] = np.asarray(value, d.np)[()]
        return name

    def cast(self, dtype: DType) -> str:
        """The scalar constructor of ``dtype`` in the generated source."""
        if dtype.name not in DTYPES:
            raise Unsupported(f"dtype {dtype.name}")
        return "np.bool_" if dtype.name == "bool" else f"np.{dtype.name}"

    @contextlib.contextmanager
    def block(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    @contextlib.contextmanager
    def loops(self, shape: Sequence[int]) -> Iterator[List[str]]:
        """Nested ``for`` loops over ``shape``; yields the index names, the body indented inside."""
        idx = []
        for d in shape:
            name = self.fresh("i")
            self.line(f"for {name} in range({int(d)}):")
            self.depth += 1
            idx.append(name)
        try:
            yield idx
        finally:
            self.depth -= len(shape)


# --------------------------------------------------------------------------- what lowerings share

def elementwise(em: Emitter, steps: Sequence[Tuple[str, tuple]], ins: Sequence[Buf], out: Buf) -> None:
    """Ufunc ``steps`` (cgvm.ops.ufunc_steps; operands index ``ins``) element by element into
    ``out``, every step's result in ``out``'s dtype, the chain in a register."""
    cast = em.cast(out.dtype)
    for b in ins:
        em.cast(b.dtype)
    lits: Dict[Tuple[str, str], str] = {}
    for name, _ in steps:
        if name not in SCALAR_EXPR:
            raise Unsupported(f"ufunc {name}")
    with em.loops(out.shape) as idx:
        acc = em.fresh("acc")
        for name, operands in steps:
            args = []
            for r in operands:
                if r == ACC:
                    args.append(acc)
                elif is_literal(r):
                    key = (repr(r[1]), r[2])
                    if key not in lits:
                        lits[key] = em.const(r[1], r[2])
                    args.append(lits[key])
                else:
                    args.append(ins[r].at_broadcast(idx, out.shape))
            em.line(f"{acc} = {cast}({SCALAR_EXPR[name].format(*args)})")
        em.line(f"{out.at(idx)} = {acc}")


def fill(em: Emitter, out: Buf, value: Any) -> None:
    k = em.const(value, out.dtype)
    with em.loops(out.shape) as idx:
        em.line(f"{out.at(idx)} = {k}")


def copy(em: Emitter, src: Buf, out: Buf) -> None:
    """``out[...] = src`` with broadcasting."""
    with em.loops(out.shape) as idx:
        em.line(f"{out.at(idx)} = {src.at_broadcast(idx, out.shape)}")


def reshape(em: Emitter, src: Buf, out: Buf) -> None:
    """``out`` = ``src`` in C order with another shape. Where only size-1 axes differ (expand_dims,
    squeeze, most reshapes of a hot loop) indices map directly; otherwise by flat position."""
    if src.size != out.size:
        raise Unsupported(f"reshape of {src.shape} to {out.shape}")
    with em.loops(out.shape) as idx:
        if [d for d in src.shape if d != 1] == [d for d in out.shape if d != 1]:
            real = iter(i for i, d in zip(idx, out.shape) if d != 1)
            em.line(f"{out.at(idx)} = {src.at(['0' if d == 1 else next(real) for d in src.shape])}")
            return
        flat = " + ".join(f"{i} * {int(np.prod(out.shape[k + 1:], dtype=np.int64))}" for k, i in enumerate(idx)) or "0"
        f = em.fresh("f")
        em.line(f"{f} = {flat}")
        src_idx = []
        for k in range(src.ndim):
            stride = int(np.prod(src.shape[k + 1:], dtype=np.int64))
            src_idx.append(f"({f} // {stride}) % {src.shape[k]}")
        em.line(f"{out.at(idx)} = {src.at(src_idx)}")


def transpose(em: Emitter, src: Buf, out: Buf, perm: Sequence[int]) -> None:
    """``out`` = ``src`` with axes permuted (out axis k is src axis perm[k])."""
    with em.loops(out.shape) as idx:
        src_idx = [""] * src.ndim
        for k, p in enumerate(perm):
            src_idx[p] = idx[k]
        em.line(f"{out.at(idx)} = {src.at(src_idx)}")


def sum_to(em: Emitter, g: Buf, out: Buf) -> None:
    """``out`` = ``g`` summed over the axes along which ``out``'s shape broadcasts to ``g``'s."""
    zero = em.const(0, out.dtype)
    with em.loops(out.shape) as idx:
        em.line(f"{out.at(idx)} = {zero}")
    with em.loops(g.shape) as idx:
        em.line(f"{out.at_broadcast(idx, g.shape)} += {g.at(idx)}")


def activation(em: Emitter, act: str, x: str, dtype: DType) -> str:
    """The expression of activation ``act`` (none, relu, tanh, sigmoid, as cgvm.ops.fused applies
    them: sigmoid as 0.5 tanh(x / 2) + 0.5) of the scalar expression ``x``."""
    if act == "none":
        return x
    cast = em.cast(dtype)
    if act == "relu":
        return f"np.maximum({cast}({x}), {em.const(0, dtype)})"
    if act == "tanh":
        return f"np.tanh({cast}({x}))"
    if act == "sigmoid":
        half = em.const(0.5, dtype)
        return f"({cast}(np.tanh({cast}({cast}({x}) * {half})) * {half}) + {half})"
    raise Unsupported(f"activation {act}")


REDUCE_INIT = {"sum": 0, "prod": 1, "max": -np.inf, "min": np.inf}


def reduce(em: Emitter, x: Buf, out: Buf, axes: Sequence[int], keepdims: bool, kind: str) -> None:
    """``out`` = the ``kind`` (sum, prod, max, min) of ``x`` over ``axes``. max and min are NumPy's:
    a NaN wins; they take float inputs only (and at least one element)."""
    if kind in ("max", "min") and (not x.dtype.is_float or x.size == 0):
        raise Unsupported(f"{kind} of {x.dtype.name} or of no elements")
    em.cast(x.dtype)
    init = em.const(REDUCE_INIT[kind], out.dtype)
    with em.loops(out.shape) as idx:
        em.line(f"{out.at(idx)} = {init}")
    axes = set(axes)
    with em.loops(x.shape) as idx:
        if keepdims:
            o = ["0" if k in axes else i for k, i in enumerate(idx)]
        else:
            o = [i for k, i in enumerate(idx) if k not in axes]
        target, v = out.at(o), x.at(idx)
        if kind == "sum":
            em.line(f"{target} += {v}")
        elif kind == "prod":
            em.line(f"{target} *= {v}")
        else:
            cmp = ">" if kind == "max" else "<"
            t = em.fresh("v")
            em.line(f"{t} = {v}")
            em.line(f"if {t} {cmp} {target} or {t} != {t}:")
            with em.block():
                em.line(f"{target} = {t}")


#: products up to this many multiply-adds are written as loops; a larger one is BLAS's work, and a
#: body that has one stays in the Python loop (where one library call per step costs little)
MAX_PRODUCT = 1 << 15


def product(em: Emitter, a: Buf, b: Buf, out: Buf, trans_a: bool = False, trans_b: bool = False,
            epilogue: Optional[Any] = None) -> None:
    """``out`` = op(a) @ op(b) for 1-D and 2-D operands (numpy.matmul's rules for vectors), as
    loops; ``epilogue(acc, idx) -> expression`` finishes each element (a bias, an activation)."""
    if a.ndim not in (1, 2) or b.ndim not in (1, 2) or ((trans_a or trans_b) and (a.ndim != 2 or b.ndim != 2)):
        raise Unsupported(f"product of ranks {a.ndim} and {b.ndim}")
    for buf in (a, b, out):
        em.cast(buf.dtype)
    a_rows = (a.shape[1] if trans_a else a.shape[0]) if a.ndim == 2 else None
    k = a.shape[0 if trans_a else -1] if a.ndim == 2 else a.shape[0]
    b_cols = (b.shape[0] if trans_b else b.shape[1]) if b.ndim == 2 else None
    if (a_rows or 1) * (b_cols or 1) * k > MAX_PRODUCT:
        raise Unsupported(f"a product of {(a_rows or 1) * (b_cols or 1) * k} multiply-adds")
    cast = em.cast(out.dtype)
    zero = em.const(0, out.dtype)
    with em.loops(out.shape) as idx:
        i = idx[0] if a_rows is not None else None
        j = idx[-1] if b_cols is not None else None
        acc, kk = em.fresh("acc"), em.fresh("k")
        em.line(f"{acc} = {zero}")
        em.line(f"for {kk} in range({k}):")
        with em.block():
            ai = ([kk, i] if trans_a else [i, kk]) if i is not None else [kk]
            bi = ([j, kk] if trans_b else [kk, j]) if j is not None else [kk]
            em.line(f"{acc} += {a.at(ai)} * {b.at(bi)}")
        em.line(f"{out.at(idx)} = {cast}({epilogue(acc, idx) if epilogue else acc})")


def emit_node(node: Any, em: Emitter, ins: Sequence[Buf], outs: Sequence[Buf]) -> None:
    """Write ``node`` (its op's ``@numba_lowering``, else its ufunc steps); Unsupported if neither."""
    op = node.op
    if op.numba_code is not None:
        if op.numba_code(node, em, list(ins), list(outs)) is False:
            raise Unsupported(f"op {op.name} for {[b.shape for b in ins]}")
        return
    steps = op.elementwise_steps(node)
    if steps is None:
        raise Unsupported(f"op {op.name} has no Numba lowering")
    elementwise(em, steps, ins, outs[0])
