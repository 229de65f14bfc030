"""The VM: runs a Program on a backend, over a Workspace, in buffers planned per input signature.

Loading binds every CALL's kernel for the backend with its attributes, once. For each new
signature of input (and parameter) shapes a Frame is prepared: slot types inferred, memory
planned, buffers allocated, and the instructions lowered for fast execution, either to flat
tuples for the loop interpreter (``engine="loop"``: the simple one, easy to subclass and
trace) or to threaded code (``engine="threaded"``, the default: see threaded.py). A failing
instruction re-raises with the program counter, its disassembly and the node's source.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

from ..backend.threads import ensure_configured
from ..errors import CgvmError, ExecutionError, IndexOutOfBoundsError, InputError
from ..ir.types import DType, TensorType
from ..ops.scratch import aligned_empty
from .bytecode import CALL, FREE, Program
from .threaded import lower
from .workspace import Workspace

# lowered instruction kinds of the loop interpreter
_FREE, _U, _B, _UO, _BO, _N = 0, 1, 2, 3, 4, 5

Planner = Callable[[Program, Sequence[TensorType]], Any]
ENGINES = ("threaded", "loop")


class Frame:
    """What one input signature needs: slot types, memory plan, buffers and the runnable code."""

    __slots__ = ("run", "program", "types", "plan", "buffers", "code", "line_pc", "recycle_bin")

    def __init__(self, run, program, types, plan, buffers, code=None, line_pc=None, recycle_bin=None):
        self.run = run            # run(*inputs) -> tuple of outputs
        self.program = program    # the program it runs: specialized for this signature
        self.types = types
        self.plan = plan
        self.buffers = buffers
        self.code = code          # loop engine: lowered tuples
        self.line_pc = line_pc    # threaded engine: line number -> pc
        # one entry per recyclable output (see Executable.recyclable): a buffer its kernel may
        # write into on the next call, refilled by the caller; None means allocate, False never
        self.recycle_bin = recycle_bin if recycle_bin is not None else []


class Executable:
    """A Program loaded for one backend and workspace. ``run(args)`` returns the list of outputs."""

    def __init__(self, program: Program, workspace: Workspace, *, planner: Optional[Planner] = None,
                 infer: Optional[Callable] = None, specialize: Optional[Callable] = None, runtime: Any = None,
                 engine: str = "threaded", recyclable: Sequence[int] = ()):
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        self.program = program
        self.workspace = workspace
        self.backend = workspace.backend
        self.engine = engine
        if self.backend.name == "numpy":
            ensure_configured()
        xp = self.backend.xp
        self.kernels = [node.op.bind(xp, node.attrs, self.backend.overrides, runtime) for node in program.nodes]
        self.planner = planner
        self.infer = infer
        self.specialize = specialize  # (program, slot types) -> program for this signature
        # output positions whose previous buffers the caller hands back for reuse (parameter
        # updates: the old value of a parameter becomes the buffer of its next update)
        self.recyclable = tuple(recyclable)
        self.frames: Dict[Any, Frame] = {}
        self._consts = {s: self.backend.asarray(a) for s, a in program.const_slots}

    # -- preparation per signature ------------------------------------------------
    def key(self, args: Sequence[Any]) -> tuple:
        return tuple(a.shape for a in args) + (self.workspace.shape_epoch,)

    def frame_for(self, args: Sequence[Any]) -> Frame:
        key = self.key(args)
        frame = self.frames.get(key)
        if frame is None:
            frame = self.frames[key] = self.build_frame(args)
        return frame

    def _param_arrays(self) -> List[Any]:
        data = self.workspace._data
        missing = [name for name, _ in self.program.param_slots if name not in data]
        if missing:
            raise InputError(f"{self.program.name}: the workspace has no tensor {missing[0]!r}; "
                             "initialize the parameter before calling")
        return [data[name] for name, _ in self.program.param_slots]

    def build_frame(self, args: Sequence[Any]) -> Frame:
        """Infer slot types, plan memory, allocate buffers and lower the code for this signature."""
        prog = self.program
        if len(args) != len(prog.input_slots):
            raise InputError(f"{prog.name} takes {len(prog.input_slots)} inputs, got {len(args)}")
        known: Dict[int, TensorType] = {}
        for i, (s, a) in enumerate(zip(prog.input_slots, args)):
            want = prog.slot_types[s]
            t = TensorType(a.shape, DType(a.dtype))
            if not want.accepts(a.shape, t.dtype):
                raise InputError(f"{prog.name}: input {i} ({prog.slot_names[s]}) must be {want!r}, got {t!r}")
            known[s] = t
        for (name, s), p in zip(prog.param_slots, self._param_arrays()):
            want = prog.slot_types[s]
            t = TensorType(p.shape, DType(p.dtype))
            if want.ndim != t.ndim or want.dtype is not t.dtype:
                raise InputError(f"{prog.name}: workspace tensor {name!r} is {t!r}; the program was built "
                                 f"for {want!r}")
            known[s] = t
        types = self.infer(prog, known) if self.infer else list(prog.slot_types)
        if self.specialize is not None:
            prog = self.specialize(prog, types)
        plan = self.planner(prog, types) if self.planner else None
        buffers: List[Any] = []
        views: Dict[int, Any] = {}
        if plan is not None:
            xp = self.backend.xp
            buffers = [aligned_empty(xp, (max(b, 1),), xp.uint8) for b in plan.storage_bytes]
            for s, sid in enumerate(plan.storage):
                if sid is not None and s not in plan.aliases:
                    t = types[s]
                    start = plan.offsets[s]
                    views[s] = buffers[sid][start:start + t.nbytes].view(t.dtype.np).reshape(t.shape)
        scalar_outputs = [s for s in prog.output_slots if types[s].ndim == 0]
        kernels = self._kernels_with_scratch(prog, plan, buffers)
        if self.engine == "threaded":
            recycled = self._recycled_slots(prog, types)
            # False marks outputs whose kernel cannot take a buffer in this frame: never refilled
            recycle_bin: List[Any] = [None if i in recycled.values() else False
                                      for i in range(len(self.recyclable))]
            in_place = {s: recycled[out] for s, out in self._updates_in_place(prog).items() if out in recycled}
            run, line_pc = lower(prog, kernels, views, self._consts, scalar_outputs,
                                 self.backend.xp.asarray, self.workspace._data,
                                 lambda exc, lp: self._threaded_error(exc, lp, prog), recycled, recycle_bin,
                                 in_place)
            return Frame(run, prog, types, plan, buffers, line_pc=line_pc, recycle_bin=recycle_bin)
        code = self._lower_loop(prog, views, kernels)
        return Frame(self._loop_runner(prog, code, scalar_outputs), prog, types, plan, buffers, code=code)

    def _kernels_with_scratch(self, prog: Program, plan: Any, buffers: List[Any]) -> Dict[int, Callable]:
        """pc -> kernel, with its planned scratch block bound as ``scratch=`` where the plan gives one."""
        kernels = {pc: self.kernels[ins.node] for pc, ins in enumerate(prog.instrs) if ins.opcode == CALL}
        for pc, (sid, offset, nbytes) in (plan.scratch.items() if plan is not None else ()):
            kernels[pc] = functools.partial(kernels[pc], scratch=buffers[sid][offset:offset + nbytes])
        return kernels

    def _updates_in_place(self, prog: Program) -> Dict[int, int]:
        """Parameter slot -> the recyclable output slot whose kernel may overwrite that parameter.

        An update ``w' = f(w, ...)`` may be written into ``w``'s own array when ``f``'s op declares
        that input in-place, its instruction is the last to read ``w`` or anything that may alias
        it and reads no such alias besides, and no output may alias ``w``. Aliases are the results
        of view ops and of ops that hand back arrays of their own choosing (scan carries, cond
        branches). Whether the array is private to the workspace is checked on each call (see
        threaded.lower).
        """
        params = {s for _, s in prog.param_slots}
        aliased: Dict[int, Set[int]] = {s: {s} for s in params}   # slot -> parameters it may alias
        last_read: Dict[int, int] = {}
        for pc, ins in enumerate(prog.instrs):
            if ins.opcode != CALL:
                continue
            read = set().union(*(aliased.get(a, ()) for a in ins.args))
            for p in read:
                last_read[p] = pc
            op = prog.nodes[ins.node].op
            if read and (op.view or not op.writes_out):
                for r in ins.results:
                    aliased[r] = read
        outputs = list(prog.output_slots)
        exposed = set().union(*(aliased.get(s, ()) for s in outputs))
        producer = {ins.results[0]: pc for pc, ins in enumerate(prog.instrs)
                    if ins.opcode == CALL and len(ins.results) == 1}
        found: Dict[int, int] = {}
        for position in self.recyclable:
            out = outputs[position]
            pc = producer.get(out)
            if pc is None or outputs.count(out) != 1:
                continue
            ins = prog.instrs[pc]
            for i, o in prog.nodes[ins.node].op.inplace:
                s = ins.args[i] if i < len(ins.args) else None
                if (o == 0 and s in params and s not in exposed and s not in found and last_read.get(s) == pc
                        and sum(s in aliased.get(a, ()) for a in ins.args) == 1):
                    found[s] = out
                    break
        return found

    def _recycled_slots(self, prog: Program, types: Sequence[TensorType]) -> Dict[int, int]:
        """Output slot -> recycle-bin index, for recyclable outputs a kernel writes into whole."""
        produced = {}
        for ins in prog.instrs:
            if ins.opcode == CALL and len(ins.results) == 1:
                produced[ins.results[0]] = prog.nodes[ins.node].op
        out: Dict[int, int] = {}
        slots = list(prog.output_slots)
        for index, position in enumerate(self.recyclable):
            s = slots[position]
            op = produced.get(s)
            if (op is not None and op.writes_out and not op.view and types[s].is_concrete
                    and slots.count(s) == 1 and s not in out):
                out[s] = index
        return out

    # -- threaded engine ---------------------------------------------------------
    def _threaded_error(self, exc: BaseException, line_pc: Dict[int, int], prog: Program) -> None:
        """Raise the cgvm error for an exception caught inside threaded code (pc from the line number)."""
        tb = exc.__traceback__
        if tb is None:
            return
        pc = line_pc.get(tb.tb_lineno)
        if pc is None:
            return
        if pc < 0:
            raise InputError(f"{self.program.name}: the workspace has no tensor "
                             f"{self.program.slot_names[-1 - pc]!r}") from None
        local = tb.tb_frame.f_locals
        regs = {int(k[1:]): v for k, v in local.items() if k[:1] == "s" and k[1:].isdigit()}
        regs.update(self._consts)
        raise self._error(prog, pc, exc, regs) from exc

    # -- loop engine ---------------------------------------------------------------
    def _lower_loop(self, prog: Program, views: Dict[int, Any], kernels: Dict[int, Callable]) -> list:
        code = []
        for pc, ins in enumerate(prog.instrs):
            if ins.opcode == FREE:
                slots = tuple(s for s in ins.args if s not in views and s not in self._consts)
                if slots:
                    code.append((_FREE, None, slots, None, None, pc))
                continue
            if ins.opcode != CALL:
                continue
            fn = kernels[pc]
            args, res = ins.args, ins.results
            buf = views.get(res[0]) if len(res) == 1 else None
            if len(res) > 1 and prog.nodes[ins.node].op.multi_out and any(r in views for r in res):
                buf = tuple(views.get(r) for r in res)
            if len(res) == 1 and len(args) == 1:
                code.append((_U, fn, args[0], None, res[0], pc) if buf is None else (_UO, fn, args[0], buf, res[0], pc))
            elif len(res) == 1 and len(args) == 2:
                code.append((_B, fn, args[0], args[1], res[0], pc) if buf is None else (_BO, fn, args, buf, res[0], pc))
            else:
                code.append((_N, fn, args, buf, res, pc))
        return code

    def _loop_runner(self, prog: Program, code: list, scalar_outputs: Sequence[int]) -> Callable:
        template: List[Any] = [None] * prog.n_slots
        for s, a in self._consts.items():
            template[s] = a
        data = self.workspace._data
        params = prog.param_slots
        inputs = prog.input_slots
        outputs = prog.output_slots
        asarray = self.backend.xp.asarray
        scalars = set(scalar_outputs)

        def run(*args):
            r = template[:]
            for s, a in zip(inputs, args):
                r[s] = a
            for name, s in params:
                r[s] = data[name]
            self.interpret(prog, code, r)
            return tuple(asarray(r[s]) if s in scalars else r[s] for s in outputs)
        return run

    def interpret(self, prog: Program, code: list, r: list) -> None:
        """The loop interpreter over lowered tuples; subclass and override to trace or instrument."""
        ins = None
        try:
            for ins in code:
                k, fn, a, b, o, _ = ins
                if k == _B:
                    r[o] = fn(r[a], r[b])
                elif k == _U:
                    r[o] = fn(r[a])
                elif k == _BO:
                    r[o] = fn(r[a[0]], r[a[1]], out=b)
                elif k == _UO:
                    r[o] = fn(r[a], out=b)
                elif k == _FREE:
                    for s in a:
                        r[s] = None
                else:
                    res = fn(*[r[s] for s in a]) if b is None else fn(*[r[s] for s in a], out=b)
                    if len(o) == 1:
                        r[o[0]] = res
                    else:
                        for s, v in zip(o, res):
                            r[s] = v
        except Exception as exc:
            if ins is None:
                raise
            raise self._error(prog, ins[-1], exc, dict(enumerate(r))) from exc

    # -- running -------------------------------------------------------------------
    def run(self, args: Sequence[Any]) -> List[Any]:
        """Outputs of the program for input arrays ``args`` (arrays of this backend, program dtypes)."""
        frame = self.frames.get(self.key(args))
        if frame is None:
            frame = self.frame_for(args)
        return list(frame.run(*args))

    __call__ = run

    def prepare(self, args: Sequence[Any]) -> Callable:
        """``step(*args) -> tuple`` for repeated calls with the shapes of ``args`` (loop bodies)."""
        return self.frame_for(args).run

    def _error(self, prog: Program, pc: int, exc: Exception, regs: Dict[int, Any]) -> Exception:
        ins = prog.instrs[pc]
        got = ", ".join(_describe(regs.get(s)) for s in ins.args)
        msg = f"{type(exc).__name__} in {prog.name} at {prog.where(pc)}\n  inputs: {got}\n  {exc}"
        if isinstance(exc, CgvmError) and not isinstance(exc, ExecutionError):
            return type(exc)(msg)
        err = IndexOutOfBoundsError(msg) if isinstance(exc, IndexError) else ExecutionError(msg)
        err.pc = pc
        err.node = prog.nodes[ins.node]
        return err


def _describe(x: Any) -> str:
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    return f"{dtype}{list(shape)}" if shape is not None else type(x).__name__
