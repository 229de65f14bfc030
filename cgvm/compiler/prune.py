"""Pruning: keep only the nodes the requested outputs need (backward), cut at given values (forward)."""
from __future__ import annotations

from typing import Optional, Sequence

from ..ir.graph import Graph, Value


def prune(graph: Graph, outputs: Optional[Sequence[Value]] = None, given: Sequence[Value] = ()) -> Graph:
    """The sub-graph computing ``outputs`` (default: the graph's), treating ``given`` values as inputs.

    Values in ``given`` are fed from outside, so nothing upstream of them is computed (this is
    how Caffe's ``forward(start=...)`` and Theano's ``givens`` cut a graph).
    """
    outs = list(graph.outputs if outputs is None else outputs)
    inputs = list(graph.inputs) + [v for v in given if all(v is not i for i in graph.inputs)]
    return Graph(inputs, outs, name=graph.name)
