"""The compiled function ``cgvm.compile`` returns: graph -> passes -> bytecode -> an Executable.

``Function`` runs the graph passes once, hands the per-signature stages to the VM, and calls
the frame of each input signature through a call path generated for its arity. Outputs are
fresh arrays (never planned buffers); updates are computed from the old values and written to
the Workspace after all outputs. ``SubgraphRuntime`` compiles scan bodies and cond branches the
same way, over the same Workspace. (Not ``cgvm/function.py``: ``cgvm.function`` is the
Theano-style factory, which such a module would shadow.)
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import numpy as np

from .compiler import generate, prepare_signature, run_passes
from .compiler.recompute import Recomputation
from .errors import InputError
from .ops.kernels.scratch import private_array, writeable
from .pycode import define
from .ir.graph import PARAM, Graph, Value
from .vm.bytecode import dis
from .vm.interpreter import Executable
from .vm.workspace import Workspace, default_workspace


class SubgraphRuntime:
    """Compiles sub-graphs (scan bodies, cond branches) the same way, for the same workspace.

    ``compile(graph)`` returns a runner: ``runner(args) -> list`` and, for loops whose step
    signature does not change, ``runner.prepare(args) -> step(*args) -> tuple``.
    """

    def __init__(self, workspace: Workspace, *, plan: bool = True, inplace: bool = True, debug: bool = False,
                 engine: str = "threaded"):
        self.workspace = workspace
        self.engine = engine
        self.debug = debug
        self.plan, self.inplace = plan, inplace
        self._cache: Dict[int, Any] = {}
        self._optimized: Dict[int, Any] = {}

    def stages(self, copied_outputs: Sequence[int] = (), recyclable: Sequence[int] = (),
               update_positions: Optional[Sequence[int]] = None):
        """The per-signature stages for a program of this runtime: ``(program, known) -> Signature``.
        ``update_positions``: the recyclable outputs that are parameter updates (None: all of them)."""
        def prepare(program, known):
            return prepare_signature(program, known, plan=self.plan, inplace=self.inplace,
                                     copied_outputs=copied_outputs, recyclable=recyclable,
                                     update_positions=update_positions)
        return prepare

    def optimized(self, graph: Graph) -> Graph:
        """``graph`` after the pipeline's passes, as ``compile`` runs it (computed once per graph):
        what the compiled loop tier (cgvm.ops.kernels.scan_jit) writes as Numba code."""
        hit = self._optimized.get(id(graph))
        if hit is not None and hit[0] is graph:
            return hit[1]
        done = run_passes(graph, debug=self.debug)
        self._optimized[id(graph)] = (graph, done)
        return done

    def compile(self, graph: Graph, copied_outputs: Sequence[int] = ()):
        """A runner for ``graph``. ``copied_outputs``: positions of outputs the caller copies as
        soon as it gets them (a loop's stacked per-step outputs), which may then be one array."""
        key = (id(graph), tuple(copied_outputs))
        hit = self._cache.get(key)
        if hit is not None and hit[0] is graph:
            return hit[1]
        program = generate(self.optimized(graph))
        exe = Executable(program, self.workspace, prepare=self.stages(tuple(copied_outputs)), runtime=self,
                         engine=self.engine)
        self._cache[key] = (graph, exe)
        return exe


class Function:
    """A callable compiled from symbolic inputs and outputs.

    ``recompute="sqrt"`` (or a list of forward values to drop) recomputes activations in the
    backward pass instead of keeping them: O(sqrt(n)) activation memory for a deep net at the
    cost of about one more forward pass (see cgvm.compiler.recompute).

    ``output_entries`` (one workspace name or None per output): where the caller will store each
    output; the program's kernels write straight into those arrays when they fit (same shape and
    dtype, not read by the program), so storing them costs nothing (pycaffe's blobs).

    ``update_held_arrays=True``: an update writes into the parameter's current array (in place
    where the program can, else copied in after the call), so whoever holds that array sees the
    new value, as pycaffe's blobs behave; a change of shape or dtype still rebinds the name.
    By default an update never writes into memory someone else can still see.
    """

    def __init__(self, inputs: Sequence[Value], outputs: Union[Value, Sequence[Value]], *,
                 updates: Optional[Mapping[Any, Value]] = None, workspace: Optional[Workspace] = None,
                 backend: Any = None, passes: Optional[Sequence[str]] = None, plan: bool = True,
                 inplace: bool = True, debug: bool = False, print_after: Iterable[str] = (),
                 engine: str = "threaded", name: str = "function", recompute: Any = None,
                 update_held_arrays: bool = False, output_entries: Optional[Sequence[Optional[str]]] = None):
        self.single = isinstance(outputs, Value)
        outs = [outputs] if self.single else list(outputs)
        self.workspace = workspace if workspace is not None else (
            Workspace(backend) if backend is not None else default_workspace())
        self.update_names: List[str] = []
        upd_values: List[Value] = []
        for target, value in (updates or {}).items():
            tname = target.name if isinstance(target, Value) else str(target)
            if isinstance(target, Value) and target.kind != PARAM:
                raise InputError(f"update target {target.label()} is not a parameter")
            if tname in self.update_names:
                raise InputError(f"parameter {tname!r} is updated twice")
            self.update_names.append(tname)
            upd_values.append(value)
        self.n_outputs = len(outs)
        graph = Graph(list(inputs), outs + upd_values, name=name)
        self.source_graph = graph
        # recomputation (sublinear training memory) is the pipeline's last pass, run when asked for
        request = None if recompute is None else Recomputation(recompute)
        self.graph = run_passes(graph, passes=passes, debug=debug, print_after=print_after, recompute=request)
        self.recompute_plan = None if request is None else request.plan
        self.program = generate(self.graph)
        self.runtime = SubgraphRuntime(self.workspace, plan=plan, inplace=inplace, debug=debug, engine=engine)
        # outputs with a workspace entry the program does not read: their kernels may write into that entry's array
        read = {name for name, _ in self.program.param_slots}
        self.output_entries = [(j, name) for j, name in enumerate(output_entries or ())
                               if name is not None and name not in read and j < self.n_outputs]
        self._n_output_buffers = len(self.output_entries)
        updates_at = list(range(self.n_outputs, self.n_outputs + len(self.update_names)))
        recyclable = [j for j, _ in self.output_entries] + updates_at
        self.update_held_arrays = bool(update_held_arrays)
        self._output_targets: Dict[Any, List[Any]] = {}
        self.executable = Executable(self.program, self.workspace,
                                     prepare=self.runtime.stages(recyclable=recyclable, update_positions=updates_at),
                                     recyclable=recyclable, runtime=self.runtime, engine=engine,
                                     update_held=self.update_held_arrays)
        self._asarray = self.workspace.backend.asarray
        self._array_type = self.workspace.backend.xp.ndarray
        self._in_dtypes = [v.dtype.np for v in graph.inputs]
        self._call = self._make_caller()

    def __call__(self, *args: Any) -> Any:
        """Run on ``args``; replaced per instance by the specialized path (see _make_caller)."""
        return self._call(*args)

    def _arity_error(self, args: tuple) -> None:
        raise InputError(f"{self.program.name} takes {len(self._in_dtypes)} inputs, got {len(args)}")

    def _make_caller(self) -> Any:
        """A call path specialized to this function's arity, outputs and updates (no loops per call)."""
        n = len(self._in_dtypes)
        names = [f"a{i}" for i in range(n)]
        env: Dict[str, Any] = {"_nd": self._array_type, "_conv": self._convert, "_ws": self.workspace,
                               "_get": self.executable.frames.get, "_prepare": self.executable.frame_for,
                               "_arity": self._arity_error}
        lines = ["def call(self, *args):", f"    if len(args) != {n}: _arity(args)"]
        if n:
            lines.append(f"    {', '.join(names)}, = args")
        for i, a in enumerate(names):
            env[f"_d{i}"] = self._in_dtypes[i]
            lines.append(f"    if {a}.__class__ is not _nd or {a}.dtype is not _d{i}: {a} = _conv({i}, {a})")
        key = "".join(f"{a}.shape, " for a in names)
        lines.append(f"    fr = _get(({key}_ws.shape_epoch))")
        lines.append(f"    if fr is None: fr = _prepare([{', '.join(names)}])")
        if self.output_entries:
            env["_targets"], env["_buffers"] = self._output_targets, self._output_buffers
            lines.append("    tg = _targets.get(fr)")
            lines.append("    if tg is None: tg = _buffers(fr)")
            lines.append("    b = fr.recycle_bin")
            lines.append("    for i, n, sh, dt in tg:")
            lines.append("        a = _ws._data.get(n)")
            lines.append("        b[i] = a if a is not None and a.shape == sh and a.dtype == dt and a.flags.writeable "
                         "and a.flags.c_contiguous else None")
        lines.append(f"    r = fr.run({', '.join(names)})")
        if self.output_entries:
            lines.append("    for i, n, sh, dt in tg: b[i] = None")
        env["_update"] = self._apply_update
        if self.update_held_arrays and self.update_names:
            env["_update_held"] = self._apply_updates_held
            lines.append(f"    _update_held(fr.recycle_bin, r[{self.n_outputs}:])")
        for k, name in enumerate(self.update_names if not self.update_held_arrays else ()):
            env[f"_u{k}"] = name
            lines.append(f"    _update(fr.recycle_bin, {k + self._n_output_buffers}, _u{k}, r[{self.n_outputs + k}])")
        if self.single:
            lines.append("    return r[0]")
        else:
            lines.append(f"    return list(r[:{self.n_outputs}])" if self.update_names else "    return list(r)")
        call = define("call", lines, env, f"call {self.program.name}")
        # the call path becomes this instance's __call__ (a per-instance subclass): no extra Python layer
        self.__class__ = type("Function", (Function,), {"__call__": call, "__module__": __name__})
        return call.__get__(self)

    def _apply_update(self, bin: list, k: int, name: str, new: Any) -> None:
        """Bind parameter ``name`` to its new value; recycle the old array as the next update's buffer.

        The old array is reused only when nothing but the workspace held it (no user reference,
        view or DLPack export), so an update never writes into memory someone can still see.
        """
        data = self.workspace._data
        old = data.get(name)
        self.workspace.set(name, new)
        if bin and bin[k] is not False:
            reusable = (old is not None and old is not new and old.shape == new.shape and old.dtype == new.dtype
                        and old.flags.c_contiguous and private_array(old, in_container=False))
            bin[k] = old if reusable else None

    def _output_buffers(self, frame: Any) -> List[Any]:
        """For a frame: (bin index, entry, shape, dtype) of the outputs whose kernels take a buffer."""
        prog = frame.program
        targets = []
        for index, (position, name) in enumerate(self.output_entries):
            t = frame.types[prog.output_slots[position]]
            if index < len(frame.recycle_bin) and frame.recycle_bin[index] is not False and t.is_concrete:
                targets.append((index, name, tuple(t.shape), np.dtype(t.dtype.np)))
        self._output_targets[frame] = targets
        return targets

    def _apply_updates_held(self, bin: list, news: Sequence[Any]) -> None:
        """Write each update into its parameter's current array (``update_held_arrays``).

        Updates the program already wrote in place are the arrays themselves; the others are
        copied in, after the program has finished reading every old value. A new value that is
        (a view of) another updated parameter's array is copied out first, so the order of the
        writes cannot change what is written.
        """
        data = self.workspace._data
        olds = [data.get(name) for name in self.update_names]
        targets = {id(o) for o in olds if o is not None}
        news = [n.copy() if n is not o and (id(n) in targets or (n.base is not None and id(n.base) in targets))
                else n for n, o in zip(news, olds)]
        for k, (name, old, new) in enumerate(zip(self.update_names, olds, news)):
            if new is old:
                continue
            if (old is not None and old.shape == new.shape and old.dtype == new.dtype and writeable(old)):
                old[...] = new
            else:
                self.workspace.set(name, new)

    def _convert(self, i: int, a: Any) -> Any:
        want = self._in_dtypes[i]
        arr = self._asarray(a)
        if arr.dtype != want:
            if not np.can_cast(arr.dtype, want, casting="same_kind"):
                raise InputError(f"{self.program.name}: input {i} has dtype {arr.dtype}, expected {want} "
                                 "(cast it explicitly)")
            arr = arr.astype(want)
        return arr

    def dis(self) -> str:
        """The program of the last input signature run, with its memory plan (else the generic program)."""
        frames = list(self.executable.frames.values())
        return dis(frames[-1].program, frames[-1].plan) if frames else dis(self.program, None)

    def write_graph(self, log_dir: str, *, before_passes: bool = True) -> Any:
        """Write this function's graph for TensorBoard's graph dashboard into the run ``log_dir``:
        after the passes (the run's graph) and as written (tag "before_passes"); see cgvm.board."""
        from .board import write_graph

        return write_graph(self, log_dir, before_passes=before_passes)

    def memory_plans(self) -> Dict[Any, Any]:
        return {k: f.plan for k, f in self.executable.frames.items()}

    def __repr__(self) -> str:
        return f"<Function {self.program.name}: {len(self.graph.nodes)} nodes>"
