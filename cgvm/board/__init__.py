"""TensorBoard for cgvm: event files, graphs and per-op profiles, written with the tensorboard package.

    SummaryWriter(log_dir)     scalars, histograms, images, text, graphs, run metadata (writer.py)
    graph_def(graph)           cgvm's IR as TensorBoard's graph dashboard shows it (graph.py)
    OpProfiler(function)       per-op times: TensorBoard run metadata and Chrome trace JSON (profile.py)
    write_graph(fn, log_dir)   a compiled function's graph, after and before the passes
    cgvm board LOGDIR          starts TensorBoard on a log directory (cli_command.py)

Layering: this package reads IR graphs and compiled functions (duck-typed: ``graph``,
``source_graph``, ``executable``) and imports only cgvm.ir, cgvm.ops, cgvm.backend and
cgvm.errors; the frontends and cgvm.compiled_function call it, never the reverse. The tensorboard
package is imported on first use (the ``board`` extra: ``pip install 'cgvm[board]'``).
"""
from __future__ import annotations

from typing import Any

from ._deps import INSTALL_HINT, TensorBoardUnavailable
from .graph import GraphDefBuilder, graph_def, op_names
from .profile import OpProfiler
from .writer import BEFORE_PASSES_TAG, SummaryWriter, as_numpy


def write_graph(function: Any, log_dir: str, *, before_passes: bool = True) -> GraphDefBuilder:
    """Write ``function``'s graph (a cgvm.compile or theano.function result, or an IR Graph) to
    the run ``log_dir``: after the passes as the run's graph, as written under tag before_passes."""
    with SummaryWriter(log_dir) as writer:
        return writer.add_graph(function, before_passes=before_passes)


__all__ = ["SummaryWriter", "GraphDefBuilder", "graph_def", "op_names", "OpProfiler", "write_graph", "as_numpy",
           "BEFORE_PASSES_TAG", "TensorBoardUnavailable", "INSTALL_HINT"]
