"""Per-op times of a compiled function, for TensorBoard and for Chrome's trace viewer / Perfetto.

    with OpProfiler(step_fn) as prof:
        for i in range(10):
            with prof.step(f"step {i}"):
                step_fn(x)
    prof.write(writer, builder)                 # TensorBoard: graph dashboard (colour by compute time)
    prof.write_chrome_trace("logs/step.trace.json")

While profiling, every kernel of the function's program is wrapped by a timer (and, on the GPU,
a device synchronize, so each op's time is its own); the function's prepared frames are set
aside and rebuilt with the timed kernels, then restored, so nothing changes once the profiler
is done. Times are wall-clock and include the kernel's Python call, as the VM runs it.

Two outputs:
* TensorBoard: a RunMetadata whose ``step_stats`` give each NodeDef of the graph (see
  cgvm.board.graph; a fused kernel's time is on the last op of its group) its mean start and
  duration over the profiled steps. The graph dashboard shows it under the tag's profile: pick
  the tag, then colour by "Compute time" and click a node for its time. A per-op table is
  also written as text (the Text dashboard).
* Chrome trace-event JSON (``ph: "X"`` events, microseconds): one event per step and one per
  op inside it, which chrome://tracing and https://ui.perfetto.dev open.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ._deps import tb
from .graph import GraphDefBuilder, function_graphs, layer_scope


class OpProfiler:
    """Times each kernel of ``function`` (a cgvm Function or theano Function) while active."""

    def __init__(self, function: Any, *, n_outputs: Optional[int] = None):
        graphs = function_graphs(function)
        self.graph, outputs, self.update_names, self.param_labels = (graphs.graph, graphs.n_outputs,
                                                                     graphs.update_names, graphs.param_labels)
        # n_outputs: how many outputs are results (the rest gradients or updates: see cgvm.board.graph)
        self.n_outputs = outputs if n_outputs is None else n_outputs
        core = getattr(function, "core", function)
        core = getattr(core, "_core", core)
        self.executable = core.executable
        self.nodes = list(core.program.nodes)
        backend = core.workspace.backend
        self.device = "/device:GPU:0" if backend.name == "cupy" else "/device:CPU:0"
        self._sync = _synchronizer(backend.name)
        self.records: List[Tuple[int, float, float]] = []   # (node index, start, end), seconds
        self.steps: List[Tuple[str, float, float]] = []     # (label, start, end)
        self._saved: Optional[Tuple[list, dict]] = None

    # -- instrumenting
    def __enter__(self) -> "OpProfiler":
        exe = self.executable
        self._saved = (list(exe.kernels), dict(exe.frames))
        exe.kernels[:] = [self._timed(i, k) for i, k in enumerate(exe.kernels)]
        exe.frames.clear()   # frames hold the kernels they were built with: rebuild them timed
        return self

    def __exit__(self, *exc: Any) -> None:
        exe = self.executable
        kernels, frames = self._saved
        exe.kernels[:] = kernels
        exe.frames.clear()
        exe.frames.update(frames)
        self._saved = None

    def _timed(self, index: int, kernel: Callable) -> Callable:
        records, sync, clock = self.records, self._sync, time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            result = kernel(*args, **kwargs)
            sync()
            records.append((index, start, clock()))
            return result
        return timed

    @contextlib.contextmanager
    def step(self, label: str = "step") -> Iterator[None]:
        """Marks one call (or a few) of the function as a step of the profile."""
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.steps.append((label, start, time.perf_counter()))

    # -- results
    def per_step(self) -> List[List[Tuple[int, float, float]]]:
        """The op records of each step, in order."""
        out: List[List[Tuple[int, float, float]]] = [[] for _ in self.steps]
        k = 0
        for rec in self.records:
            while k < len(self.steps) and rec[1] > self.steps[k][2]:
                k += 1
            if k < len(self.steps) and rec[1] >= self.steps[k][1]:
                out[k].append(rec)
        return out

    def op_table(self) -> "OrderedDict[int, Dict[str, float]]":
        """node index -> calls, total and mean seconds, over the profiled steps (slowest first)."""
        table: Dict[int, Dict[str, float]] = {}
        for index, start, end in (r for step in self.per_step() for r in step):
            row = table.setdefault(index, {"calls": 0, "total": 0.0})
            row["calls"] += 1
            row["total"] += end - start
        for row in table.values():
            row["mean"] = row["total"] / row["calls"]
        return OrderedDict(sorted(table.items(), key=lambda kv: -kv[1]["total"]))

    def run_metadata(self, builder: GraphDefBuilder) -> Any:
        """A RunMetadata: each node's mean start (from its step's start) and duration, in microseconds."""
        config_pb2 = tb("compat.proto.config_pb2")
        steps = self.per_step()
        starts: Dict[int, List[float]] = {}
        spans: Dict[int, List[float]] = {}
        for (label, s0, _), recs in zip(self.steps, steps):
            for index, start, end in recs:
                starts.setdefault(index, []).append(start - s0)
                spans.setdefault(index, []).append(end - start)
        meta = config_pb2.RunMetadata()
        dev = meta.step_stats.dev_stats.add(device=self.device)
        base = int(self.steps[0][1] * 1e6) if self.steps else 0
        for index in sorted(starts, key=lambda i: sum(starts[i]) / len(starts[i])):
            node = self.nodes[index]
            name = builder.stat_name.get(id(node))
            if name is None:
                continue
            micros = int(round(1e6 * sum(spans[index]) / len(spans[index])))
            stat = dev.node_stats.add(node_name=name, timeline_label=f"{name} = {node.op.name}()")
            stat.all_start_micros = base + int(round(1e6 * sum(starts[index]) / len(starts[index])))
            stat.op_start_rel_micros = 0
            stat.op_end_rel_micros = micros
            stat.all_end_rel_micros = micros
        return meta

    def table_markdown(self, builder: Optional[GraphDefBuilder] = None, top: int = 40) -> str:
        """The slowest ops as a Markdown table (TensorBoard's Text dashboard renders it)."""
        table = self.op_table()
        total = sum(r["total"] for r in table.values()) or 1.0
        n = max(len(self.steps), 1)
        lines = [f"{len(table)} ops timed over {len(self.steps)} step(s); "
                 f"{1e3 * total / n:.4g} ms of kernels per step.", "",
                 "| op | node | ms per step | % |", "|---|---|---:|---:|"]
        for index, row in list(table.items())[:top]:
            node = self.nodes[index]
            name = builder.stat_name.get(id(node), "") if builder is not None else ""
            lines.append(f"| {node.op.name} | {name} | {1e3 * row['total'] / n:.4g} | "
                         f"{100 * row['total'] / total:.1f} |")
        return "\n".join(lines)

    def chrome_trace(self, builder: Optional[GraphDefBuilder] = None) -> Dict[str, Any]:
        """Trace-event JSON: a complete event per step and per op (pid 1, tid 1; microseconds)."""
        t0 = self.steps[0][1] if self.steps else (self.records[0][1] if self.records else 0.0)
        events: List[Dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"cgvm {self.graph.name}"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": self.device}}]
        for label, start, end in self.steps:
            events.append({"name": label, "cat": "step", "ph": "X", "pid": 1, "tid": 1,
                           "ts": (start - t0) * 1e6, "dur": (end - start) * 1e6})
        for index, start, end in (r for step in self.per_step() for r in step):
            node = self.nodes[index]
            name = builder.stat_name.get(id(node)) if builder is not None else None
            events.append({"name": name or node.op.name, "cat": node.op.name, "ph": "X", "pid": 1, "tid": 1,
                           "ts": (start - t0) * 1e6, "dur": (end - start) * 1e6,
                           "args": {"op": node.op.name, "layer": layer_scope(node) or "",
                                    "source": node.source or "",
                                    "shapes": [list(o.shape) for o in node.outputs]}})
        return {"traceEvents": events, "displayTimeUnit": "ms"}

    def write_chrome_trace(self, path: str, builder: Optional[GraphDefBuilder] = None) -> str:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(self.chrome_trace(builder), f)
        return path

    def write(self, writer: Any, *, tag: str = "profile", step: int = 0,
              trace_path: Optional[str] = None) -> Tuple[GraphDefBuilder, Optional[str]]:
        """The profile into a SummaryWriter's run: the graph with its per-node times (tag ``tag``),
        the op table as text ``<tag>/ops``, and (``trace_path``) the Chrome trace beside it.
        Returns the graph builder and the trace file written."""
        builder = GraphDefBuilder(self.graph, n_outputs=self.n_outputs, update_names=self.update_names,
                                  param_labels=self.param_labels)
        writer.add_run_metadata(tag, self.run_metadata(builder), step, graph_def=builder.out)
        writer.add_text(f"{tag}/ops", self.table_markdown(builder), step)
        path = self.write_chrome_trace(trace_path, builder) if trace_path else None
        return builder, path


def _synchronizer(backend: str) -> Callable[[], None]:
    if backend != "cupy":
        return lambda: None
    import cupy

    return lambda: cupy.cuda.Device().synchronize()
