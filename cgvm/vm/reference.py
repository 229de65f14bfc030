"""The reference interpreter: the IR run node by node, what the VM is tested against.

No codegen, no planning, no passes: walk the nodes in order and call each kernel. Subclass
``Interpreter`` (as ``torch.fx.Interpreter``) to trace or change what runs:

    class Tracing(Interpreter):
        def run_node(self, node, args):
            out = super().run_node(node, args)
            print(node.where(), [getattr(o, "shape", None) for o in out])
            return out

    outputs = Tracing(graph).run([x_array])
    outputs, values = eval_graph(graph, [x_array], intermediate=True)   # every value, by Value

``run_node(node, args) -> tuple of outputs`` evaluates one node; ``read(value)`` gives an input,
constant or parameter (``fetch_param(name)`` looks parameters up); sub-graphs (scan bodies,
cond branches) run with the same interpreter class.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Type, Union

import numpy as np

from ..ir.graph import CONST, PARAM, Graph, Node, Value


class Interpreter:
    """Evaluates ``graph`` on arrays of array module ``xp``; ``run(inputs)`` returns the outputs."""

    def __init__(self, graph: Graph, params: Optional[Mapping[str, Any]] = None, xp: Any = np):
        self.graph, self.params, self.xp = graph, dict(params or {}), xp
        self.env: Dict[int, Any] = {}       # id(Value) -> its array, filled as the nodes run

    # -- what a subclass may change ---------------------------------------------------------
    def run_node(self, node: Node, args: Sequence[Any]) -> Tuple[Any, ...]:
        """The outputs of ``node`` for input arrays ``args``, one per output."""
        result = node.op.bind(self.xp, node.attrs, runtime=_SubgraphRunner(type(self), self))(*args)
        return tuple(result) if len(node.outputs) > 1 else (result,)

    def fetch_param(self, name: str) -> Any:
        try:
            return self.params[name]
        except KeyError:
            raise KeyError(f"parameter {name!r} has no value") from None

    def read(self, v: Value) -> Any:
        hit = self.env.get(id(v))
        if hit is not None:
            return hit
        if v.kind == CONST:
            return self.xp.asarray(v.data)
        if v.kind == PARAM:
            return self.fetch_param(v.name)
        raise KeyError(f"value {v.label()} has no value")

    # -- running ----------------------------------------------------------------------------
    def run(self, inputs: Sequence[Any]) -> list:
        self.env = {id(v): a for v, a in zip(self.graph.inputs, inputs)}
        for node in self.graph.nodes:
            for v, r in zip(node.outputs, self.run_node(node, [self.read(v) for v in node.inputs])):
                self.env[id(v)] = r
        return [self.read(v) for v in self.graph.outputs]

    def values(self) -> Dict[Value, Any]:
        """Every value the last run computed or read, by Value (inputs and node outputs)."""
        by_id = {id(v): v for v in self.graph.inputs}
        by_id.update({id(o): o for n in self.graph.nodes for o in n.outputs})
        return {by_id[k]: a for k, a in self.env.items() if k in by_id}


class _SubgraphRunner:
    """The runtime control-flow ops get: runs their sub-graphs with the interpreter's own class."""

    def __init__(self, cls: Type[Interpreter], parent: Interpreter):
        self.cls, self.parent = cls, parent

    def compile(self, graph: Graph, copied_outputs: Sequence[int] = ()) -> "_GraphRun":
        return _GraphRun(self.cls, graph, self.parent)


class _GraphRun:
    def __init__(self, cls: Type[Interpreter], graph: Graph, parent: Interpreter):
        self.cls, self.graph, self.parent = cls, graph, parent

    def _interpreter(self) -> Interpreter:
        sub = self.cls.__new__(self.cls)
        sub.__dict__.update(self.parent.__dict__)   # same settings (params, xp, a subclass's own)
        sub.graph, sub.env = self.graph, {}
        return sub

    def __call__(self, args: Sequence[Any]) -> list:
        return self._interpreter().run(args)

    def prepare(self, args: Sequence[Any]):
        return lambda *a: tuple(self._interpreter().run(a))


#: kept for one release: the runtime eval_graph used for sub-graphs (now the interpreter's own)
class ReferenceRuntime:
    def __init__(self, xp: Any):
        self.xp = xp

    def compile(self, graph: Graph, copied_outputs: Sequence[int] = ()) -> "_GraphRun":
        return _GraphRun(Interpreter, graph, Interpreter(graph, xp=self.xp))


def eval_graph(graph: Graph, inputs: Sequence[Any], params: Optional[Mapping[str, Any]] = None,
               xp: Any = np, *, intermediate: bool = False,
               interpreter: Type[Interpreter] = Interpreter) -> Union[list, Tuple[list, Dict[Value, Any]]]:
    """The outputs of ``graph`` for ``inputs`` (and parameter arrays ``params`` by name), run by the
    reference interpreter; with ``intermediate=True`` also every value it computed, by Value (as
    the ONNX reference evaluator's ``intermediate=True``)."""
    interp = interpreter(graph, params, xp)
    outputs = interp.run(inputs)
    return (outputs, interp.values()) if intermediate else outputs
