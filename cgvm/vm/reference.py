"""eval_graph: a direct interpreter of the IR, the reference the VM is tested against.

No codegen, no planning, no passes: walk the nodes in order and call each kernel.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

from ..ir.graph import CONST, PARAM, Graph


class ReferenceRuntime:
    """Runs sub-graphs (scan bodies, cond branches) with eval_graph itself."""

    def __init__(self, xp: Any):
        self.xp = xp

    def compile(self, graph: Graph, copied_outputs: Sequence[int] = ()) -> "_ReferenceRunner":
        return _ReferenceRunner(graph, self.xp)


class _ReferenceRunner:
    def __init__(self, graph: Graph, xp: Any):
        self.graph, self.xp = graph, xp

    def __call__(self, args: Sequence[Any]) -> list:
        return eval_graph(self.graph, args, xp=self.xp)

    def prepare(self, args: Sequence[Any]):
        return lambda *a: tuple(eval_graph(self.graph, a, xp=self.xp))


def eval_graph(graph: Graph, inputs: Sequence[Any], params: Optional[Mapping[str, Any]] = None,
               xp: Any = np) -> list:
    runtime = ReferenceRuntime(xp)
    env: Dict[int, Any] = {id(v): a for v, a in zip(graph.inputs, inputs)}
    params = params or {}

    def read(v):
        hit = env.get(id(v))
        if hit is not None:
            return hit
        if v.kind == CONST:
            return xp.asarray(v.data)
        if v.kind == PARAM:
            return params[v.name]
        raise KeyError(f"value {v.label()} has no value")

    for node in graph.nodes:
        result = node.op.bind(xp, node.attrs, runtime=runtime)(*[read(v) for v in node.inputs])
        results = result if len(node.outputs) > 1 else (result,)
        for v, r in zip(node.outputs, results):
            env[id(v)] = r
    return [read(v) for v in graph.outputs]
