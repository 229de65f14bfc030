"""``cgvm.onnx.export``: a cgvm graph written as a standard ONNX model.

    cgvm.onnx.export(fn, "model.onnx")             # a compiled cgvm Function (its outputs, not updates)
    cgvm.onnx.export(net, "lenet.onnx")            # a cgvm.caffe.Net (its forward pass, TEST phase)
    cgvm.onnx.export(model, "m.onnx", example=x)   # a Keras-style model (predict's graph)
    cgvm.onnx.export(theano_fn, "f.onnx")          # a Theano-style function

Parameters become initializers (their current Workspace values); every cgvm op is lowered to
ai.onnx ops by a rule in ``export_ops`` (fused ops such as conv_bias_act, gemm_bias_act and
fused_elementwise included, so an optimized graph exports as well); nodes computed from constants
only are evaluated and written as initializers. Unknown dimensions become dim_params. The result
is checked with ``onnx.checker.check_model(full_check=True)`` before it is written.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from cgvm.ir import Graph, Value
from cgvm.ir.graph import CONST, INPUT, PARAM
from cgvm.vm import Workspace, default_workspace, eval_graph

from .errors import OnnxExportError

EXPORT_OPSET = 17


class ExportContext:
    """Names for values, and the ONNX nodes and initializers written so far."""

    def __init__(self, workspace: Workspace):
        import onnx

        self.onnx = onnx
        self.workspace = workspace
        self.nodes: List[Any] = []
        self.initializers: Dict[str, Any] = {}
        self.names: Dict[int, str] = {}
        self._count = 0
        self.root = self

    def fresh(self, hint: str = "t") -> str:
        root = self.root        # one counter for the model: names are unique across sub-graphs too
        root._count += 1
        return f"{hint}_{root._count}"

    def child(self) -> "ExportContext":
        """A context for a sub-graph (an If branch, a Loop body): its own nodes, the model's
        initializers and names."""
        sub = ExportContext(self.workspace)
        sub.root = self.root
        sub.initializers = self.initializers
        return sub

    def const(self, arr: Any, hint: str = "const") -> str:
        arr = np.asarray(arr)
        name = self.fresh(hint)
        self.initializers[name] = self.onnx.numpy_helper.from_array(arr, name)
        return name

    def ints(self, values: Sequence[int], hint: str = "ints") -> str:
        return self.const(np.asarray(list(values), np.int64), hint)

    def name(self, v: Value) -> str:
        hit = self.names.get(id(v))
        if hit is not None:
            return hit
        if v.kind == CONST:
            name = self.const(v.data, "c")
        elif v.kind == PARAM:
            name = v.name
            if name not in self.initializers:
                if v.name not in self.workspace:
                    raise OnnxExportError(f"parameter {v.name!r} has no value in the workspace")
                arr = self.workspace.backend.to_numpy(self.workspace[v.name])
                self.initializers[name] = self.onnx.numpy_helper.from_array(np.asarray(arr), name)
        else:
            raise OnnxExportError(f"value {v.label()} is used before it is computed")
        self.names[id(v)] = name
        return name

    def node(self, op_type: str, inputs: Sequence[str], n_out: int = 1, outputs: Optional[Sequence[str]] = None,
             **attrs: Any) -> List[str]:
        outs = list(outputs) if outputs is not None else [self.fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), outs,
                                                     **{k: v for k, v in attrs.items() if v is not None}))
        return outs

    def one(self, op_type: str, inputs: Sequence[str], **attrs: Any) -> str:
        return self.node(op_type, inputs, **attrs)[0]


def _tensor_type(v: Value, name: str) -> Any:
    import onnx.helper

    dims = [d if d is not None else f"{name}_d{i}" for i, d in enumerate(v.shape)]
    return onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(v.dtype.np), dims)


def export_graph(graph: Graph, workspace: Optional[Workspace] = None, *, input_names: Optional[Sequence[str]] = None,
                 output_names: Optional[Sequence[str]] = None, name: Optional[str] = None,
                 opset: int = EXPORT_OPSET, check: bool = True) -> Any:
    """The ONNX ModelProto of ``graph`` (parameters read from ``workspace``)."""
    import onnx

    ws = workspace if workspace is not None else default_workspace()
    ctx = ExportContext(ws)
    in_names = list(input_names) if input_names is not None else [
        _clean(v.name) or f"input_{i}" for i, v in enumerate(graph.inputs)]
    if len(set(in_names)) != len(in_names):
        in_names = [f"{n}_{i}" for i, n in enumerate(in_names)]
    for v, n in zip(graph.inputs, in_names):
        ctx.names[id(v)] = n
    lower_nodes(ctx, graph.nodes)
    out_names = list(output_names) if output_names is not None else [f"output_{i}" for i in range(len(graph.outputs))]
    outputs = []
    for v, want in zip(graph.outputs, out_names):
        have = ctx.name(v) if v.kind in (CONST, PARAM) else ctx.names.get(id(v))
        if have is None:
            raise OnnxExportError(f"output {v.label()} is never computed")
        ctx.node("Identity", [have], outputs=[want])
        outputs.append(_tensor_type(v, want))
    inputs = [_tensor_type(v, n) for v, n in zip(graph.inputs, in_names)]
    g = onnx.helper.make_graph(ctx.nodes, name or graph.name or "cgvm", inputs, outputs,
                               initializer=list(ctx.initializers.values()))
    model = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", opset)],
                                   producer_name="cgvm", producer_version=_version())
    model.ir_version = min(model.ir_version, 10)      # readable by the installed onnxruntime
    if check:
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as exc:
            raise OnnxExportError(f"the exported model fails onnx.checker: {exc}") from None
    return model


def lower_nodes(ctx: ExportContext, nodes: Sequence[Any]) -> None:
    """Every node as ONNX nodes in ``ctx`` (its inputs already named there)."""
    from .export_ops import LOWERINGS

    for node in nodes:
        if node.inputs and all(v.kind == CONST for v in node.inputs) and not getattr(node.op, "stateful", False) \
                or (not node.inputs and not getattr(node.op, "stateful", False)):
            # computed from constants only: write the result, not the computation
            values = eval_graph(Graph([], list(node.outputs)), [])
            for out, arr in zip(node.outputs, values):
                ctx.names[id(out)] = ctx.const(np.asarray(arr), node.op.name)
            continue
        lower = LOWERINGS.get(node.op.name)
        if lower is None:
            raise OnnxExportError(f"{node.where()}: op {node.op.name} has no ONNX lowering")
        try:
            outs = lower(ctx, node, [ctx.name(v) for v in node.inputs])
        except OnnxExportError:
            raise
        except (KeyError, ValueError, TypeError) as exc:
            raise OnnxExportError(f"{node.where()}: cannot be lowered to ONNX: {exc}") from None
        outs = [outs] if isinstance(outs, str) else list(outs)
        for v, o in zip(node.outputs, outs):
            ctx.names[id(v)] = o


def _version() -> str:
    from cgvm import __version__

    return __version__


def _clean(name: Optional[str]) -> str:
    return "".join(c if c.isalnum() or c in "_./:" else "_" for c in name) if name else ""


def _graph_of(obj: Any, example: Any = None, optimized: bool = False) -> tuple:
    """(graph, workspace, input names) of something cgvm can export."""
    from cgvm.compiled_function import Function

    if isinstance(obj, Graph):
        return obj, None, None
    if isinstance(obj, Function):
        g = obj.graph if optimized else obj.source_graph
        return Graph(list(g.inputs), list(g.outputs[:obj.n_outputs]), name=g.name), obj.workspace, None
    core = getattr(obj, "_core", None)
    if isinstance(core, Function):                     # a Theano-style function
        return _graph_of(core, optimized=optimized)
    if callable(getattr(obj, "export_graph", None)):   # a cgvm.caffe.Net (frontends never import each other)
        g = obj.export_graph()
        return g, obj.workspace, [v.name for v in g.inputs]
    if hasattr(obj, "_predict_function"):              # a Keras-style model
        if example is None:
            shape = getattr(obj, "input_shape", None)
            if shape is None:
                raise OnnxExportError("export of a Keras-style model needs example= (an input batch)")
            example = np.zeros(tuple(1 if d is None else d for d in shape), np.float32)
        xs = obj._inputs_list(example)
        obj._ensure_built(xs)
        fn, _ = obj._predict_function(xs)
        return _graph_of(fn, optimized=optimized)
    from .model import OnnxModel

    if isinstance(obj, OnnxModel):
        g = obj.graph()
        return g, obj.workspace, obj.input_names
    raise OnnxExportError(f"cannot export a {type(obj).__name__}: give a compiled Function, a caffe.Net, a "
                          "Keras-style model, a Theano-style function or a cgvm Graph")


def export(obj: Any, path: Optional[str] = None, *, workspace: Optional[Workspace] = None, example: Any = None,
           input_names: Optional[Sequence[str]] = None, output_names: Optional[Sequence[str]] = None,
           opset: int = EXPORT_OPSET, optimized: bool = False) -> Any:
    """Write ``obj`` as ONNX to ``path`` (if given); returns the checked ModelProto. ``optimized``
    exports a compiled function's graph after cgvm's passes (fused ops lowered) instead of as written."""
    import onnx

    graph, ws, names = _graph_of(obj, example, optimized)
    model = export_graph(graph, workspace if workspace is not None else ws, input_names=input_names or names,
                         output_names=output_names, opset=opset)
    if path is not None:
        tmp = f"{os.fspath(path)}.partial"
        onnx.save(model, tmp)
        os.replace(tmp, path)                           # never a half-written file under the real name
    return model


__all__ = ["export", "export_graph", "EXPORT_OPSET", "INPUT"]
