"""The VM: runs a Program on a backend, over a Workspace, in buffers planned per input signature.

Loading binds every CALL's kernel for the backend with its attributes, once. For each new
signature of input (and parameter) shapes a Frame is prepared: slot types inferred, memory
planned, buffers allocated, and the instructions lowered to flat tuples the run loop
unpacks without any look-up. A failing instruction re-raises as ExecutionError with the
program counter, its disassembly and the node's source.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import CgvmError, ExecutionError, InputError
from ..ir.types import DType, TensorType
from .bytecode import CALL, FREE, Program
from .workspace import Workspace

# lowered instruction kinds
_FREE, _U, _B, _UO, _BO, _N = 0, 1, 2, 3, 4, 5

Planner = Callable[[Program, Sequence[TensorType]], Any]


class Frame:
    """Everything one input signature needs: lowered code, register template, planned buffers."""

    __slots__ = ("code", "template", "types", "plan", "buffers", "busy")

    def __init__(self, code, template, types, plan, buffers):
        self.code = code
        self.template = template
        self.types = types
        self.plan = plan
        self.buffers = buffers
        self.busy = False


class Executable:
    """A Program loaded for one backend and workspace. Call ``run(args)`` for a list of results."""

    def __init__(self, program: Program, workspace: Workspace, *, planner: Optional[Planner] = None,
                 infer: Optional[Callable] = None, runtime: Any = None):
        self.program = program
        self.workspace = workspace
        self.backend = workspace.backend
        xp = self.backend.xp
        overrides = self.backend.overrides
        self.kernels = [node.op.bind(xp, node.attrs, overrides, runtime) for node in program.nodes]
        self.planner = planner
        self.infer = infer
        self._frames: Dict[Any, Frame] = {}
        self._consts = [(s, self.backend.asarray(a)) for s, a in program.const_slots]
        self._in_types = [program.slot_types[s] for s in program.input_slots]

    # -- preparation per signature ------------------------------------------------
    def frame_for(self, args: Sequence[Any], params: Sequence[Any]) -> Frame:
        key = (tuple((a.shape, a.dtype) for a in args), self.workspace.shape_epoch)
        frame = self._frames.get(key)
        if frame is None:
            frame = self._frames[key] = self._prepare(args, params)
        return frame

    def _prepare(self, args: Sequence[Any], params: Sequence[Any]) -> Frame:
        prog = self.program
        known: Dict[int, TensorType] = {}
        for i, (s, a) in enumerate(zip(prog.input_slots, args)):
            want = prog.slot_types[s]
            t = TensorType(a.shape, DType(a.dtype))
            if not want.accepts(a.shape, t.dtype):
                raise InputError(f"{prog.name}: input {i} ({prog.slot_names[s]}) must be {want!r}, "
                                 f"got {t!r}")
            known[s] = t
        for (name, s), p in zip(prog.param_slots, params):
            want = prog.slot_types[s]
            t = TensorType(p.shape, DType(p.dtype))
            if want.ndim != t.ndim or want.dtype is not t.dtype:
                raise InputError(f"{prog.name}: workspace tensor {name!r} is {t!r}; the program "
                                 f"was built for {want!r}")
            known[s] = t
        types = self.infer(prog, known) if self.infer else list(prog.slot_types)
        plan = self.planner(prog, types) if self.planner else None
        buffers: List[Any] = []
        views: Dict[int, Any] = {}
        if plan is not None:
            buffers = [self.backend.empty_bytes(b) for b in plan.storage_bytes]
            for s, sid in enumerate(plan.storage):
                if sid is not None and s not in plan.aliases:
                    t = types[s]
                    views[s] = buffers[sid][:t.nbytes].view(t.dtype.np).reshape(t.shape)
        template: List[Any] = [None] * prog.n_slots
        for s, a in self._consts:
            template[s] = a
        code = self._lower(views, plan)
        return Frame(code, template, types, plan, buffers)

    def _lower(self, views: Dict[int, Any], plan: Any) -> list:
        prog = self.program
        planned = set(views)
        code = []
        for pc, ins in enumerate(prog.instrs):
            if ins.opcode == FREE:
                slots = tuple(s for s in ins.args if s not in planned)
                if slots:
                    code.append((_FREE, None, slots, None, None, pc))
                continue
            if ins.opcode != CALL:
                continue
            fn = self.kernels[ins.node]
            op = prog.nodes[ins.node].op
            args, res = ins.args, ins.results
            buf = views.get(res[0]) if len(res) == 1 and not op.view else None
            if len(res) == 1 and len(args) == 1:
                code.append((_U, fn, args[0], None, res[0], pc) if buf is None else (_UO, fn, args[0], buf, res[0], pc))
            elif len(res) == 1 and len(args) == 2:
                code.append((_B, fn, args[0], args[1], res[0], pc) if buf is None else (_BO, fn, args, buf, res[0], pc))
            else:
                code.append((_N, fn, args, buf, res, pc))
        return code

    # -- running -------------------------------------------------------------------
    def run(self, args: Sequence[Any]) -> List[Any]:
        """Results of the program for input arrays ``args`` (already of this backend)."""
        prog = self.program
        data = self.workspace._data
        try:
            params = [data[name] for name, _ in prog.param_slots]
        except KeyError as exc:
            raise InputError(f"{prog.name}: workspace {self.workspace!r} has no tensor {exc.args[0]!r}; "
                             "initialize the parameter first") from None
        frame = self.frame_for(args, params)
        if frame.busy:  # re-entered (recursion or another thread): run without the planned buffers
            frame = self._prepare(args, params)
        r = frame.template[:]
        for s, a in zip(prog.input_slots, args):
            r[s] = a
        for (_, s), p in zip(prog.param_slots, params):
            r[s] = p
        frame.busy = True
        try:
            self._loop(frame.code, r)
        finally:
            frame.busy = False
        return [r[s] for s in prog.output_slots]

    def _loop(self, code: list, r: list) -> None:
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
            raise self._error(ins[-1], exc, r) from exc

    def _error(self, pc: int, exc: Exception, r: list) -> Exception:
        prog = self.program
        ins = prog.instrs[pc]
        node = prog.nodes[ins.node]
        got = ", ".join(_describe(r[s]) for s in ins.args)
        msg = (f"{type(exc).__name__} in {prog.name} at {prog.where(pc)}\n  inputs: {got}\n  "
               f"{exc}")
        if isinstance(exc, CgvmError) and not isinstance(exc, ExecutionError):
            return type(exc)(msg)
        err = ExecutionError(msg)
        err.pc = pc
        err.node = node
        return err

    def frames(self) -> Dict[Any, Frame]:
        return self._frames


def _describe(x: Any) -> str:
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    return f"{dtype}{list(shape)}" if shape is not None else type(x).__name__
