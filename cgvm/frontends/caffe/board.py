"""Caffe training and timing in TensorBoard (``cgvm train --tensorboard DIR``, ``cgvm time --tensorboard DIR``,
``solver.log_to_tensorboard(DIR)`` in pycaffe scripts).

Training writes what Caffe's log says, as ``tools/extra/parse_log.py`` reads it, one point per
line: the run ``DIR/train`` has, at every display iteration, each train net output (``Train net
output #k: loss = v``, tag ``loss``), the smoothed loss the display line shows (``smoothed_loss``)
and the learning rate (``learning_rate``); the run ``DIR/test`` (``test_1``, ... for more test
nets) has each test pass's outputs (``accuracy``, ``loss``) at the iteration it ran. An output
with several values is ``<name>/<k>``. The train run also holds the graph of the compiled
training step (forward, backward and update, after the passes; as written under tag
``before_passes``).

Timing writes the profile of the whole-net forward-backward program (cgvm.board.profile) to
``DIR``: the graph dashboard's tag ``profile`` (colour by compute time), text tables of the ops
and of Caffe's layer-by-layer times, and ``DIR/cgvm_time.trace.json`` (Chrome trace events).
"""
from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from cgvm.board import OpProfiler, SummaryWriter


class SolverBoard:
    """Receives a solver's display lines and test passes (see Solver.log_to_tensorboard)."""

    def __init__(self, solver: Any, log_dir: str):
        self.solver = solver
        self.log_dir = str(log_dir)
        self.train = SummaryWriter(os.path.join(self.log_dir, "train"))
        self.tests: Dict[int, SummaryWriter] = {}
        self._graph_written = False

    def _test_writer(self, index: int) -> SummaryWriter:
        if index not in self.tests:
            run = "test" if index == 0 else f"test_{index}"
            self.tests[index] = SummaryWriter(os.path.join(self.log_dir, run))
        return self.tests[index]

    def on_compiled(self, step_fn: Any) -> None:
        if not self._graph_written:
            self.train.add_graph(step_fn)
            self._graph_written = True

    def on_display(self, iteration: int, smoothed_loss: float, rate: float, outputs: Mapping[str, Any]) -> None:
        _add_outputs(self.train, outputs, iteration)
        self.train.add_scalar("smoothed_loss", smoothed_loss, iteration)
        self.train.add_scalar("learning_rate", rate, iteration)

    def on_test(self, iteration: int, index: int, outputs: Mapping[str, Any]) -> None:
        writer = self._test_writer(index)
        _add_outputs(writer, outputs, iteration)
        writer.flush()

    def flush(self) -> None:
        for w in [self.train] + list(self.tests.values()):
            w.flush()

    def close(self) -> None:
        for w in [self.train] + list(self.tests.values()):
            w.close()


def _add_outputs(writer: SummaryWriter, outputs: Mapping[str, Any], step: int) -> None:
    for name, value in outputs.items():
        flat = np.asarray(value, np.float64).ravel()
        if flat.size == 1:
            writer.add_scalar(name, flat[0], step)
        else:
            for k, v in enumerate(flat):
                writer.add_scalar(f"{name}/{k}", v, step)


def write_time_profile(net: Any, log_dir: str, iterations: int,
                       layer_ms: Optional[Mapping[str, Tuple[float, float]]] = None) -> Tuple[str, str]:
    """Profile ``iterations`` runs of the net's forward-backward program into ``log_dir``;
    ``layer_ms``: Caffe's per-layer (forward, backward) milliseconds, written as a table too.
    Returns (log_dir, the Chrome trace file)."""
    from cgvm.compiled_function import Function
    from cgvm.errors import CgvmError

    try:
        tg = net.training_graph()
    except CgvmError as exc:
        raise CgvmError(f"cgvm time --tensorboard profiles the net's forward-backward program: {exc}") from None
    outputs = [tg.loss] + list(tg.grads.values())
    step = Function([], outputs, workspace=net.workspace, name="time_step")
    net.prepare_step()
    step()   # compiled and planned before timing
    with SummaryWriter(log_dir) as writer, OpProfiler(step, n_outputs=1) as prof:
        net.prepare_step()
        step()   # the frame rebuilt with timed kernels, outside the profiled steps
        for i in range(max(int(iterations), 1)):
            net.prepare_step()
            with prof.step(f"iteration {i + 1}"):
                step()
        trace = os.path.join(log_dir, "cgvm_time.trace.json")
        prof.write(writer, tag="profile", trace_path=trace)
        if layer_ms:
            rows = ["| layer | forward ms | backward ms |", "|---|---:|---:|"]
            rows += [f"| {name} | {f:.4g} | {b:.4g} |" for name, (f, b) in layer_ms.items()]
            writer.add_text("profile/layers", "Caffe's layer-by-layer times (each layer run alone):\n\n"
                            + "\n".join(rows), 0)
    return log_dir, trace
