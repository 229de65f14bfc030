"""Compiled functions: graph -> passes -> bytecode -> an Executable over a Workspace.

    f = cgvm.compile([x], [y], updates={w: w - lr * gw})
    y_value = f(x_value)

Outputs are fresh arrays (never planned buffers); updates are computed from the old values
and written to the Workspace after all outputs.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

import numpy as np

from .compiler import generate, infer_slot_types, plan_memory, run_passes
from .errors import InputError
from .ir.graph import PARAM, Graph, Value
from .vm.bytecode import dis
from .vm.interpreter import Executable
from .vm.workspace import Workspace, default_workspace


class SubgraphRuntime:
    """Compiles sub-graphs (scan bodies, cond branches) the same way, for the same workspace."""

    def __init__(self, workspace: Workspace, *, plan: bool = True, inplace: bool = True, debug: bool = False):
        self.workspace = workspace
        self.debug = debug
        self.planner = (lambda prog, types: plan_memory(prog, types, inplace=inplace)) if plan else None
        self._cache: Dict[int, Any] = {}

    def compile(self, graph: Graph):
        hit = self._cache.get(id(graph))
        if hit is not None and hit[0] is graph:
            return hit[1]
        program = generate(run_passes(graph, debug=self.debug))
        exe = Executable(program, self.workspace, planner=self.planner, infer=infer_slot_types, runtime=self)
        self._cache[id(graph)] = (graph, exe.run)
        return exe.run


class Function:
    """A callable compiled from symbolic inputs and outputs."""

    def __init__(self, inputs: Sequence[Value], outputs: Union[Value, Sequence[Value]], *,
                 updates: Optional[Mapping[Any, Value]] = None, workspace: Optional[Workspace] = None,
                 backend: Any = None, passes: Optional[Sequence[str]] = None, plan: bool = True,
                 inplace: bool = True, debug: bool = False, print_after: Iterable[str] = (),
                 name: str = "function"):
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
        self.graph = run_passes(graph, passes=passes, debug=debug, print_after=print_after)
        self.program = generate(self.graph)
        self.runtime = SubgraphRuntime(self.workspace, plan=plan, inplace=inplace, debug=debug)
        self.executable = Executable(self.program, self.workspace, planner=self.runtime.planner,
                                     infer=infer_slot_types, runtime=self.runtime)
        self._asarray = self.workspace.backend.asarray
        self._array_type = self.workspace.backend.xp.ndarray
        self._in_dtypes = [v.dtype.np for v in graph.inputs]

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self._in_dtypes):
            raise InputError(f"{self.program.name} takes {len(self._in_dtypes)} inputs, got {len(args)}")
        arrays = [a if type(a) is self._array_type and a.dtype == d else self._convert(i, a)
                  for i, (a, d) in enumerate(zip(args, self._in_dtypes))]
        results = self.executable.run(arrays)
        arr_t = self._array_type
        if not all(type(r) is arr_t for r in results):  # NumPy hands back scalars for 0-d reductions
            results = [r if type(r) is arr_t else self._asarray(r) for r in results]
        if self.update_names:
            data = self.workspace
            for name, value in zip(self.update_names, results[self.n_outputs:]):
                data.set(name, value)
            results = results[:self.n_outputs]
        return results[0] if self.single else results

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
        frames = list(self.executable.frames().values())
        return dis(self.program, frames[-1].plan if frames else None)

    def memory_plans(self) -> Dict[Any, Any]:
        return {k: f.plan for k, f in self.executable.frames().items()}

    def __repr__(self) -> str:
        return f"<Function {self.program.name}: {len(self.graph.nodes)} nodes>"


def compile(inputs: Sequence[Value], outputs: Union[Value, Sequence[Value]], **kwargs: Any) -> Function:
    """Compile ``outputs`` as a function of ``inputs``; parameters are read from the workspace."""
    return Function(inputs, outputs, **kwargs)
