"""ONNX graph -> cgvm IR: the translator that walks a GraphProto and applies one rule per node.

Every ONNX value becomes a cgvm Value. Besides, the translator knows the *static* value of some of
them as NumPy arrays: initializers, Constant nodes, shapes of values whose shape is known, and
whatever is computed only from those (folded here, by running the produced cgvm nodes with the
reference evaluator). Rules ask for a static value where cgvm takes an attribute (a Reshape's
shape, a Slice's starts, a Pad's pads: inputs in recent opsets, attributes in old ones).

Floating-point initializers are parameters (Workspace entries, trainable); they are never folded
into constants, so ``cgvm.grad`` reaches them. Integer initializers are constants.
"""
from __future__ import annotations

from collections import ChainMap
from typing import Any, Callable, Dict, List, Mapping, MutableMapping, Optional, Sequence, Set

import numpy as np

from cgvm.errors import CgvmError
from cgvm.ir import DType, Graph, TensorType, Value, input_value, param_value
from cgvm.ir.graph import CONST, const_value, source_scope
from cgvm.vm import Workspace, eval_graph

from .errors import OnnxImportError, node_where
from .functions import bind_attributes, function_body, has_function

#: (domain, op_type) -> rule; filled by the modules of cgvm.frontends.onnx.rules
RULES: Dict[tuple, "Rule"] = {}

#: the newest ai.onnx opset this frontend translates (the installed onnx package's, at most 28)
MAX_OPSET = 28
DOMAINS = {"": "ai.onnx", "ai.onnx": "ai.onnx"}
#: other domains with a few ops translated (by rules registered under the domain's name)
EXTRA_DOMAINS = {"ai.onnx.preview.training": "ai.onnx.preview.training", "ai.onnx.preview": "ai.onnx.preview"}


class Sequence(list):
    """An ONNX sequence: a list of Values whose length is known when translating (a sequence graph
    input is specialized on its length; a sequence output is a list of outputs)."""


class OptionalValue:
    """An ONNX optional: ``value`` is a Value, a Sequence, or None (empty); known when translating."""

    def __init__(self, value: Any = None):
        self.value = value

    @property
    def empty(self) -> bool:
        return self.value is None


PLUMBING = (Sequence, OptionalValue)


class Rule:
    """How one ONNX op becomes cgvm nodes: ``fn(n: NodeContext) -> Value | [Value | None]``."""

    def __init__(self, op_type: str, fn: Callable[["NodeContext"], Any], fold: bool = True):
        self.op_type = op_type
        self.fn = fn
        self.fold = fold      # outputs computed from static inputs only are folded to constants


def rule(*op_types: str, fold: bool = True, domain: str = "") -> Callable:
    """Register ``fn`` as the translation of the ops ``op_types`` (of the ai.onnx domain by default)."""
    def deco(fn):
        for op in op_types:
            if (domain, op) in RULES:
                raise ValueError(f"ONNX op {op} has two rules")
            RULES[(domain, op)] = Rule(op, fn, fold)
        return fn
    return deco


def supported_ops() -> Set[str]:
    from . import rules  # noqa: F401  (registers the rules)

    return {op for (_, op) in RULES}


def np_dtype(elem_type: int) -> np.dtype:
    import onnx.helper

    if elem_type in _UNSUPPORTED_ELEM:
        raise OnnxImportError(f"tensor element type {_UNSUPPORTED_ELEM[elem_type]} is not supported by cgvm")
    try:
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        raise OnnxImportError(f"unknown tensor element type {elem_type}") from None
    try:
        DType(dt)
    except CgvmError:
        raise OnnxImportError(f"tensor element type {dt.name} is not supported by cgvm") from None
    return dt


# element types cgvm has no dtype for (NumPy has none either, or only through ml_dtypes)
_UNSUPPORTED_ELEM = {0: "UNDEFINED", 8: "STRING", 14: "COMPLEX64", 15: "COMPLEX128"}


def tensor_to_array(t: Any, where: str = "") -> np.ndarray:
    """A TensorProto's data, its element count checked against its dims before anything is built."""
    from onnx import numpy_helper

    dtype = np_dtype(t.data_type)
    dims = tuple(int(d) for d in t.dims)
    if any(d < 0 for d in dims):
        raise OnnxImportError(f"tensor {t.name!r}{where} has a negative dimension in {list(dims)}")
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    is_external = t.data_location == 1
    if not is_external:
        if t.raw_data:
            have = len(t.raw_data) // dtype.itemsize
        else:
            field = {np.dtype(np.float32): t.float_data, np.dtype(np.float64): t.double_data,
                     np.dtype(np.int64): t.int64_data, np.dtype(np.uint64): t.uint64_data,
                     np.dtype(np.uint32): t.uint64_data}.get(dtype, t.int32_data)
            have = len(field)
        if have != count:
            raise OnnxImportError(f"tensor {t.name!r}{where}: dims {list(dims)} need {count} values but the data "
                                  f"holds {have}")
    try:
        arr = numpy_helper.to_array(t)
    except Exception as exc:
        raise OnnxImportError(f"tensor {t.name!r}{where} cannot be read: {exc}") from None
    if arr.shape != dims:
        raise OnnxImportError(f"tensor {t.name!r}{where}: data of shape {arr.shape} for dims {list(dims)}")
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)  # (ascontiguousarray makes 0-d 1-d)


def value_info_type(vi: Any, fixed: Optional[Mapping[str, int]] = None) -> TensorType:
    """The cgvm type of a graph input/output's ValueInfoProto; dim_param (symbolic) dims are None."""
    tt = vi.type
    if tt.WhichOneof("value") != "tensor_type":
        raise OnnxImportError(f"graph input {vi.name!r} is a {tt.WhichOneof('value')}: only tensors are supported")
    t = tt.tensor_type
    dtype = np_dtype(t.elem_type)
    if not t.HasField("shape"):
        raise OnnxImportError(f"graph input {vi.name!r} has no shape: give input types explicitly")
    dims: List[Optional[int]] = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif fixed and d.dim_param in fixed:
            dims.append(int(fixed[d.dim_param]))
        else:
            dims.append(None)
    return TensorType(tuple(dims), dtype)


class NodeContext:
    """What a rule sees of one node: its inputs as Values, attributes, static values, the opset."""

    def __init__(self, tr: "GraphTranslator", node: Any, inputs: List[Optional[Value]]):
        self.tr = tr
        self.node = node
        self.inputs = inputs
        self.opset = tr.opset
        self.attrs = {a.name: a for a in node.attribute}

    @property
    def op_type(self) -> str:
        return self.node.op_type

    @property
    def num_outputs(self) -> int:
        return len(self.node.output)

    def where(self) -> str:
        return node_where(self.node, self.tr.file)

    def error(self, msg: str) -> OnnxImportError:
        return OnnxImportError(f"{self.where()}: {msg}")

    def attr(self, name: str, default: Any = None) -> Any:
        import onnx.helper

        a = self.attrs.get(name)
        if a is None:
            return default
        if a.ref_attr_name:
            raise self.error(f"attribute {name!r} refers to a function attribute; only plain graphs are supported")
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            return v.decode("utf-8")
        if a.type == a.TENSOR:
            return tensor_to_array(v, f" (attribute {name} of {self.where()})")
        if isinstance(v, list) and v and isinstance(v[0], bytes):
            return [s.decode("utf-8") for s in v]
        return v

    def has_input(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def input(self, i: int) -> Value:
        if not self.has_input(i):
            raise self.error(f"input {i} is required")
        return self.inputs[i]

    def static(self, i: int) -> Optional[np.ndarray]:
        """The value of input ``i`` if known at translation time, else None (also for an absent input)."""
        if not self.has_input(i):
            return None
        return self.tr.static_of(self.node.input[i])

    def need_static(self, i: int, what: str) -> np.ndarray:
        v = self.static(i)
        if v is None:
            if not self.has_input(i):
                raise self.error(f"input {i} ({what}) is required")
            raise self.error(f"input {i} ({what}, {self.node.input[i]!r}) must be known when the model is "
                             "translated (a constant, an initializer or computed from shapes); call the model "
                             "with concrete inputs so it is specialized")
        return v

    def shape(self, i: int) -> tuple:
        """Input ``i``'s shape, every dimension known (else a clear error)."""
        s = self.input(i).shape
        if None in s:
            raise self.error(f"input {i} ({self.node.input[i]!r}) needs a known shape here, has {s}")
        return tuple(s)

    def spatial(self, i: int) -> tuple:
        """Input ``i``'s dimensions after batch and channel (N, C, s...), every one known."""
        s = self.input(i).shape[2:]
        if None in s:
            raise self.error(f"input {i} ({self.node.input[i]!r}) needs known spatial dimensions, has "
                             f"{self.input(i).shape}")
        return tuple(s)

    def subgraph(self, name: str) -> Any:
        g = self.attr(name)
        if g is None:
            raise self.error(f"attribute {name!r} (a graph) is required")
        return g

    def run_subgraph(self, graph: Any, bound: Mapping[str, Any]) -> List[Value]:
        """Translate ``graph`` inline (outer names visible), its inputs bound to ``bound`` (Values or
        arrays); returns its outputs."""
        return self.tr.inline(graph, bound)


class GraphTranslator:
    """Translates one GraphProto into cgvm Values over ``env`` (name -> Value)."""

    def __init__(self, *, opset: int, file: Optional[str], workspace: Optional[Workspace], prefix: str = "",
                 env: Optional[MutableMapping[str, Value]] = None,
                 static: Optional[MutableMapping[str, np.ndarray]] = None,
                 foldable: Optional[Set[str]] = None, feeds: Optional[Mapping[str, np.ndarray]] = None):
        self.opset = opset
        self.file = file
        self.workspace = workspace
        self.prefix = prefix
        self.env: MutableMapping[str, Value] = env if env is not None else {}
        self.static: MutableMapping[str, np.ndarray] = static if static is not None else {}
        self.foldable: Set[str] = foldable if foldable is not None else set()
        # run-time values of graph inputs that a rule may read as static (the backend specializes on them)
        self.feeds = dict(feeds or {})
        self.used_feeds: Set[str] = set()
        self.params: Dict[str, Value] = {}
        # Workspace state -> its next value, written after each call (the random ops' generator states)
        self.updates: Dict[Value, Value] = {}

    # -- static values -----------------------------------------------------------------
    def static_of(self, name: str) -> Optional[np.ndarray]:
        hit = self.static.get(name)
        if hit is not None:
            return hit
        if name in self.feeds:
            self.used_feeds.add(name)
            arr = np.asarray(self.feeds[name])
            self.static[name] = arr
            return arr
        if self.feeds and name in self.env:
            return self._evaluate_from_feeds(name)
        return None

    def _evaluate_from_feeds(self, name: str) -> Optional[np.ndarray]:
        """The value of ``name`` computed from the run-time inputs it depends on (the backend
        specializes on those inputs' values, so the result is exact for this call)."""
        from cgvm.ir.graph import INPUT, PARAM, toposort

        v = self.env[name]
        nodes = toposort([v])
        leaves = {id(x): x for nd in nodes for x in nd.inputs if x.kind == INPUT}
        by_value = {id(val): n for n, val in self.env.items() if n in self.feeds}
        if any(i not in by_value for i in leaves):
            return None
        ins = list(leaves.values())
        g = Graph(ins, [v])
        params = {p.name: self.workspace[p.name] for p in g.params
                  if self.workspace is not None and p.name in self.workspace}
        try:
            arr = np.asarray(eval_graph(g, [np.asarray(self.feeds[by_value[id(x)]]) for x in ins], params)[0])
        except Exception:
            return None
        self.used_feeds.update(by_value[id(x)] for x in ins)
        self.static[name] = arr
        return arr

    def set_static(self, name: str, arr: np.ndarray, foldable: bool = True) -> Value:
        arr = np.asarray(arr)
        v = const_value(arr, arr.dtype)
        self.env[name] = v
        self.static[name] = v.data
        if foldable:
            self.foldable.add(name)
        return v

    # -- graph parts ---------------------------------------------------------------------
    def add_initializer(self, t: Any, as_param: bool, store: bool = True) -> None:
        """Initializer ``t`` as a parameter (float, ``as_param``) or a constant; ``store`` writes its
        data into the workspace (False on later translations, which must not reset trained weights)."""
        arr = tensor_to_array(t, f" (initializer in {self.file})" if self.file else " (initializer)")
        if as_param and arr.dtype.kind == "f" and self.workspace is not None:
            wsname = self.prefix + t.name
            if store:
                self.workspace[wsname] = arr
            v = param_value(wsname, TensorType(arr.shape, arr.dtype))
            self.env[t.name] = v
            self.params[wsname] = v
            self.static[t.name] = arr           # readable as an attribute, never folded
        else:
            self.set_static(t.name, arr)

    def translate_nodes(self, nodes: Sequence[Any]) -> None:
        for node in nodes:
            self.translate_node(node)

    def translate_node(self, node: Any) -> None:
        from . import rules  # noqa: F401  (registers the rules)

        domain = node.domain or ""
        if domain not in DOMAINS and domain not in EXTRA_DOMAINS:
            raise OnnxImportError(f"{node_where(node, self.file)}: unknown or unsupported domain {domain!r} "
                                  f"(cgvm translates the ai.onnx domain)")
        r = RULES.get((DOMAINS.get(domain, domain) if domain in EXTRA_DOMAINS else "", node.op_type))
        if r is None and not has_function(node.op_type, self.opset):
            raise OnnxImportError(f"{node_where(node, self.file)}: op {node.op_type} is not supported by cgvm's "
                                  "ONNX frontend")
        inputs: List[Optional[Value]] = []
        for name in node.input:
            if not name:
                inputs.append(None)
                continue
            v = self.env.get(name)
            if v is None:
                raise OnnxImportError(f"{node_where(node, self.file)}: input {name!r} is not produced by any "
                                      "earlier node, initializer or graph input")
            inputs.append(v)
        if r is None:
            self._expand_function(node, inputs)
            return
        n = NodeContext(self, node, inputs)
        with source_scope(f"{self.file or 'onnx'}: {node_where(node)}"):
            try:
                result = r.fn(n)
            except OnnxImportError:
                raise
            except CgvmError as exc:
                raise OnnxImportError(f"{n.where()}: {exc}") from None
            except (ValueError, TypeError, IndexError, KeyError) as exc:
                raise OnnxImportError(f"{n.where()}: {type(exc).__name__}: {exc}") from None
        outs = list(result) if isinstance(result, (list, tuple)) else [result]
        names = [o for o in node.output]
        if len(outs) < len([o for o in names if o]):
            missing = [o for o, _ in zip(names[len(outs):], range(99)) if o]
            if missing:
                raise n.error(f"outputs {missing} are not supported")
        fold = r.fold and all((not i) or i in self.foldable for i in node.input)
        for name, v in zip(names, outs):
            if not name:
                continue
            if v is None:
                raise n.error(f"output {name!r} is not supported")
            if isinstance(v, PLUMBING):
                self.env[name] = v
                continue
            if isinstance(v, np.ndarray):   # computed while translating (from shapes or static inputs)
                self.set_static(name, v)
                continue
            if not isinstance(v, Value):
                v = const_value(np.asarray(v))
            if v.kind == CONST:
                self.env[name] = v
                self.static[name] = v.data
                if fold or not any(node.input):
                    self.foldable.add(name)
                continue
            self.env[name] = v
        if fold:
            self._fold(n, names)

    def _expand_function(self, node: Any, inputs: List[Optional[Value]]) -> None:
        """An op without a rule, translated as the function body ONNX defines for it."""
        import onnx

        fn = function_body(node, self.opset, inputs, self.file)
        g = onnx.GraphProto()
        g.node.extend(bind_attributes(fn, node))
        g.name = f"{node.op_type} function"
        bound: Dict[str, Any] = {}
        for k, name in enumerate(fn.input):
            if k < len(node.input) and node.input[k]:
                g.input.add().name = name
                bound[name] = self.env[node.input[k]]
        for name in fn.output:
            g.output.add().name = name
        outs = self.inline(g, bound, optional_outputs=True)
        for name, v in zip(node.output, outs):
            if name:
                if v is None:
                    raise OnnxImportError(f"{node_where(node, self.file)}: output {name!r} is not computed by the "
                                          "function body")
                self.env[name] = v
                if v.kind == CONST:
                    self.static[name] = v.data
                    self.foldable.add(name)

    def _fold(self, n: NodeContext, names: Sequence[str]) -> None:
        pending = [(name, self.env[name]) for name in names
                   if name and not isinstance(self.env[name], PLUMBING) and self.env[name].kind != CONST]
        if not pending:
            return
        try:
            arrays = eval_graph(Graph([], [v for _, v in pending]), [])
        except Exception:  # run-time errors surface at run time, with the node named there
            return
        for (name, _), arr in zip(pending, arrays):
            self.set_static(name, np.asarray(arr))

    def inline(self, graph: Any, bound: Mapping[str, Any], optional_outputs: bool = False) -> List[Value]:
        """Translate a sub-graph into this graph: its names in a child scope over the outer ones."""
        child = GraphTranslator(opset=self.opset, file=self.file, workspace=self.workspace, prefix=self.prefix,
                                env=ChainMap({}, self.env), static=ChainMap({}, self.static),
                                foldable=set(self.foldable), feeds=self.feeds)
        child.used_feeds = self.used_feeds
        child.params = self.params
        child.updates = self.updates
        for t in graph.initializer:
            child.add_initializer(t, as_param=False)
        for vi, (name, val) in zip(graph.input, bound.items()):
            if isinstance(val, PLUMBING):
                child.env[vi.name] = val
            elif isinstance(val, Value):
                child.env[vi.name] = val
                if val.kind == CONST:
                    child.static[vi.name] = val.data
                    child.foldable.add(vi.name)
            else:
                child.set_static(vi.name, np.asarray(val))
        child.translate_nodes(graph.node)
        outs = []
        for o in graph.output:
            if o.name not in child.env and optional_outputs:
                outs.append(None)
                continue
            if o.name not in child.env:
                raise OnnxImportError(f"sub-graph {graph.name!r}: output {o.name!r} is never computed")
            outs.append(child.env[o.name])
        return outs

    def check_ops(self, graph: Any) -> None:
        """Every node's domain and op is known (sub-graphs too): fail before anything is built."""
        from . import rules  # noqa: F401  (registers the rules)

        for node in graph.node:
            domain = node.domain or ""
            if domain in EXTRA_DOMAINS and (domain, node.op_type) in RULES:
                continue
            if domain not in DOMAINS:
                raise OnnxImportError(f"{node_where(node, self.file)}: unknown or unsupported domain "
                                      f"{node.domain!r} (cgvm translates the ai.onnx domain)")
            if ("", node.op_type) not in RULES and not has_function(node.op_type, self.opset):
                raise OnnxImportError(f"{node_where(node, self.file)}: op {node.op_type} is not supported by "
                                      "cgvm's ONNX frontend")
            for a in node.attribute:
                if a.type == a.GRAPH:
                    self.check_ops(a.g)
                for sub in a.graphs:
                    self.check_ops(sub)

    def output_value(self, name: str) -> Value:
        v = self.env.get(name)
        if v is None:
            raise OnnxImportError(f"graph output {name!r} is not produced by any node"
                                  + (f" in {self.file}" if self.file else ""))
        return v


def make_input(name: str, t: TensorType) -> Value:
    return input_value(t, name)
