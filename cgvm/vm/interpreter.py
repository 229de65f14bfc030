"""The VM: runs a Program on a backend, over a Workspace, in buffers planned per input signature.

Loading binds every CALL's kernel for the backend with its attributes, once. For each new
signature of input (and parameter) shapes a Frame is prepared: slot types inferred, memory
planned, buffers allocated, and the instructions lowered to threaded code (one generated
Python function per frame: see threaded.py). A failing instruction re-raises with the program
counter, its disassembly and the node's source. The reference to test it against, and the
interpreter to subclass for tracing, is cgvm.vm.reference (``eval_graph``, ``Interpreter``).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..backend.threads import ensure_configured
from ..env import check_bytes
from ..errors import CgvmError, ExecutionError, IndexOutOfBoundsError, InputError
from ..ir.types import DType, TensorType
from ..ops.kernels.scratch import aligned_empty
from .bytecode import CALL, Program
from .threaded import lower
from .workspace import Workspace

# (program, known slot types) -> the signature's record (.program, .types, .plan, .updates)
Prepare = Callable[[Program, Dict[int, TensorType]], Any]
ENGINES = ("threaded",)   # the loop engine is gone: cgvm.vm.reference.Interpreter is the one to subclass


class Frame:
    """What one input signature needs: slot types, memory plan, buffers and the runnable code."""

    __slots__ = ("run", "program", "types", "plan", "buffers", "line_pc", "recycle_bin")

    def __init__(self, run, program, types, plan, buffers, line_pc=None, recycle_bin=None):
        self.run = run            # run(*inputs) -> tuple of outputs
        self.program = program    # the program it runs: specialized for this signature
        self.types = types
        self.plan = plan
        self.buffers = buffers
        self.line_pc = line_pc    # line number of the generated code -> pc
        # one entry per recyclable output (see Executable.recyclable): a buffer its kernel may
        # write into on the next call, refilled by the caller; None means allocate, False never
        self.recycle_bin = recycle_bin if recycle_bin is not None else []


class Executable:
    """A Program loaded for one backend and workspace. ``run(args)`` returns the list of outputs."""

    def __init__(self, program: Program, workspace: Workspace, *, prepare: Optional[Prepare] = None,
                 runtime: Any = None, engine: str = "threaded", recyclable: Sequence[int] = (),
                 update_held: bool = False):
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
        self.program = program
        self.workspace = workspace
        self.backend = workspace.backend
        self.engine = engine
        if self.backend.name == "numpy":
            ensure_configured()
        xp = self.backend.xp
        self.kernels = [node.op.bind(xp, node.attrs, runtime=runtime) for node in program.nodes]
        self._bound = list(self.kernels)   # a kernel someone swapped in (a profiler's timed one) is kept
        # the per-signature stages (cgvm.compiler.passes.SIGNATURE_STAGES), given by the compiler:
        # (program, known slot types) -> a record with .program (for this signature), .types (of
        # every slot), .plan (the memory plan or None) and .updates (recycled outputs, in-place updates)
        self.stages = prepare
        # output positions whose previous buffers the caller hands back for reuse (parameter
        # updates: the old value of a parameter becomes the buffer of its next update)
        self.recyclable = tuple(recyclable)
        # updates may overwrite a parameter's array even while others hold it (see Function)
        self.update_held = update_held
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
        sig = self.stages(prog, known) if self.stages else None
        if sig is not None:
            prog, types, plan, updates = sig.program, sig.types, sig.plan, sig.updates
        else:
            types, plan, updates = list(prog.slot_types), None, None
        buffers: List[Any] = []
        views: Dict[int, Any] = {}
        if plan is not None:
            xp = self.backend.xp
            check_bytes(int(sum(plan.storage_bytes)), f"{prog.name}: the memory plan ({len(plan.storage_bytes)} buffers)")
            # CuPy: one arena from its memory pool; NumPy: a buffer each (page faults stay per buffer)
            buffers = self.backend.plan_buffers(plan.storage_bytes)
            if buffers is None:
                buffers = [aligned_empty(xp, (max(b, 1),), xp.uint8) for b in plan.storage_bytes]
            for s, sid in enumerate(plan.storage):
                if sid is not None and s not in plan.aliases:
                    t = types[s]
                    start = plan.offsets[s]
                    views[s] = buffers[sid][start:start + t.nbytes].view(t.dtype.np).reshape(t.shape)
        scalar_outputs = [s for s in prog.output_slots if types[s].ndim == 0]
        kernels = self._kernels_with_scratch(prog, plan, buffers, types)
        # the plan's recycled outputs and parameters updated in place (cgvm.compiler.liveness)
        recycled = updates.recycled if updates is not None else {}
        in_place = updates.in_place if updates is not None else {}
        # False marks outputs whose kernel cannot take a buffer in this frame: never refilled
        recycle_bin: List[Any] = [None if i in recycled.values() else False for i in range(len(self.recyclable))]
        fresh = {}   # unplanned results of known shape whose kernels would work the shape out per call
        for ins in prog.instrs:
            if ins.opcode == CALL and len(ins.results) == 1 and prog.nodes[ins.node].op.fresh_out:
                r = ins.results[0]
                t = types[r]
                if r not in views and r not in recycled and t.is_concrete and t.ndim > 0:
                    fresh[r] = (tuple(t.shape), t.dtype.np)
        consts = self._consts
        if prog.const_slots is not self.program.const_slots:   # specialization's constants for this signature
            given = dict(self.program.const_slots)
            changed = [(s, a) for s, a in prog.const_slots if given.get(s) is not a]
            if changed:
                consts = dict(consts)
                consts.update((s, self.backend.asarray(a)) for s, a in changed)
        run, line_pc = lower(prog, kernels, views, consts, scalar_outputs, self.backend.xp.asarray,
                             self.workspace._data, lambda exc, lp: self._threaded_error(exc, lp, prog), recycled,
                             recycle_bin, in_place, self.update_held, fresh, self.backend.xp.empty)
        return Frame(run, prog, types, plan, buffers, line_pc=line_pc, recycle_bin=recycle_bin)

    def _kernels_with_scratch(self, prog: Program, plan: Any, buffers: List[Any],
                              types: Sequence[TensorType]) -> Dict[int, Callable]:
        """pc -> kernel (the op's choice for these types where it makes one), with its planned scratch
        block bound as ``scratch=`` where the plan gives one."""
        kernels = {pc: self.kernels[ins.node] for pc, ins in enumerate(prog.instrs) if ins.opcode == CALL}
        xp = self.backend.xp
        for pc, ins in enumerate(prog.instrs):
            if (ins.opcode == CALL and self.kernels[ins.node] is self._bound[ins.node]
                    and all(types[s].is_concrete for s in ins.args + ins.results)):
                node = prog.nodes[ins.node]
                typed = node.op.typed_kernel(xp, node.attrs, [types[s] for s in ins.args],
                                             [types[s] for s in ins.results])
                if typed is not None:
                    kernels[pc] = typed
        for pc, (sid, offset, nbytes) in (plan.scratch.items() if plan is not None else ()):
            kernels[pc] = functools.partial(kernels[pc], scratch=buffers[sid][offset:offset + nbytes])
        return kernels

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
