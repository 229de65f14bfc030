"""cgvm's IR as TensorBoard's graph dashboard shows it: a GraphDef of NodeDefs.

Every IR node becomes a NodeDef whose name puts it in a name scope taken from the frontend:

* a Caffe or Keras layer: the node's source says ``layer 'conv1' (Convolution)`` or
  ``keras layer 'dense' (Dense)``, so the node is ``conv1/conv`` (a Keras loss or metric,
  ``keras loss 'loss'``, is a scope too);
* a Theano variable name: a node whose output is named (``h.name = 'h'``) is in scope ``h``,
  and so are the unnamed nodes whose scoped readers are all in that scope (``h/matmul``,
  ``h/add``, ``h/tanh``); a shared variable is shown by its name (``W``);
* in a training step (a compiled Function with updates, or one whose outputs after the first
  ``n_outputs`` are gradients), nodes that only those need and that no frontend scope claims are the backward pass: ``gradients/<layer>`` for the latest
  layer whose forward values (or parameters) they read, else the scope of the gradient they
  read, else ``gradients``; the nodes that compute a new
  parameter value are ``updates/<layer>``.

Fused kernels (cgvm.ops.fused) become groups that expand to their ops: a
``fused_elementwise`` node is ``<scope>/fused_elementwise/{multiply, tanh, ...}`` with one op
per step of its program (literals as Const nodes); ``conv_bias_act``, ``gemm_bias_act`` and
``gemm_accumulate`` expand to the product, the bias add (or accumulation) and the activation.
A loop body or branch (``scan``'s ``body``, ``cond``'s ``then_graph``/``else_graph``) is drawn inside
its node's group (``scan/scan`` the op, ``scan/body/...`` the body with its own inputs).
Parameters, inputs and constants are NodeDefs of op ``Parameter``, ``Input`` and ``Const``
that the ops read. Every NodeDef carries ``dtype`` and ``_output_shapes`` (``-1`` for a
dimension known only at run time), the op's attributes, and ``_cgvm_source`` (where it was
written). This module needs the ``tensorboard`` package only for its protos.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Set, Tuple

import numpy as np

from ..ir.graph import CONST, PARAM, Graph, Node, Value, toposort
from ..ir.types import DType
from ..ops.fused import ACC, LIT
from ..ops.rules import broadcast_shapes
from ._deps import tb

_LAYER = re.compile(r"(?:layer|loss|metric) '([^']+)'")
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_.\-/>+]")
_CAFFE_BLOB = re.compile(r"^#\d+:")     # Caffe blob entries in the workspace: '#<net>:<blob>'
_DT = {"float16": "DT_HALF", "float32": "DT_FLOAT", "float64": "DT_DOUBLE", "int8": "DT_INT8",
       "int16": "DT_INT16", "int32": "DT_INT32", "int64": "DT_INT64", "uint8": "DT_UINT8", "bool": "DT_BOOL"}
GRADIENTS, UPDATES = "gradients", "updates"


def clean_name(text: str) -> str:
    """``text`` as a TensorBoard node name: no ``:`` (output index) or other special characters."""
    text = _BAD_CHARS.sub("_", _CAFFE_BLOB.sub("", text))
    text = re.sub(r"/+", "/", text).strip("/")
    return text or "_"


def layer_scope(node: Node) -> Optional[str]:
    """The frontend layer(s) a node was built in, from its source (``a+b`` for a fused chain of two)."""
    if not node.source:
        return None
    names = list(dict.fromkeys(_LAYER.findall(node.source)))
    return clean_name("+".join(names)) if names else None


# --------------------------------------------------------------------------- scopes

def node_scopes(graph: Graph, n_outputs: Optional[int] = None, update_names: Sequence[str] = (),
                param_names: Optional[Mapping[str, str]] = None) -> Dict[int, str]:
    """id(node) -> its name scope ('' for the top level); see the module docstring for the rules."""
    scope: Dict[int, str] = {}
    for node in graph.nodes:
        s = layer_scope(node)
        if s is None:
            named = next((o.name for o in node.outputs if o.name), None)
            s = clean_name(named) if named else None
        if s is not None:
            scope[id(node)] = s
    consumers = graph.consumers()
    output_ids = {id(v) for v in graph.outputs}
    for node in reversed(graph.nodes):   # unnamed helpers join the one scope they feed
        if id(node) in scope or any(id(o) in output_ids for o in node.outputs):
            continue
        users = {scope.get(id(u)) for o in node.outputs for u in consumers.get(id(o), ())} - {None}
        if len(users) == 1:
            scope[id(node)] = users.pop()
    if n_outputs is not None and n_outputs < len(graph.outputs):
        _training_scopes(graph, scope, n_outputs, list(update_names), param_names or {})
    return {id(n): scope.get(id(n), "") for n in graph.nodes}


def _training_scopes(graph: Graph, scope: Dict[int, str], n_outputs: int, update_names: List[str],
                     param_names: Mapping[str, str]) -> None:
    """Unscoped nodes that only the outputs after the first ``n_outputs`` need (updates, or
    gradients returned as outputs): gradients/<layer>, and updates/<layer> for new parameter values."""
    needed = {id(n) for n in toposort(graph.outputs[:n_outputs])}
    first_at: Dict[str, int] = {}
    for i, n in enumerate(graph.nodes):
        if id(n) in scope:
            first_at.setdefault(scope[id(n)], i)
    update_of = {id(v): name for v, name in zip(graph.outputs[n_outputs:], update_names)}
    for node in graph.nodes:
        if id(node) in scope or id(node) in needed:
            continue
        target = next((update_of[id(o)] for o in node.outputs if id(o) in update_of), None)
        if target is not None:
            layer = param_names.get(target, clean_name(target)).rpartition("/")[0]
            scope[id(node)] = f"{UPDATES}/{layer}" if layer else UPDATES
            continue
        forward, backward = set(), set()
        for v in node.inputs:
            if v.kind == PARAM and v.name in param_names:
                layer = param_names[v.name].rpartition("/")[0]
                if layer:
                    forward.add(layer)
            elif v.node is not None and id(v.node) in scope:
                s = scope[id(v.node)]
                (backward if s.startswith(GRADIENTS) else forward).add(s)
        if forward:   # a gradient reads its op's output and inputs: the op is the latest of them
            scope[id(node)] = f"{GRADIENTS}/{max(forward, key=lambda s: first_at.get(s, -1))}"
        elif not forward and len(backward) == 1:
            scope[id(node)] = backward.pop()
        else:
            scope[id(node)] = GRADIENTS


# --------------------------------------------------------------------------- attributes

def _shape_proto(shape: Sequence[Optional[int]]):
    shape_pb2 = tb("compat.proto.tensor_shape_pb2")
    return shape_pb2.TensorShapeProto(dim=[shape_pb2.TensorShapeProto.Dim(size=-1 if d is None else int(d))
                                           for d in shape])


def _dtype_enum(dtype: Any) -> int:
    types_pb2 = tb("compat.proto.types_pb2")
    return types_pb2.DataType.Value(_DT.get(DType(dtype).name, "DT_INVALID"))


def _attr(value: Any):
    """An op attribute as an AttrValue (lists of numbers as lists, anything else as its text)."""
    attr_value_pb2 = tb("compat.proto.attr_value_pb2")
    if isinstance(value, (bool, np.bool_)):
        return attr_value_pb2.AttrValue(b=bool(value))
    if isinstance(value, (int, np.integer)):
        return attr_value_pb2.AttrValue(i=int(value))
    if isinstance(value, (float, np.floating)):
        return attr_value_pb2.AttrValue(f=float(value))
    if isinstance(value, str):
        return attr_value_pb2.AttrValue(s=value.encode())
    if isinstance(value, DType):
        return attr_value_pb2.AttrValue(type=_dtype_enum(value))
    if isinstance(value, (tuple, list)) and value and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                                                          for x in value):
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(i=[int(x) for x in value]))
    if isinstance(value, (tuple, list)) and value and all(isinstance(x, (float, int)) for x in value):
        return attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(f=[float(x) for x in value]))
    if isinstance(value, Graph):
        text = f"<graph {value.name}: {len(value.nodes)} nodes>"
    elif isinstance(value, np.ndarray):
        text = f"<array {value.dtype}{list(value.shape)}>"
    else:
        text = repr(value)
    return attr_value_pb2.AttrValue(s=text[:300].encode())


# --------------------------------------------------------------------------- the builder

class GraphDefBuilder:
    """Builds the GraphDef of one IR graph; ``stat_name[id(node)]`` names the NodeDef that stands
    for an IR node in a profile (a fused group's last op)."""

    def __init__(self, graph: Graph, *, n_outputs: Optional[int] = None, update_names: Sequence[str] = (),
                 expand_fused: bool = True, param_labels: Optional[Mapping[str, str]] = None):
        graph_pb2 = tb("compat.proto.graph_pb2")
        self.graph = graph
        self.expand_fused = expand_fused
        self.param_labels = dict(param_labels or {})
        self.out = graph_pb2.GraphDef()
        self.taken: Set[str] = set()
        self.scopes: Set[str] = set()
        self.ref: Dict[int, str] = {}          # id(value) -> the input string naming it
        self.stat_name: Dict[int, str] = {}    # id(node) -> NodeDef name
        param_names = self._leaves()
        scopes = node_scopes(graph, n_outputs, update_names, param_names)
        for node in graph.nodes:
            self._node(node, scopes[id(node)])

    def unique(self, name: str) -> str:
        """``name``, else ``name_1``, ``name_2``...: never a name taken, nor a scope another name is in."""
        base, k = name, 0
        while name in self.taken or name in self.scopes:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        parts = name.split("/")
        self.scopes.update("/".join(parts[:i]) for i in range(1, len(parts)))
        return name

    def add(self, name: str, op: str, inputs: Sequence[str], dtype: Any = None,
            shapes: Sequence[Sequence[Optional[int]]] = (), attrs: Optional[Mapping[str, Any]] = None,
            source: Optional[str] = None):
        attr_value_pb2 = tb("compat.proto.attr_value_pb2")
        nd = self.out.node.add(name=name, op=op, input=list(inputs))
        if dtype is not None:
            nd.attr["dtype"].CopyFrom(attr_value_pb2.AttrValue(type=_dtype_enum(dtype)))
        if shapes:
            nd.attr["_output_shapes"].CopyFrom(attr_value_pb2.AttrValue(
                list=attr_value_pb2.AttrValue.ListValue(shape=[_shape_proto(s) for s in shapes])))
        for k, v in sorted((attrs or {}).items()):
            nd.attr[k].CopyFrom(_attr(v))
        if source:
            nd.attr["_cgvm_source"].CopyFrom(_attr(source))
        return nd

    # -- leaves
    def _leaves(self) -> Dict[str, str]:
        """NodeDefs for inputs, parameters and constants; returns parameter name -> NodeDef name."""
        first_scope: Dict[int, str] = {}
        for node in self.graph.nodes:
            s = layer_scope(node)
            for v in node.inputs:
                if s and id(v) not in first_scope:
                    first_scope[id(v)] = s
        for k, v in enumerate(self.graph.inputs):
            name = self.unique(clean_name(v.name or f"input_{k}"))
            self.ref[id(v)] = name
            self.add(name, "Input", [], v.dtype, [v.shape], {"index": k})
        param_names: Dict[str, str] = {}
        for v in self.graph.leaves():
            if id(v) in self.ref:
                continue
            if v.kind == PARAM:
                name = self._param_name(v, first_scope.get(id(v)))
                param_names.setdefault(v.name, name)
                self.add(name, "Parameter", [], v.dtype, [v.shape], {"workspace_entry": v.name})
            elif v.kind == CONST:
                scope = first_scope.get(id(v))
                name = self.unique(f"{scope}/const" if scope else "const")
                shown = {"value": v.data.item()} if v.data.size == 1 else {"value": v.data}
                self.add(name, "Const", [], v.dtype, [v.shape], shown)
            else:
                continue
            self.ref[id(v)] = name
        return param_names

    def _param_name(self, v: Value, scope: Optional[str]) -> str:
        """A parameter sits in the scope of the first layer reading it when its name says so
        ('keras/dense/kernel' read in 'dense' is 'dense/kernel'; Caffe's 'conv1/0' is itself)."""
        name = clean_name(self.param_labels.get(v.name, v.name))
        if scope and scope in name.split("/") and not name.startswith(scope + "/"):
            name = f"{scope}/{name.rpartition('/')[2]}"
        return self.unique(name)

    # -- nodes
    def _inputs(self, node: Node) -> List[str]:
        return [self.ref[id(v)] for v in node.inputs]

    def _node(self, node: Node, scope: str) -> None:
        base = f"{scope}/{node.op.name}" if scope else node.op.name
        expand = _EXPANSIONS.get(node.op.name) if self.expand_fused else None
        bodies = [(k, g) for k, g in node.attrs.items() if isinstance(g, Graph)]
        if expand is not None:
            group = self.unique(base)
            last = expand(self, node, group, self._inputs(node))
        elif bodies:
            group = self.unique(base)
            last = self.unique(f"{group}/{node.op.name}")
            attrs = {k: v for k, v in node.attrs.items() if not isinstance(v, Graph)}
            self.add(last, node.op.name, self._inputs(node), node.outputs[0].dtype if node.outputs else None,
                     [o.shape for o in node.outputs], attrs, node.source)
            for key, body in bodies:
                self._body(body, f"{group}/{key}")
        else:
            last = self.unique(base)
            attrs = {k: v for k, v in node.attrs.items()}
            self.add(last, node.op.name, self._inputs(node), node.outputs[0].dtype if node.outputs else None,
                     [o.shape for o in node.outputs], attrs, node.source)
        self.stat_name[id(node)] = last
        for k, o in enumerate(node.outputs):
            self.ref[id(o)] = last if k == 0 else f"{last}:{k}"


    def _body(self, body: Graph, group: str) -> None:
        """A loop body or branch (a graph attribute) inside the group of its node: its own inputs,
        its ops, and the parameters it reads (the outer Parameter node where there is one)."""
        outer_ref = self.ref
        self.ref = {}
        for k, v in enumerate(body.inputs):
            name = self.unique(f"{group}/{clean_name(v.name or f'input_{k}')}")
            self.ref[id(v)] = name
            self.add(name, "Input", [], v.dtype, [v.shape], {"index": k})
        outer_params = {n.attr["workspace_entry"].s.decode(): n.name for n in self.out.node if n.op == "Parameter"}
        for v in body.leaves():
            if id(v) in self.ref:
                continue
            if v.kind == PARAM and v.name in outer_params:
                self.ref[id(v)] = outer_params[v.name]
            elif v.kind == PARAM:
                self.ref[id(v)] = self.unique(f"{group}/{clean_name(v.name)}")
                self.add(self.ref[id(v)], "Parameter", [], v.dtype, [v.shape], {"workspace_entry": v.name})
            elif v.kind == CONST:
                self.ref[id(v)] = self.unique(f"{group}/const")
                self.add(self.ref[id(v)], "Const", [], v.dtype, [v.shape],
                         {"value": v.data.item() if v.data.size == 1 else v.data})
        scopes = node_scopes(body)
        for inner in body.nodes:
            self._node(inner, f"{group}/{scopes[id(inner)]}" if scopes[id(inner)] else group)
        self.ref = outer_ref


# --------------------------------------------------------------------------- fused groups

def _literal(b: GraphDefBuilder, group: str, operand: Tuple[str, Any, str]) -> str:
    name = b.unique(f"{group}/literal")
    b.add(name, "Const", [], operand[2], [()], {"value": operand[1]})
    return name


def _expand_elementwise(b: GraphDefBuilder, node: Node, group: str, inputs: List[str]) -> str:
    """One op per program step; 'acc' is the previous step's result."""
    out = node.outputs[0]
    acc_name, acc_shape = None, ()
    steps = node.attrs["program"]
    for i, (ufunc, operands) in enumerate(steps):
        names, shapes = [], []
        for r in operands:
            if r == ACC:
                names.append(acc_name)
                shapes.append(acc_shape)
            elif isinstance(r, tuple) and r and r[0] == LIT:
                names.append(_literal(b, group, r))
                shapes.append(())
            else:
                names.append(inputs[r])
                shapes.append(node.inputs[r].shape)
        shape = out.shape if i == len(steps) - 1 else broadcast_shapes(*shapes)
        acc_name = b.unique(f"{group}/{ufunc}")
        acc_shape = shape
        b.add(acc_name, ufunc, names, out.dtype, [shape], {"_cgvm_fused_into": node.op.name},
              node.source)
    return acc_name


def _epilogue(b: GraphDefBuilder, node: Node, group: str, first: str, first_inputs: List[str],
              first_attrs: Mapping[str, Any], extra: Sequence[Tuple[str, List[str]]]) -> str:
    """The master op, then each extra step (name, other inputs), then the activation."""
    out = node.outputs[0]
    tag = {"_cgvm_fused_into": node.op.name}
    name = b.unique(f"{group}/{first}")
    b.add(name, first, first_inputs, out.dtype, [out.shape], {**first_attrs, **tag}, node.source)
    for op, others in extra:
        step = b.unique(f"{group}/{op}")
        b.add(step, op, [name] + others, out.dtype, [out.shape], tag, node.source)
        name = step
    act = node.attrs.get("act", "none")
    if act != "none":
        step = b.unique(f"{group}/{act}")
        b.add(step, act, [name], out.dtype, [out.shape], tag, node.source)
        name = step
    return name


def _expand_conv(b: GraphDefBuilder, node: Node, group: str, inputs: List[str]) -> str:
    attrs = {k: v for k, v in node.attrs.items() if k != "act"}
    return _epilogue(b, node, group, "conv", inputs, attrs, ())


def _expand_gemm_bias_act(b: GraphDefBuilder, node: Node, group: str, inputs: List[str]) -> str:
    trans = {k: node.attrs[k] for k in ("trans_a", "trans_b")}
    return _epilogue(b, node, group, "matmul", inputs[:2], trans, [("add", [inputs[2]])])


def _expand_gemm_accumulate(b: GraphDefBuilder, node: Node, group: str, inputs: List[str]) -> str:
    extra: List[Tuple[str, List[str]]] = []
    if len(inputs) >= 4:
        extra.append(("mul", [inputs[3]]))
    extra.append(("add", [inputs[2]] + inputs[4:]))   # c, and the beta value scaling it
    attrs = {"alpha": node.attrs["alpha"], "beta": node.attrs["beta"]}
    return _epilogue(b, node, group, "matmul", inputs[:2], attrs, extra)


_EXPANSIONS = {"fused_elementwise": _expand_elementwise, "conv_bias_act": _expand_conv,
               "gemm_bias_act": _expand_gemm_bias_act, "gemm_accumulate": _expand_gemm_accumulate}


# --------------------------------------------------------------------------- entry points

def graph_def(graph: Graph, *, n_outputs: Optional[int] = None, update_names: Sequence[str] = (),
              expand_fused: bool = True, param_labels: Optional[Mapping[str, str]] = None) -> Any:
    """The GraphDef of ``graph``. ``n_outputs``/``update_names``: the graph is a training step whose
    outputs after the first ``n_outputs`` are gradients or (``update_names``, in order) the new
    values of these parameters."""
    return GraphDefBuilder(graph, n_outputs=n_outputs, update_names=update_names, expand_fused=expand_fused,
                           param_labels=param_labels).out


class FunctionGraphs(NamedTuple):
    graph: Graph                   # after the passes
    source: Graph                  # as written
    n_outputs: int                 # results; the outputs after them are the updates
    update_names: List[str]        # workspace entries the updates write, in order
    param_labels: Dict[str, str]   # workspace entry -> the frontend's name for it


def function_graphs(function: Any) -> FunctionGraphs:
    """The graphs of a compiled function (cgvm.compile's Function, a theano.function, or anything
    holding one as ``core``); a frontend function may name its parameters (``param_labels``)."""
    labels = dict(getattr(function, "param_labels", None) or {})
    core = getattr(function, "core", function)
    core = getattr(core, "_core", core)
    if not hasattr(core, "source_graph"):
        raise TypeError(f"expected a compiled cgvm function, got {type(function).__name__}")
    return FunctionGraphs(core.graph, core.source_graph, core.n_outputs, list(core.update_names), labels)


def op_names(gd: Any) -> List[str]:
    """The ops of a GraphDef that compute (not its Input, Parameter and Const leaves)."""
    return [n.name for n in gd.node if n.op not in ("Input", "Parameter", "Const")]


__all__ = ["graph_def", "GraphDefBuilder", "function_graphs", "FunctionGraphs", "node_scopes", "layer_scope", "clean_name", "op_names"]

