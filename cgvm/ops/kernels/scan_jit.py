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

    scan_loop(s0.., c0_in.., p0.., st0.., c0.., _w_<dtype>.., active, steps) -> stopped_after

sequences ``s``, initial carries ``c_in`` (read), non-sequences ``p``, the stacks ``st`` (rows
written by step), the arrays the final carries are written into ``c``, one work array per dtype
(the temporaries and the body's constants), and the Python loop's step range (0 to active); it
returns -1 unless an ``until`` condition held (then the steps run), -2 for arrays of other shapes.
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
MAX_SIGNATURES = 8            # compiled step signatures (shapes, dtypes, layouts) per scan; more stay in Python
SHAPE_MISMATCH = -2           # what a compiled loop returns as stopped_after for arrays of other shapes


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
    """One compiled step signature (shapes, dtypes and array layouts): ``fn`` and what it is
    called with besides the scan's own arrays."""

    def __init__(self, fn: Any, stack_types: Sequence[Tuple[tuple, Any]], carry_types: Sequence[Tuple[tuple, Any]],
                 work: Sequence[np.ndarray], source: str):
        self.fn = fn
        self.stack_types = list(stack_types)   # (row shape, NumPy dtype) per stack
        self.carry_types = list(carry_types)
        # the temporaries and the body's constants: one scan kernel runs one loop at a time, as a
        # frame runs one call
        self.work = tuple(work)
        self.source = source


class ScanJit:
    """The tier for one scan node: counts calls per step signature, compiles the hot one.

    ``run`` first calls the loop compiled last, whose own first lines check the shapes (a
    signature key costs more than the check); only a call it refuses looks its signature up."""

    def __init__(self, body: Graph, *, n_seqs: int, n_carry: int, kept: Sequence[int], go_backwards: bool,
                 has_until: bool, seq_order: bool, hot: int):
        self.body = body
        self.n_seqs, self.n_carry, self.kept = n_seqs, n_carry, list(kept)
        self.go_backwards, self.has_until, self.seq_order = go_backwards, has_until, seq_order
        self.hot = hot
        self.counts: Dict[tuple, int] = {}
        self.loops: Dict[tuple, Optional[CompiledLoop]] = {}
        self.last: Optional[CompiledLoop] = None
        self.dead = any(v.kind == PARAM for n in body.nodes for v in n.inputs) or any(
            n.op.stateful for n in body.nodes)
        self.why: Optional[str] = "reads parameters or draws random numbers" if self.dead else None

    def run(self, seqs: Sequence[Any], inits: Sequence[Any], nonseqs: Sequence[Any], active: int, steps: int,
            new_stack: Any) -> Optional[Tuple[List[Any], List[Any], int]]:
        """Every step of the loop (``active`` > 0 of ``steps``): ``(final carries, stacks, stopped_after)``
        (-1: it ran every active step), or None where this call runs the Python loop.
        ``new_stack(j, shape, dtype)`` allocates stack j."""
        loop = self.last
        if loop is not None:
            stacks = [new_stack(j, (steps,) + shape, dtype) for j, (shape, dtype) in enumerate(loop.stack_types)] \
                if loop.stack_types else []
            finals = [np.empty(shape, dtype) for shape, dtype in loop.carry_types]
            try:
                stopped = loop.fn(*seqs, *inits, *nonseqs, *stacks, *finals, *loop.work, active, steps)
            except TypeError:   # other dtypes or layouts: looked up below
                stopped = SHAPE_MISMATCH
            if stopped != SHAPE_MISMATCH:
                return finals, stacks, stopped
        if self.dead:
            return None
        args = [a if type(a) is np.ndarray else np.asarray(a) for a in (*seqs, *inits, *nonseqs)]
        S = self.n_seqs
        key = tuple((a.shape[1:] if k < S else a.shape, a.dtype.char, a.flags.c_contiguous, a.flags.f_contiguous,
                     a.flags.writeable, a.flags.aligned) for k, a in enumerate(args))
        loop = self.loops.get(key)
        if loop is None:
            if key in self.loops:
                return None
            n = self.counts.get(key, 0) + 1
            self.counts[key] = n
            if n <= self.hot or len(self.loops) >= MAX_SIGNATURES:
                return None
        try:
            if loop is None:
                self.loops[key] = None   # whatever happens below, this signature is tried once
                loop = self._compile([TensorType(k[0], DType(k[1])) for k in key], args, steps, new_stack)
                self.loops[key] = loop
            stacks = [new_stack(j, (steps,) + shape, dtype) for j, (shape, dtype) in enumerate(loop.stack_types)]
            finals = [np.empty(shape, dtype) for shape, dtype in loop.carry_types]
            stopped = loop.fn(*args, *stacks, *finals, *loop.work, active, steps)
            if stopped == SHAPE_MISMATCH:
                raise RuntimeError("the compiled loop refused the shapes it was compiled for")
        except lc.Unsupported as exc:   # this signature keeps the Python loop
            self.why = str(exc)
            return None
        except Exception as exc:        # Numba could not type or compile the body: never again
            self.why, self.dead, self.last = f"{type(exc).__name__}: {exc}", True, None
            return None
        self.last = loop
        return finals, stacks, stopped

    def _compile(self, in_types: List[TensorType], args: Sequence[Any], steps: int, new_stack: Any) -> CompiledLoop:
        source, env, stack_types, carry_types, work = generate(self, in_types)
        fn = define("scan_loop", source, env, f"compiled scan loop {self.body.name}")
        import numba   # only here: importing numba costs ~0.5 s, paid by hot loops alone

        # one signature, the types of this call's arrays (layouts, read-only): compiled now, and
        # another call's arrays are refused with a TypeError rather than compiled again
        stacks = [new_stack(j, (steps,) + shape, dtype) for j, (shape, dtype) in enumerate(stack_types)]
        finals = [np.empty(shape, dtype) for shape, dtype in carry_types]
        sig = tuple(numba.typeof(a) for a in (*args, *stacks, *finals, *work)) + (numba.types.int64,) * 2
        compiled = numba.njit(numba.types.int64(*sig), error_model="numpy", cache=False)(fn)
        return CompiledLoop(compiled, stack_types, carry_types, work, fn.__cgvm_source__)


def generate(jit: ScanJit, in_types: List[TensorType]):
    """Source lines, globals, stack and final carry types (shape, dtype) and the work arrays (the
    constants written in) of ``jit``'s body for concrete per-step input types."""
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
        else:   # in the work array (Numba would rebuild a global array from a pickle on every call)
            b = lc.Buf(f"k{len(consts)}", data.shape, dt, flat=True)
            consts.append((b, data))
        types[id(v)] = TensorType(data.shape, dt)
        invariant.add(id(v))
        bufs[id(v)] = b
        return b

    temps: List[lc.Buf] = []   # buffers of the body's values: views of one allocation per dtype
    prologue: List[str] = []   # invariant nodes: computed once, before the loop
    step: List[str] = []
    n_buf = 0
    # values something reads for more than their shape (a gradient's ones_like reads the forward
    # value's shape alone): the nodes computing nothing else are typed, never run
    wanted = {id(v) for v in body.outputs}
    for node in reversed(body.nodes):
        if any(id(o) in wanted for o in node.outputs):
            wanted.update(id(v) for k, v in enumerate(node.inputs) if not node.op.reads_only_shape(k))
    for node in body.nodes:
        run = any(id(o) in wanted for o in node.outputs)   # else typed only: a later node reads its shape
        for v in node.inputs:
            if v.kind == CONST:
                operand(v)
        in_types_ = [types[id(v)] for v in node.inputs]
        try:
            out_types = node.op.infer(in_types_, node.attrs)
        except Exception as exc:
            raise lc.Unsupported(f"{node.op.name}: {exc}") from None
        for o, t in zip(node.outputs, out_types):
            if None in t.shape:
                raise lc.Unsupported(f"{node.op.name} gives a shape known only at run time")
            types[id(o)] = t
        if not run:
            continue
        ins = [bufs[id(v)] if id(v) in bufs else lc.Buf("unread", types[id(v)].shape, types[id(v)].dtype)
               for v in node.inputs]   # an input only a shape is read of may have no buffer
        if len(node.outputs) == 1 and node.op.is_identity(in_types_, out_types[0]):
            bufs[id(node.outputs[0])] = ins[0]
            if id(node.inputs[0]) in invariant:
                invariant.add(id(node.outputs[0]))
            continue
        outs = []
        for o, t in zip(node.outputs, out_types):
            n_buf += 1
            b = lc.Buf(f"b{n_buf}", t.shape, t.dtype, flat=True)
            temps.append(b)
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
            tmp = lc.Buf(f"n{k}", o.shape, o.dtype, flat=True)
            temps.append(tmp)
            lc.copy(em, o, tmp)
            o = tmp
        news.append(o)
    for c, o in zip(carries, news):
        lc.copy(em, o, c)
    if jit.has_until:
        stop = outs[-1]
        if stop.size != 1:
            raise lc.Unsupported("an until condition of more than one element")
        em.line(f"if {stop.at(['0'] * stop.ndim)}:")
        with em.block():
            em.line("return t + 1")
    finish = em.lines[start:]
    del em.lines[start:]

    # the final carries are written into arrays the caller hands in (boxing arrays Numba made
    # costs more), the temporaries are views of work arrays allocated once per compiled loop
    params += [c.name for c in carries]
    work = _work(temps + [b for b, _ in consts])
    params += [name for name, _, _ in work]
    em.depth = 1
    checks = [f"{name}.shape[{a + (k < S)}] != {d}" for k, (name, t) in enumerate(zip(params, in_types))
              for a, d in enumerate(t.shape)]
    if checks:   # compiled for these shapes: refuse others (the caller looks their loop up)
        em.line(f"if {' or '.join(checks)}:")
        with em.block():
            em.line(f"return {SHAPE_MISMATCH}")
    for name, _, bufs in work:
        at = 0
        for b in bufs:
            n = max(b.size, 1)
            em.line(f"{b.name} = {name}[{at}:{at + n}]")
            at += n
    for c in carries:
        lc.copy(em, lc.Buf(f"{c.name}_in", c.shape, c.dtype), c)
    lines = [f"def scan_loop({', '.join(params + ['active', 'steps'])}):"] + em.lines + prologue
    lines += ["    for t in range(active):",
              f"        i = {'steps - 1 - t' if jit.go_backwards else 't'}"]
    lines += step + finish + ["    return -1"]
    carry_types = [(c.shape, c.dtype.np) for c in carries]
    work_arrays = []
    values = {b.name: data for b, data in consts}
    for _, dt, bufs in work:
        w, at = np.empty(sum(max(b.size, 1) for b in bufs), dt.np), 0
        for b in bufs:
            if b.name in values:   # a constant: written once, read by every call
                w[at:at + b.size] = values[b.name].ravel()
            at += max(b.size, 1)
        work_arrays.append(w)
    return lines, em.env, stack_types, carry_types, work_arrays


def _work(temps: Sequence[lc.Buf]) -> List[Tuple[str, DType, List[lc.Buf]]]:
    """The temporaries by dtype: (work array name, dtype, its buffers)."""
    by: Dict[str, List[lc.Buf]] = {}
    for b in temps:
        by.setdefault(b.dtype.name, []).append(b)
    return [(f"_w_{dt}", bufs[0].dtype, bufs) for dt, bufs in by.items()]


class _Scalar(lc.Buf):
    """A 0-d constant of the body as a global scalar: read as its name."""

    def __init__(self, name: str, dtype: DType):
        super().__init__(name, (), dtype)

    def at(self, idx: Sequence[str]) -> str:
        return self.name
