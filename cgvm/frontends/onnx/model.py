"""``cgvm.onnx.load``: an ONNX model as something callable, compilable and trainable.

    model = cgvm.onnx.load("resnet.onnx")      # initializers -> Workspace parameters
    y = model(x)                                # translated and compiled per input shape signature
    fn = model.compile()                        # a cgvm Function over the model's declared input types
    outs = model.symbolic(x_value)              # cgvm Values: mix with other frontends, cgvm.grad them

Translation needs static values where cgvm takes attributes (shapes, axes, pads); with symbolic
(dim_param) input dimensions the rules use dynamic ops where cgvm has them, and otherwise ask for
concrete shapes. Calling the model specializes on the concrete shapes, and on the values of graph
inputs that a rule reads as static (a Reshape's shape fed as an input), so every call is exact.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from cgvm.compiled import compile as cgvm_compile
from cgvm.compiled_function import Function
from cgvm.ir import Graph, TensorType, Value
from cgvm.ir.graph import CONST, INPUT, PARAM
from cgvm.ops import shape as shp
from cgvm.vm import Workspace, default_workspace

from .errors import OnnxFileError, OnnxImportError
from .translate import DOMAINS, EXTRA_DOMAINS, MAX_OPSET, GraphTranslator, make_input, np_dtype, value_info_type


def read_model(source: Any) -> Tuple[Any, Optional[str]]:
    """A ModelProto from a path, bytes or a ModelProto, external data loaded; errors name the file."""
    import onnx

    if isinstance(source, onnx.ModelProto):
        return source, None
    if isinstance(source, (bytes, bytearray)):
        model = onnx.ModelProto()
        try:
            model.ParseFromString(bytes(source))
        except Exception as exc:
            raise OnnxFileError(f"ONNX bytes cannot be parsed: {exc}") from None
        return model, None
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise OnnxFileError(f"{path}: no such ONNX file")
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise OnnxFileError(f"{path}: the file is empty")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:
        raise OnnxFileError(f"{path}: not a valid ONNX model (malformed or truncated protobuf: {exc})") from None
    if not model.HasField("graph"):
        raise OnnxFileError(f"{path}: not an ONNX model (no graph)")
    try:
        from onnx.external_data_helper import load_external_data_for_model, uses_external_data

        if any(uses_external_data(t) for t in model.graph.initializer):
            load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
    except Exception as exc:
        raise OnnxFileError(f"{path}: external data cannot be read: {exc}") from None
    return model, path


def model_opset(model: Any, file: Optional[str]) -> int:
    where = f"{file}: " if file else ""
    version = None
    for imp in model.opset_import:
        if imp.domain in DOMAINS:
            version = int(imp.version)
    if version is None:
        others = sorted(imp.domain for imp in model.opset_import)
        if not model.opset_import:
            version = 1
        elif any(d in EXTRA_DOMAINS for d in others) or all(n.domain not in DOMAINS for n in model.graph.node):
            version = MAX_OPSET if any(d in EXTRA_DOMAINS for d in others) else None
    if version is None:
        raise OnnxImportError(f"{where}the model imports no ai.onnx opset, only "
                              f"{sorted(imp.domain for imp in model.opset_import)}, which cgvm does not translate")
    if version > MAX_OPSET:
        raise OnnxImportError(f"{where}opset {version} of ai.onnx is newer than the newest cgvm supports "
                              f"({MAX_OPSET})")
    return version


class OnnxModel:
    """An imported ONNX model over a Workspace holding its initializers as parameters."""

    def __init__(self, model: Any, *, workspace: Optional[Workspace] = None, prefix: str = "",
                 file: Optional[str] = None, params: bool = True):
        self.proto = model
        self.file = file
        self.opset = model_opset(model, file)
        self.workspace = workspace if workspace is not None else default_workspace()
        self.prefix = prefix
        self._as_params = params
        g = model.graph
        init_names = {t.name for t in g.initializer}
        self.input_names: List[str] = [vi.name for vi in g.input if vi.name not in init_names]
        self.output_names: List[str] = [vi.name for vi in g.output]
        self._input_info = {vi.name: vi for vi in g.input}
        self._cache: Dict[Any, Tuple[Dict[str, Any], Function, List[Any]]] = {}
        # every initializer read and every op checked before the workspace is touched: nothing half-loaded
        staging = Workspace(self.workspace.backend)
        tr = GraphTranslator(opset=self.opset, file=file, workspace=staging, prefix=prefix)
        for t in g.initializer:
            tr.add_initializer(t, as_param=params)
        tr.check_ops(g)
        for name in self.input_names:
            check_input_type(self._input_info[name])
        self._check_translation(staging)
        for name in list(staging.keys()):
            self.workspace[name] = staging[name]
        self.params: Dict[str, Value] = tr.params
        self.updates: Dict[Value, Value] = {}

    # -- translation ---------------------------------------------------------------------
    def _check_translation(self, staging: Workspace) -> None:
        """Translate once with the declared input types, so shape errors (an initializer that does not
        fit its node) surface at load; what needs concrete inputs is left to the first call."""
        saved, self.workspace = self.workspace, staging
        try:
            self._translator(staging, None, None)
        except OnnxImportError as exc:
            if not any(k in str(exc) for k in _DEFERRED):
                raise
        finally:
            self.workspace = saved

    def input_types(self, fixed: Optional[Mapping[str, int]] = None) -> List[TensorType]:
        for n in self.input_names:
            kind = self._input_info[n].type.WhichOneof("value")
            if kind != "tensor_type":
                raise OnnxImportError(f"graph input {n!r} is a {kind.split('_')[0]}: its length and element "
                                      "shapes must be known (call the model with concrete inputs)")
        return [value_info_type(self._input_info[n], fixed) for n in self.input_names]

    def _translator(self, workspace: Workspace, types: Optional[Sequence[TensorType]],
                    feeds: Optional[Mapping[str, np.ndarray]], values: Optional[Sequence[Value]] = None
                    ) -> GraphTranslator:
        g = self.proto.graph
        tr = GraphTranslator(opset=self.opset, file=self.file, workspace=workspace, prefix=self.prefix, feeds=feeds)
        for t in g.initializer:
            tr.add_initializer(t, as_param=self._as_params, store=False)
        if values is None:
            types = list(types) if types is not None else self.input_types()
        for k, name in enumerate(self.input_names):
            v = values[k] if values is not None else make_input(name, types[k])
            tr.env[name] = v
        tr.translate_nodes(g.node)
        tr.outputs = [tr.output_value(n) for n in self.output_names]
        return tr

    def symbolic(self, *inputs: Any, **named: Any) -> List[Value]:
        """The model's outputs as cgvm Values of ``inputs`` (Values, or anything with __cgvm_value__)."""
        from cgvm.ir.builder import as_value

        vals = list(inputs) + [named[n] for n in self.input_names[len(inputs):] if n in named]
        if len(vals) != len(self.input_names):
            raise OnnxImportError(f"the model takes {len(self.input_names)} inputs {self.input_names}, "
                                  f"got {len(vals)}")
        vals = [as_value(v) for v in vals]
        tr = self._translator(self.workspace, [v.type for v in vals], None, vals)
        self.params = tr.params
        # random ops' generator states and their next values: pass them as updates to advance the draws
        self.updates = dict(tr.updates)
        return tr.outputs

    def graph(self, input_types: Optional[Sequence[TensorType]] = None) -> Graph:
        return self._graph_and_updates(input_types)[0]

    def _graph_and_updates(self, input_types: Optional[Sequence[TensorType]]) -> Tuple[Graph, Dict[Value, Value]]:
        tr = self._translator(self.workspace, input_types, None)
        ins = [tr.env[n] for n in self.input_names]
        for name, v in zip(self.output_names, tr.outputs):
            if not isinstance(v, Value):
                raise OnnxImportError(f"graph output {name!r} is a sequence or an optional: a compiled cgvm "
                                      "function returns tensors only (call the model instead)")
        return Graph(ins, [_materialize(v) for v in tr.outputs], name=_graph_name(self)), tr.updates

    def compile(self, input_types: Optional[Sequence[TensorType]] = None, **kwargs: Any) -> Function:
        """A cgvm Function of the model's inputs (declared types, symbolic dims left unknown); the random
        ops' generator states advance on every call."""
        g, updates = self._graph_and_updates(input_types)
        if updates:
            kwargs["updates"] = {**updates, **(kwargs.get("updates") or {})}
        return cgvm_compile(list(g.inputs), list(g.outputs), workspace=self.workspace, name=g.name, **kwargs)

    # -- running ---------------------------------------------------------------------------
    def run(self, inputs: Union[Sequence[Any], Mapping[str, Any]]) -> List[np.ndarray]:
        """Outputs for ``inputs`` (a list in graph-input order or a name -> array mapping)."""
        if isinstance(inputs, Mapping):
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise OnnxImportError(f"inputs {missing} are not given")
            arrays = [inputs[n] for n in self.input_names]
        else:
            arrays = list(inputs)
        if len(arrays) != len(self.input_names):
            raise OnnxImportError(f"the model takes {len(self.input_names)} inputs {self.input_names}, "
                                  f"got {len(arrays)}")
        values = [_as_input(self._input_info[n].type, a, n) for n, a in zip(self.input_names, arrays)]
        for name, a in zip(self.input_names, values):
            if isinstance(a, np.ndarray) and self._input_info[name].type.WhichOneof("value") == "tensor_type":
                t = value_info_type(self._input_info[name])
                if a.dtype != t.dtype.np:
                    raise OnnxImportError(f"input {name!r} has dtype {a.dtype}, the model declares {t.dtype.name}")
                if len(a.shape) != len(t.shape) or any(d is not None and d != s for d, s in zip(t.shape, a.shape)):
                    raise OnnxImportError(f"input {name!r} has shape {a.shape}, the model declares {t.shape}")
        key = tuple(_signature(a) for a in values)
        entry = self._cache.get(key)
        feeds = {n: a for n, a in zip(self.input_names, values) if isinstance(a, np.ndarray)}
        if entry is not None and not all(np.array_equal(feeds[n], v) for n, v in entry[0].items()):
            entry = None
        if entry is None:
            entry = self._specialize(values, feeds)
            self._cache[key] = entry
        _, fn, plan = entry
        leaves: List[np.ndarray] = []
        for a in values:
            _leaves(a, leaves)
        res = fn(*leaves) if fn is not None else []
        return [_rebuild(p, res) for p in plan[1]]

    __call__ = lambda self, *inputs: _single(self.run(list(inputs)))  # noqa: E731

    def _specialize(self, values: Sequence[Any], feeds: Mapping[str, np.ndarray]):
        leaves: List[Value] = []
        env_values = [_input_value(name, a, leaves) for name, a in zip(self.input_names, values)]
        tr = self._translator(self.workspace, None, feeds, env_values)
        used = {n: feeds[n] for n in tr.used_feeds}
        # every input stays an input: a value read as static may still feed nodes built before
        computed: List[Value] = []
        outs_plan = [_plan(v, leaves, computed) for v in tr.outputs]
        fn = None
        if computed:
            fn = cgvm_compile(leaves, computed, workspace=self.workspace, name=_graph_name(self),
                              updates=tr.updates or None)
        return used, fn, (None, outs_plan)

    def __repr__(self) -> str:
        return (f"<OnnxModel {_graph_name(self)}: opset {self.opset}, inputs {self.input_names}, "
                f"outputs {self.output_names}, {len(self.params)} parameters>")


# translation errors that only mean "call me with concrete inputs"
_DEFERRED = ("must be known", "needs a known shape", "needs known spatial", "must fold to a constant",
             "sequence length and batch size must be known")


def check_input_type(vi: Any) -> None:
    """A graph input is a tensor, a sequence of tensors or an optional of either (checked at load)."""
    tp = vi.type
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        value_info_type(vi)
    elif kind == "sequence_type" and tp.sequence_type.elem_type.WhichOneof("value") == "tensor_type":
        np_dtype(tp.sequence_type.elem_type.tensor_type.elem_type)
    elif kind == "optional_type":
        inner = tp.optional_type.elem_type
        if inner.WhichOneof("value") not in ("tensor_type", "sequence_type"):
            raise OnnxImportError(f"graph input {vi.name!r} is an optional of a {inner.WhichOneof('value')}: "
                                  "only optional tensors and sequences are supported")
    else:
        raise OnnxImportError(f"graph input {vi.name!r} is a {kind}: only tensors, sequences of tensors and "
                              "optionals are supported")


def _as_input(tp: Any, a: Any, name: str) -> Any:
    """A run-time input as its declared kind: an array, a list of arrays, or None (an empty optional)."""
    kind = tp.WhichOneof("value")
    if kind == "optional_type":
        return None if a is None else _as_input(tp.optional_type.elem_type, a, name)
    if kind == "sequence_type":
        if not isinstance(a, (list, tuple)):
            raise OnnxImportError(f"input {name!r} is a sequence: give a list of arrays, not {type(a).__name__}")
        want = np_dtype(tp.sequence_type.elem_type.tensor_type.elem_type)
        items = [np.asarray(x) for x in a]
        for k, x in enumerate(items):
            if x.dtype != want:
                raise OnnxImportError(f"input {name!r}[{k}] has dtype {x.dtype}, the model declares {want.name}")
        return items
    if a is None:
        raise OnnxImportError(f"input {name!r} is a tensor, not an optional: it must be given")
    return np.asarray(a)


def _signature(a: Any) -> Any:
    if a is None:
        return None
    if isinstance(a, list):
        return ("seq",) + tuple((x.shape, x.dtype.str) for x in a)
    return (a.shape, a.dtype.str)


def _leaves(a: Any, out: List[Any]) -> None:
    if isinstance(a, list):
        out.extend(a)
    elif a is not None:
        out.append(a)


def _input_value(name: str, a: Any, leaves: List[Value]) -> Any:
    """The translator's value of one run-time input (a Value, a Sequence of Values, an empty optional);
    the Values made are appended to ``leaves`` (the compiled function's inputs, in order)."""
    from .translate import OptionalValue, Sequence as OnnxSequence

    if a is None:
        return OptionalValue(None)
    if isinstance(a, list):
        items = [make_input(f"{name}_{k}", TensorType(x.shape, x.dtype)) for k, x in enumerate(a)]
        leaves.extend(items)
        return OnnxSequence(items)
    v = make_input(name, TensorType(a.shape, a.dtype))
    leaves.append(v)
    return v


def _plan(v: Any, leaves: Sequence[Value], computed: List[Value]) -> Any:
    """How one output is read back from the compiled function's results."""
    from .translate import OptionalValue, Sequence as OnnxSequence

    if isinstance(v, OptionalValue):
        return ("none",) if v.empty else _plan(v.value, leaves, computed)
    if isinstance(v, OnnxSequence):
        return ("seq", [_plan(x, leaves, computed) for x in v])
    if v.kind == CONST:
        return ("const", np.array(v.data))
    computed.append(shp.contiguous(v) if v.kind == INPUT and any(v is i for i in leaves) else v)
    return ("run", len(computed) - 1)


def _rebuild(p: Any, res: Sequence[Any]) -> Any:
    if p[0] == "seq":
        return [_rebuild(x, res) for x in p[1]]
    if p[0] == "none":
        return None
    return res[p[1]] if p[0] == "run" else p[1]


def _single(outs: List[Any]) -> Any:
    return outs[0] if len(outs) == 1 else outs


def _graph_name(m: OnnxModel) -> str:
    return m.proto.graph.name or (os.path.basename(m.file) if m.file else "onnx")


def _materialize(v: Value) -> Value:
    """An output that is a leaf (an input, parameter or constant) becomes a computed copy."""
    return shp.contiguous(v) if v.kind in (INPUT, PARAM, CONST) else v


def load(source: Any, *, workspace: Optional[Workspace] = None, prefix: str = "", params: bool = True) -> OnnxModel:
    """Import an ONNX model (a path, bytes or a ModelProto); its float initializers become parameters
    in ``workspace`` (the default one if not given), named ``prefix + initializer name``."""
    model, path = read_model(source)
    return OnnxModel(model, workspace=workspace, prefix=prefix, file=path, params=params)


__all__ = ["OnnxModel", "load", "read_model", "np_dtype"]
