"""The compiled loop tier: a hot scan run as ONE Numba function (every step, carry and stack).

A scan over tiny arrays spends its time in NumPy's per-call dispatch: each step runs a handful of
kernels of ~1 us each on a few elements. Once a scan has run ``CGVM_JIT_HOT`` times with one step
signature (the shapes and dtypes of a sequence row, the carries and the non-sequences), its body
-- as the pipeline optimized it -- is written as one Python function of explicit loops over
constant bounds (each op through its ``@numba_lowering``, cgvm.ops.loop_code) and compiled by
Numba; the scan kernel (cgvm.ops.control) then calls it instead of its Python step loop.

* Optional: without numba (the ``jit`` extra), with ``CGVM_JIT=0``, on another backend than
  NumPy, or under the reference interpreter, scans run exactly as before.
* Fallback: a body with an op, dtype or shape the tier cannot write (``loop_code.Unsupported``)
  keeps the Python loop for that signature; a body Numba fails to compile keeps it for good.
  Neither is retried.
* Tiered: compiling costs about a second, so a scan compiles only once hot; ``CGVM_JIT_HOT=0``
  compiles at the first call (tests), and at most ``MAX_SIGNATURES`` signatures per scan.

The generated function (its source is ``fn.__cgvm_source__``, also ``CompiledLoop.source``):

    scan_loop(s0.., c0.., p0.., k0.., st0.., t0, active, steps) -> (carries..., stopped_after, last_t)

sequences ``s``, initial carries ``c`` (copied, never written), non-sequences ``p``, the body's
constants ``k``, the stacks ``st`` (allocated by the caller, rows written by step), and the same
step range as the Python loop's; ``stopped_after`` is -1 unless an ``until`` condition held.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import ConfigError
from ...ir.graph import CONST, PARAM, Graph
from ...ir.types import DType, TensorType
from ...pycode import define
from .. import loop_code as lc

ENV_SWITCH = "CGVM_JIT"       # 0/false/no/off: never compile loops; unset or 1/true/yes: when hot
ENV_HOT = "CGVM_JIT_HOT"      # calls with one signature before a scan is compiled; 0: at its first call
DEFAULT_HOT = 32              # the test suite's scans run a few calls each: they never pay a compile
MAX_SIGNATURES = 8            # compiled step signatures per scan; more keep the Python loop
#: Numba compiles a variant per argument layout (C, F, strided, read-only): a scan called with
#: more variants than this stays in Python, rather than compiling on and on
MAX_VARIANTS = 4
FROZEN_CONST_SIZE = 4096      # body constants up to this many elements are compiled into the code


def _numba_installed() -> bool:
    return importlib.util.find_spec("numba") is not None


def hot_threshold() -> Optional[int]:
    """Calls before a scan compiles, or None when the tier is off (CGVM_JIT=0, or no numba)."""
    raw = os.environ.get(ENV_SWITCH, "").strip().lower()
    if raw in ("0", "false", "no", "off"):
        return None
    if raw not in ("", "1", "true", "yes", "on"):
        raise ConfigError(f"{ENV_SWITCH}={os.environ[ENV_SWITCH]!r} is neither on (1, true, yes) nor off "
                          "(0, false, no, off)")
    if not _numba_installed():
        return None
    hot = os.environ.get(ENV_HOT, "").strip()
    if not hot:
        return DEFAULT_HOT
    try:
        n = int(hot)
    except ValueError:
        n = -1
    if n < 0:
        raise ConfigError(f"{ENV_HOT}={hot!r} is not a count of calls (0 or more)")
    return n


class CompiledLoop:
    """One compiled signature: ``loop(seqs, inits, nonseqs, stacks, active, steps) -> (carries,
    stopped_after or None, last_t)`` or None where the call failed (the tier then stays off)."""

    def __init__(self, owner: "ScanJit", fn: Any, consts: Sequence[np.ndarray],
                 stack_types: Sequence[Tuple[tuple, Any]], n_carry: int, source: str):
        self.owner, self.fn, self.consts = owner, fn, tuple(consts)
        self.stack_types = list(stack_types)   # (row shape, NumPy dtype) per stack
        self.n_carry = n_carry
        self.source = source

    def __call__(self, seqs: Sequence[Any], inits: Sequence[Any], nonseqs: Sequence[Any], stacks: Sequence[Any],
                 active: int, steps: int) -> Optional[Tuple[List[Any], Optional[int], int]]:
        args = [a if type(a) is np.ndarray else np.asarray(a) for a in (*seqs, *inits, *nonseqs)]
        try:
            res = self.fn(*args, *self.consts, *stacks, 0, active, steps)
            if len(self.fn.overloads) > MAX_VARIANTS:
                raise RuntimeError(f"called with {len(self.fn.overloads)} argument layouts")
        except Exception as exc:   # Numba could not type or compile it: the Python loop, for good
            self.owner.dead, self.owner.why = True, f"{type(exc).__name__}: {exc}"
            return None
        n = self.n_carry
        stopped = res[n]
        return list(res[:n]), (None if stopped < 0 else stopped), res[n + 1]


class ScanJit:
    """The tier for one scan node: counts calls per step signature, compiles the hot one."""

    def __init__(self, body: Graph, *, n_seqs: int, n_carry: int, kept: Sequence[int], go_backwards: bool,
                 has_until: bool, seq_order: bool, hot: int):
        self.body = body
        self.n_seqs, self.n_carry, self.kept = n_seqs, n_carry, list(kept)
        self.go_backwards, self.has_until, self.seq_order = go_backwards, has_until, seq_order
        self.hot = hot
        self.counts: Dict[tuple, int] = {}
        self.loops: Dict[tuple, Optional[CompiledLoop]] = {}
        self.dead = any(v.kind == PARAM for n in body.nodes for v in n.inputs) or any(
            n.op.stateful for n in body.nodes)
        self.why: Optional[str] = "reads parameters or draws random numbers" if self.dead else None

    def loop_for(self, seqs: Sequence[Any], carries: Sequence[Any], nonseqs: Sequence[Any]) -> Optional[CompiledLoop]:
        """The compiled loop for this call's step signature, once hot; None: run the Python loop."""
        if self.dead:
            return None
        key = tuple([(s.shape[1:], s.dtype) for s in seqs] + [(a.shape, a.dtype) for a in carries]
                    + [(a.shape, a.dtype) for a in nonseqs])
        loop = self.loops.get(key)
        if loop is not None or key in self.loops:
            return loop
        n = self.counts.get(key, 0) + 1
        self.counts[key] = n
        if n <= self.hot or len(self.loops) >= MAX_SIGNATURES:
            return None
        try:
            loop = self._compile([TensorType(shape, DType(dt)) for shape, dt in key])
        except lc.Unsupported as exc:   # this signature keeps the Python loop
            self.why, loop = str(exc), None
        except Exception as exc:        # Numba could not type or compile the body: never again
            self.why, loop, self.dead = f"{type(exc).__name__}: {exc}", None, True
        self.loops[key] = loop
        return loop

    # -- code generation -----------------------------------------------------------
    def _compile(self, in_types: List[TensorType]) -> CompiledLoop:
        source, env, consts, stack_types = generate(self, in_types)
        fn = define("scan_loop", source, env, f"compiled scan loop {self.body.name}")
        import numba   # only here: importing numba costs ~0.5 s, paid by hot loops alone

        # compiled at the first call, for the layouts of its arrays (a signature given here would
        # refuse read-only or Fortran-ordered arguments instead)
        compiled = numba.njit(error_model="numpy", cache=False)(fn)
        return CompiledLoop(self, compiled, consts, stack_types, self.n_carry, fn.__cgvm_source__)


def generate(jit: ScanJit, in_types: List[TensorType]):
    """Source lines, globals, constant arguments and stack types (row shape, dtype) of ``jit``'s
    body for concrete per-step input types."""
    body, S, C = jit.body, jit.n_seqs, jit.n_carry
    em = lc.Emitter({"np": np})
    bufs: Dict[int, lc.Buf] = {}
    invariant = set()
    params, consts = [], []
    for k, (v, t) in enumerate(zip(body.inputs, in_types)):
        if t.dtype is not v.dtype or len(t.shape) != v.ndim:
            raise lc.Unsupported(f"input {k} is {t!r}, the body expects {v.type!r}")
        em.cast(t.dtype)
        if k < S:
            name, buf = f"s{k}", lc.Buf(f"s{k}", t.shape, t.dtype, lead="i")
        elif k < S + C:
            name = f"c{k - S}_in"
            buf = lc.Buf(f"c{k - S}", t.shape, t.dtype)
        else:
            name = f"p{k - S - C}"
            buf = lc.Buf(name, t.shape, t.dtype)
            invariant.add(id(v))
        params.append(name)
        bufs[id(v)] = buf
    carries = [bufs[id(v)] for v in body.inputs[S:S + C]]
    types: Dict[int, TensorType] = {id(v): t for v, t in zip(body.inputs, in_types)}

    def operand(v) -> lc.Buf:
        hit = bufs.get(id(v))
        if hit is not None:
            return hit
        if v.kind != CONST:
            raise lc.Unsupported(f"value {v.label()} is {v.kind}")
        data = np.ascontiguousarray(v.data)
        dt = DType(data.dtype)
        em.cast(dt)
        if data.ndim == 0:   # a literal: a frozen global scalar, folded by LLVM
            b: lc.Buf = _Scalar(em.const(data[()], dt), dt)
        elif data.size <= FROZEN_CONST_SIZE:   # Numba freezes a global array into the code
            name = em.fresh("g")
            em.env[name] = data
            b = lc.Buf(name, data.shape, dt)
        else:
            name = f"k{len(consts)}"
            consts.append(data)
            params.append(name)
            b = lc.Buf(name, data.shape, dt)
        types[id(v)] = TensorType(data.shape, dt)
        invariant.add(id(v))
        bufs[id(v)] = b
        return b

    alloc: List[str] = []
    prologue: List[str] = []   # invariant nodes: computed once, before the loop
    step: List[str] = []
    n_buf = 0
    for node in body.nodes:
        ins = [operand(v) for v in node.inputs]
        in_types_ = [types[id(v)] for v in node.inputs]
        try:
            out_types = node.op.infer(in_types_, node.attrs)
        except Exception as exc:
            raise lc.Unsupported(f"{node.op.name}: {exc}") from None
        for o, t in zip(node.outputs, out_types):
            if None in t.shape:
                raise lc.Unsupported(f"{node.op.name} gives a shape known only at run time")
            types[id(o)] = t
        if len(node.outputs) == 1 and node.op.is_identity(in_types_, out_types[0]):
            bufs[id(node.outputs[0])] = ins[0]
            if id(node.inputs[0]) in invariant:
                invariant.add(id(node.outputs[0]))
            continue
        outs = []
        for o, t in zip(node.outputs, out_types):
            n_buf += 1
            b = lc.Buf(f"b{n_buf}", t.shape, t.dtype)
            alloc.append(f"    {b.name} = np.empty({b.shape!r}, {em.cast(t.dtype)})")
            bufs[id(o)] = b
            outs.append(b)
        reads = [v for k, v in enumerate(node.inputs) if not node.op.reads_only_shape(k)]
        hoist = all(id(v) in invariant for v in reads)
        start = len(em.lines)
        em.depth = 1 if hoist else 2
        lc.emit_node(node, em, ins, outs)
        (prologue if hoist else step).extend(em.lines[start:])
        del em.lines[start:]
        if hoist:
            invariant.update(id(o) for o in node.outputs)

    outs = [operand(v) for v in body.outputs]
    for k, (c, o) in enumerate(zip(carries, outs[:C])):
        if c.shape != o.shape or c.dtype is not o.dtype:
            raise lc.Unsupported(f"carry {k} changes from {c.shape} {c.dtype.name} to {o.shape} {o.dtype.name}")

    em.depth = 2
    start = len(em.lines)
    row = "i" if jit.seq_order else "t"
    stack_types = []
    for j, k in enumerate(jit.kept):
        src = outs[k]
        st = lc.Buf(f"st{j}", src.shape, src.dtype, lead=row)
        params.append(st.name)
        stack_types.append((src.shape, src.dtype.np))
        lc.copy(em, src, st)
    # a carry whose new value is a carry buffer itself (a swap, an unchanged carry) is read through
    # a copy taken before any carry is overwritten
    carry_names = {c.name for c in carries}
    news = []
    for k, o in enumerate(outs[:C]):
        if o.name in carry_names:
            tmp = lc.Buf(f"n{k}", o.shape, o.dtype)
            alloc.append(f"    {tmp.name} = np.empty({tmp.shape!r}, {em.cast(o.dtype)})")
            lc.copy(em, o, tmp)
            o = tmp
        news.append(o)
    for c, o in zip(carries, news):
        lc.copy(em, o, c)
    finals = "".join(f"{c.name}, " for c in carries)
    if jit.has_until:
        stop = outs[-1]
        if stop.size != 1:
            raise lc.Unsupported("an until condition of more than one element")
        em.line(f"if {stop.at(['0'] * stop.ndim)}:")
        with em.block():
            em.line(f"return ({finals}t + 1, t)")
    finish = em.lines[start:]
    del em.lines[start:]

    em.depth = 1
    for c, v in zip(carries, body.inputs[S:S + C]):
        em.line(f"{c.name} = np.empty({c.shape!r}, {em.cast(c.dtype)})")
        lc.copy(em, lc.Buf(f"{c.name}_in", c.shape, c.dtype), c)
    init = em.lines[:]
    lines = [f"def scan_loop({', '.join(params + ['t0', 'active', 'steps'])}):"] + alloc + init + prologue
    lines += ["    t = t0 - 1", "    for t in range(t0, active):",
              f"        i = {'steps - 1 - t' if jit.go_backwards else 't'}"]
    lines += step + finish + [f"    return ({finals}-1, t)"]
    return lines, em.env, consts, stack_types


class _Scalar(lc.Buf):
    """A 0-d constant of the body as a global scalar: read as its name."""

    def __init__(self, name: str, dtype: DType):
        super().__init__(name, (), dtype)

    def at(self, idx: Sequence[str]) -> str:
        return self.name
