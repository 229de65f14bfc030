"""ONNX sub-graphs (If branches, Loop and Scan bodies) as closed cgvm graphs for cgvm's control ops.

cgvm's ``scan`` and ``cond`` take closed bodies: everything a body reads is one of its inputs.
An ONNX body reads outer names freely, so the body is translated over a :class:`CaptureEnv`: the
first time it reads an outer value that is not a constant, the value becomes a fresh body input
and is remembered as a capture (the control node then takes it as an operand, so gradients reach
captured parameters). Constants stay constants. Nothing is read from the run-time feeds inside a
body: a body is the same program whatever the inputs' values.
"""
from __future__ import annotations

from collections import ChainMap
from typing import Any, Dict, Iterator, List, Mapping, MutableMapping, Optional, Sequence, Tuple

import numpy as np

from cgvm.ir import Graph, TensorType, Value, input_value
from cgvm.ir.graph import CONST, INPUT, PARAM
from cgvm.ops import shape as shp

from .errors import OnnxImportError


class CaptureEnv(MutableMapping):
    """A body's names over the enclosing graph's: outer non-constant Values read through it become
    body inputs (one per outer Value), listed in ``captures`` as (outer value, body input)."""

    def __init__(self, outer: Mapping[str, Any]):
        self.local: Dict[str, Any] = {}
        self.outer = outer
        self.captures: List[Tuple[Value, Value]] = []
        self._by_id: Dict[int, Value] = {}

    def _capture(self, name: str, v: Any) -> Any:
        from .translate import Sequence as OnnxSequence

        if isinstance(v, OnnxSequence):
            return OnnxSequence(self._capture(f"{name}_{k}", x) for k, x in enumerate(v))
        if not isinstance(v, Value) or v.kind == CONST:
            return v
        hit = self._by_id.get(id(v))
        if hit is None:
            hit = input_value(v.type, f"captured_{name}")
            self._by_id[id(v)] = hit
            self.captures.append((v, hit))
        return hit

    def __getitem__(self, name: str) -> Any:
        if name in self.local:
            return self.local[name]
        v = self.outer[name]                      # KeyError when neither scope has it
        inner = self._capture(name, v)
        self.local[name] = inner
        return inner

    def __contains__(self, name: object) -> bool:
        return name in self.local or name in self.outer

    def __setitem__(self, name: str, v: Any) -> None:
        self.local[name] = v

    def __delitem__(self, name: str) -> None:
        del self.local[name]

    def __iter__(self) -> Iterator[str]:
        yield from self.local
        for k in self.outer:
            if k not in self.local:
                yield k

    def __len__(self) -> int:
        return len(set(self.local) | set(self.outer))


class Body:
    """A translated sub-graph: its input Values, output Values and captures (outer values read)."""

    def __init__(self, inputs: List[Value], outputs: List[Any], captures: List[Tuple[Value, Value]], name: str):
        self.inputs = inputs
        self.outputs = outputs
        self.captures = captures
        self.name = name

    @property
    def outer(self) -> List[Value]:
        return [o for o, _ in self.captures]

    def graph(self, outputs: Optional[Sequence[Value]] = None, operands: Optional[Sequence[Value]] = None) -> Graph:
        """The closed graph (body inputs, then one input per operand in ``operands``, default the
        captures) -> ``outputs`` (default the body's outputs); leaf outputs become computed copies."""
        outs = [_computed(v) for v in (self.outputs if outputs is None else outputs)]
        by_outer = {id(o): i for o, i in self.captures}
        extra = [by_outer.get(id(v)) or input_value(v.type, f"unused{k}")
                 for k, v in enumerate(self.outer if operands is None else operands)]
        return Graph(list(self.inputs) + extra, outs, name=self.name)


def _computed(v: Value) -> Value:
    if not isinstance(v, Value):
        raise OnnxImportError("a control-flow body returns a sequence or an optional: only tensors can leave a "
                              "body that runs at run time")
    return shp.contiguous(v) if v.kind in (INPUT, PARAM, CONST) else v


def translate_body(tr: Any, graph: Any, inputs: Sequence[Any], name: str) -> Body:
    """Translate ``graph`` closed: ``inputs`` gives, per graph input, a TensorType (a run-time body
    input) or an array (a constant, e.g. a Loop's condition input, true whenever the body runs)."""
    from .translate import GraphTranslator

    if len(inputs) != len(graph.input):
        raise OnnxImportError(f"sub-graph {graph.name!r} takes {len(graph.input)} inputs, the node gives "
                              f"{len(inputs)}")
    env = CaptureEnv(tr.env)
    own = {vi.name for vi in graph.input} | {t.name for t in graph.initializer}
    # outer static values stay readable (shapes, constants), except those a body name shadows
    static = ChainMap({}, {k: v for k, v in tr.static.items() if k not in own})
    child = GraphTranslator(opset=tr.opset, file=tr.file, workspace=tr.workspace, prefix=tr.prefix, env=env,
                            static=static, foldable=set(tr.foldable) - own, feeds=None)
    child.used_feeds = tr.used_feeds
    child.params = tr.params
    for t in graph.initializer:
        child.add_initializer(t, as_param=False)
    body_inputs: List[Value] = []
    for vi, spec in zip(graph.input, inputs):
        if isinstance(spec, TensorType):
            v = input_value(spec, vi.name or "in")
            env[vi.name] = v
            body_inputs.append(v)
        else:
            child.set_static(vi.name, np.asarray(spec))
    child.translate_nodes(graph.node)
    outs = []
    for o in graph.output:
        if o.name not in env:
            raise OnnxImportError(f"sub-graph {graph.name!r}: output {o.name!r} is never computed")
        outs.append(env[o.name])
    return Body(body_inputs, outs, env.captures, name)


def translate_body_fixpoint(tr: Any, graph: Any, inputs: Sequence[Any], carried: Sequence[Tuple[int, int]],
                            name: str) -> Body:
    """``translate_body`` where body input ``i`` and output ``j`` of each (i, j) in ``carried`` are
    the same loop-carried value: a dimension the body changes is unknown on every step, so the
    body is translated again with it unknown (rules must not fold the first step's shape)."""
    specs = list(inputs)
    for _ in range(8):
        body = translate_body(tr, graph, specs, name)
        changed = False
        for i, j in carried:
            t, out = specs[i], body.outputs[j]
            if not isinstance(t, TensorType) or not isinstance(out, Value):
                continue
            if out.ndim != t.ndim:
                raise OnnxImportError(f"sub-graph {graph.name!r}: loop-carried value {graph.input[i].name!r} "
                                      f"changes rank from {t.ndim} to {out.ndim}")
            if out.dtype is not t.dtype:
                raise OnnxImportError(f"sub-graph {graph.name!r}: loop-carried value {graph.input[i].name!r} "
                                      f"changes type from {t.dtype.name} to {out.dtype.name}")
            dims = tuple(a if a == b else None for a, b in zip(t.shape, out.shape))
            if dims != tuple(t.shape):
                specs[i] = TensorType(dims, t.dtype)
                changed = True
        if not changed:
            return body
    raise OnnxImportError(f"sub-graph {graph.name!r}: the loop-carried shapes do not settle")
