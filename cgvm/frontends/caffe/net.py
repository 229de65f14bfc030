"""A Caffe Net as one cgvm graph over a Workspace, constructed as Caffe constructs it.

Construction: read (upgrading legacy formats), filter by phase/level/stages, insert Split layers
(Caffe's names), then set every layer up in file order. Each layer's converter builds its nodes
inside ``source_scope("<file>:<line>: layer 'name' (Type)")``.

Workspace entries (all arrays of the net's backend):

* learnable blobs: ``"<layer>/<i>"``, or the ParamSpec name when one is given (layers naming the
  same param share it); their diffs: ``"<param>@diff"``;
* blobs: ``"#<net id>:<blob>"`` and diffs ``"#<net id>:<blob>@diff"``; an in-place layer's earlier
  values (kept for backward) get ``"~<layer index>"`` appended; dropout seeds ``"...@seed"``;
* states a layer carries from one forward to the next (LSTM/RNN's h and c): ``"#<net id>:<layer>@h_0"``
  (what the graph starts from) and ``"...@h_T"`` (what the forward ends with, written as an update).
  Before every forward of the layer the host copies ``_T`` into ``_0``; the backward rebuilds the
  graph over the same ``_0`` entry, so it sees the state the forward started from.

``forward`` compiles (once per layer range and input shapes) a Function whose outputs are every
blob the range computes, and stores them; ``backward`` compiles the gradient graph of the same
range, reading the stored blobs instead of recomputing them, seeded with the stored top diffs
(loss tops hold their loss weight, as Caffe's SetLossWeights leaves them). ``training_graph``
gives the symbolic loss and parameter gradients for a solver to compile in one step.

net_build.py builds a layer range's graph (and declares learnable blobs at setup); net_compile.py
compiles ranges into the cached forward and backward Functions.
"""
from __future__ import annotations

import os
from collections import OrderedDict
from itertools import count as _counter
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from cgvm.autodiff import grad_map
from cgvm.env import check_bytes, env_flag, shape_bytes
from cgvm.errors import CgvmError
from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeNetError
from cgvm.frontends.caffe.filter import filter_net, insert_splits, layer_included
from cgvm.frontends.caffe.layers import AUTO_TOP_TYPES, CONVERTERS, DATA_LAYERS, LOSS_TYPES
from cgvm.frontends.caffe.net_build import (LayerInfo, NetDataContext, ParamInfo, RangeBuild, build_range,
                                            range_loss)
from cgvm.frontends.caffe.net_compile import TrainingGraph, backward_function, forward_function
from cgvm.frontends.caffe.prototxt import describe_fork_extension, read_net_with_lines
from cgvm.ir import TensorType, Value, param_value
from cgvm.vm.workspace import Workspace

from cgvm.frontends.caffe.blob import Blob, LayerView, ParamBlob  # noqa: E402  (re-exported)

_net_ids = _counter()


class Net:
    """A Caffe net: ``Net(prototxt, phase)``, ``Net(prototxt, weights, phase)`` or keyword forms.

    Keywords beyond pycaffe's: ``workspace`` (share one with other nets: same-named params are
    then shared, as a solver's train and test nets), ``backend``, ``dtype`` (float32; float64 for
    gradient checks), ``seed`` (fillers and dropout), ``allow_python_layers`` (run the user's
    code of ``type: "Python"`` layers; off unless asked, or CGVM_ALLOW_PYTHON_LAYERS=1/true/yes).
    """

    def __init__(self, network_file: Any, *args: Any, phase: Any = None, level: int = 0,
                 stages: Iterable[str] = (), weights: Optional[str] = None, workspace: Optional[Workspace] = None,
                 backend: Any = None, dtype: Any = np.float32, seed: Optional[int] = None,
                 allow_python_layers: Optional[bool] = None, filename: Optional[str] = None):
        if len(args) == 1:
            phase = args[0]
        elif len(args) == 2:   # legacy pycaffe form: Net(file, pretrained_file, phase)
            weights, phase = args
        elif args:
            raise TypeError("Net(network_file, phase) or Net(network_file, weights, phase)")
        if phase is None:
            raise TypeError("Net needs a phase: caffe.TRAIN or caffe.TEST")
        self.id = next(_net_ids)
        self.dtype = np.dtype(dtype)
        self.workspace = workspace if workspace is not None else Workspace(backend)
        self._rng = np.random.default_rng(seed)
        if allow_python_layers is None:
            allow_python_layers = env_flag("CGVM_ALLOW_PYTHON_LAYERS")
        self.allow_python_layers = bool(allow_python_layers)
        self.param, lines, self.filename = self._read(network_file, filename)
        self.phase = _phase(phase)
        existing = set(self.workspace.keys())
        try:
            self._construct(lines, level, list(stages))
            if weights:
                self.copy_from(weights)
        except BaseException:   # a shared workspace keeps nothing of a net that failed to build
            for name in set(self.workspace.keys()) - existing:
                del self.workspace[name]
            raise

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _read(source: Any, filename: Optional[str]):
        if isinstance(source, caffe_pb2.NetParameter):
            from cgvm.frontends.caffe.upgrade import upgrade_net

            net = upgrade_net(source, source=filename or "<NetParameter>")
            return net, [None] * len(net.layer), filename or "<NetParameter>"
        net, lines = read_net_with_lines(source, filename=filename)
        name = filename or (os.fspath(source) if isinstance(source, os.PathLike) or
                            (isinstance(source, str) and os.path.isfile(source)) else "<string>")
        return net, lines, name

    def _construct(self, lines: List[Optional[int]], level: int, stages: List[str]) -> None:
        filtered = filter_net(self.param, self.phase, level, stages)
        kept = [line for layer, line in zip(self.param.layer, lines) if layer_included(layer, filtered.state)]
        self.state = filtered.state
        self.force_backward = filtered.force_backward
        _check_bottoms(filtered, kept, self._where)
        split = insert_splits(filtered)
        self._layers: List[LayerInfo] = []
        self._params: "OrderedDict[str, ParamInfo]" = OrderedDict()
        self._produced: Dict[str, Tuple[int, int]] = {}
        self._blob_order: List[str] = []
        self.blob_loss_weights: "OrderedDict[str, float]" = OrderedDict()
        self._version_entry: Dict[Tuple[int, int], str] = {}
        line_of = _lines_after_splits(filtered, kept, split)
        for index, layer in enumerate(split.layer):
            self._add_layer(index, layer, line_of[index])
        for i, info in enumerate(self._layers):
            for t, name in enumerate(info.tops):
                self._version_entry[(i, t)] = self._entry(name) if self._produced[name] == (i, t) \
                    else f"{self._entry(name)}~{i}"
        self._functions: Dict[Any, Any] = {}
        self._setup()

    def _where(self, index: int, layer: caffe_pb2.LayerParameter, line: Optional[int]) -> str:
        place = f"{self.filename}:{line}" if line is not None else self.filename
        return f"{place}: layer '{layer.name}' ({layer.type})"

    def _add_layer(self, index: int, layer: caffe_pb2.LayerParameter, line: Optional[int]) -> None:
        where = self._where(index, layer, line)
        kind = layer.type
        if kind not in CONVERTERS and kind not in DATA_LAYERS and kind != "Python":
            fork = describe_fork_extension(kind)
            hint = (f"it comes from {fork}, not BVLC Caffe" if fork else
                    f"known types: {', '.join(sorted(set(CONVERTERS) | set(DATA_LAYERS) | {'Python'}))}")
            raise CaffeNetError(f"{where}: unknown layer type {kind!r}; {hint}")
        tops = list(layer.top)
        if kind in AUTO_TOP_TYPES and not tops:
            tops = ["(automatic)"]
        for b, name in enumerate(layer.bottom):
            if name not in self._produced:
                raise CaffeNetError(f"{where}: unknown bottom blob {name!r} (bottom {b}); no earlier layer "
                                    "produces it")
        for t, name in enumerate(tops):
            if name in self._produced and not (t < len(layer.bottom) and layer.bottom[t] == name):
                raise CaffeNetError(f"{where}: top blob {name!r} is produced by more than one layer; only a "
                                    f"layer's top i may reuse its bottom i's name (in place)")
        weights = list(layer.loss_weight)
        if len(weights) > len(tops):
            raise CaffeNetError(f"{where}: {len(weights)} loss_weight values for {len(tops)} tops")
        if not weights and kind in LOSS_TYPES:
            weights = [1.0]
        weights += [0.0] * (len(tops) - len(weights))
        info = LayerInfo(layer, index, where, list(layer.bottom), tops, weights)
        if kind in DATA_LAYERS:
            try:
                info.data = DATA_LAYERS[kind](layer, self._layer_phase(layer), NetDataContext(self, info))
            except CgvmError:
                raise
            except (ValueError, TypeError, OSError) as exc:
                raise CaffeNetError(f"{where}: {exc}") from exc
        elif kind == "Python":
            from cgvm.frontends.caffe.layers.python_layer import create_python_layer

            info.python = create_python_layer(self, info)
        self._layers.append(info)
        for t, name in enumerate(tops):
            if name not in self._produced:
                self._blob_order.append(name)
            self._produced[name] = (len(self._layers) - 1, t)
            self.blob_loss_weights[name] = weights[t]

    def _layer_phase(self, layer: caffe_pb2.LayerParameter) -> int:
        return layer.phase if layer.HasField("phase") else self.phase

    def _entry(self, blob: str) -> str:
        return f"#{self.id}:{blob}"

    def _setup(self) -> None:
        """Shape every blob (data layers first fill), create learnable blobs, check every layer.

        Nothing big is allocated before the whole net's size is known: the setup build records
        its allocations (fillers, seeds, carried states) in order, the bytes of everything the
        net will hold are checked against the memory limit, and only then are they made.
        """
        ws = self.workspace
        itemsize = self.dtype.itemsize
        data_tops = [(self._entry(name), tuple(int(d) for d in shape)) for info in self._layers
                     if info.data is not None for name, shape in zip(info.tops, info.data.top_shapes())]
        check_bytes(sum(shape_bytes(s, itemsize) for _, s in data_tops) * 2,
                    f"{self.filename}: the net's data layers",
                    parts=[(e.split(":", 1)[1], shape_bytes(s, itemsize)) for e, s in data_tops])
        for entry, shape in data_tops:
            ws.set(entry, np.zeros(shape, self.dtype))
        self._setting_up = True
        self._deferred: List[Tuple[str, Tuple[int, ...], Any]] = []
        try:
            build = self._build(0, len(self._layers) - 1)
        finally:
            self._setting_up = False
        deferred, self._deferred = self._deferred, []
        self._check_size(build, data_tops, deferred)
        for _, _, make in deferred:   # in the order the build asked: fillers draw from the net's generator
            make()
        for info in self._layers:
            if len(info.param.param) > len(info.params):
                raise CaffeNetError(f"{info.where}: {len(info.param.param)} param specs, but the layer has "
                                    f"{len(info.params)} learnable blob(s)")
        for (i, t, value) in build.versions:
            self._ensure_blob(self._version_entry[(i, t)], value.shape)
            self._ensure_blob(self._entry(self._layers[i].tops[t]), value.shape)
        for info in self._layers:
            for t, name in enumerate(info.tops):
                if info.loss_weights[t]:
                    ws[self._entry(name) + "@diff"][...] = info.loss_weights[t]

    def _check_size(self, build: RangeBuild, data_tops, deferred) -> None:
        """Refuse (ResourceLimitError) a net whose blobs, diffs and learnable blobs pass the memory limit."""
        itemsize = self.dtype.itemsize
        parts: Dict[str, int] = {}
        for entry, shape in data_tops:
            parts[entry.split(":", 1)[1]] = 2 * shape_bytes(shape, itemsize)
        for name, shape, _ in deferred:
            parts.setdefault(name, 2 * shape_bytes(shape, itemsize))
        for (i, t, value) in build.versions:
            shape = tuple(0 if d is None else int(d) for d in value.shape)
            parts.setdefault(f"blob {self._layers[i].tops[t]!r} (layer '{self._layers[i].name}')",
                             2 * shape_bytes(shape, itemsize))
        #: bytes of the net's blobs, diffs and learnable blobs (a solver adds its histories to it)
        self.bytes_needed = sum(parts.values())
        check_bytes(self.bytes_needed, f"{self.filename}: the net (blobs, diffs and learnable blobs)",
                    parts=parts.items())

    def _defer(self, name: str, shape: Sequence[int], make: Any) -> None:
        """At setup: make a workspace entry after the size check (``make()``), else now."""
        if self._setting_up:
            self._deferred.append((name, tuple(int(d) for d in shape), make))
        else:
            make()

    def _ensure_blob(self, entry: str, shape: Sequence[int]) -> None:
        ws = self.workspace
        # a dimension known only at run time (Filter's kept items) starts empty; forward stores the real blob
        shape = tuple(0 if d is None else int(d) for d in shape)
        if entry not in ws or tuple(ws[entry].shape) != shape:
            ws.set(entry, np.zeros(shape, self.dtype))
        if entry + "@diff" not in ws or tuple(ws[entry + "@diff"].shape) != shape:
            ws.set(entry + "@diff", np.zeros(shape, self.dtype))

    # ------------------------------------------------------------------ graph building
    def _leaf_value(self, build: RangeBuild, entry: str, dtype: Any = None) -> Value:
        hit = build.params.get(entry)
        if hit is None:
            array = self.workspace[entry]
            hit = build.params[entry] = param_value(entry, TensorType(array.shape, dtype or array.dtype))
        return hit

    def _build(self, lo: int, hi: int, given: Optional[Dict[str, Value]] = None) -> RangeBuild:
        """Graph values of layers lo..hi (see net_build.build_range)."""
        return build_range(self, lo, hi, given)

    # ------------------------------------------------------------------ forward
    def _prepare_range(self, lo: int, hi: int) -> None:
        ws = self.workspace
        for info in self._layers[lo:hi + 1]:
            if info.data is not None:
                for name, array in info.data.next_batch().items():
                    self.write_blob(self._entry(name), np.asarray(array, self.dtype))
            if info.seed_entry is not None:
                ws.set(info.seed_entry, np.array(self._rng.integers(1 << 62), dtype=np.int64))
            for initial, final in info.carried_states:
                self._carry(initial, final)
            if info.python is not None:
                info.python.before_forward()

    def _carry(self, initial: str, final: str) -> None:
        """Start the next forward from the state the last one ended with (Caffe copies h_T into h_0)."""
        ws = self.workspace
        start, end = ws[initial], ws[final]
        if end.shape == start.shape and end.dtype == start.dtype:
            ws.set(initial, end.copy())
        else:   # only if someone rebound one of them: neither is a state the graph can start from
            ws.set(initial, np.zeros(start.shape, start.dtype))
            ws.set(final, np.zeros(start.shape, start.dtype))

    def _fit_carried_states(self, carried: Sequence[Tuple[str, str, Tuple[int, ...], np.dtype]]) -> None:
        """Zero the carried states a function reads when they have another shape (the batch size changed
        since it was built): a compiled function cached for one batch size may run again after another."""
        ws = self.workspace
        for initial, final, shape, dtype in carried:
            if any(tuple(ws[e].shape) != shape or ws[e].dtype != dtype for e in (initial, final)):
                ws.set(initial, np.zeros(shape, dtype))
                ws.set(final, np.zeros(shape, dtype))

    def _forward(self, lo: int, hi: int) -> float:
        """Run layers lo..hi (inclusive indices); store their tops; return the loss."""
        self._prepare_range(lo, hi)
        fn, has_loss, entries, canonical, carried = forward_function(self, lo, hi)
        self._fit_carried_states(carried)
        results = fn()
        loss = float(results[0]) if has_loss else 0.0
        values = results[1:] if has_loss else results
        ws = self.workspace
        for value, entry, also in zip(values, entries, canonical):
            self._store(entry, value)
            if also is not None:
                self._store(also, value)
        for info in self._layers[lo:hi + 1]:   # sinks (HDF5Output) get their bottoms after the forward
            if info.data is not None and hasattr(info.data, "write"):
                info.data.write({name: ws[self._entry(name)] for name in info.bottoms})
        return loss

    def _store(self, entry: str, value: Any) -> None:
        ws = self.workspace
        self.write_blob(entry, value)
        diff = entry + "@diff"
        old = ws.get(diff)
        if old is None or old.shape != value.shape:
            ws.set(diff, np.zeros(value.shape, self.dtype))

    def write_blob(self, entry: str, value: Any) -> None:
        """Put ``value`` into the blob's own array, as Caffe writes a blob's memory: an array a
        script holds from ``blob.data`` / ``blob.diff`` stays the blob until its shape changes."""
        ws = self.workspace
        old = ws.get(entry)
        if old is not None and old is not value and old.shape == value.shape and old.dtype == value.dtype \
                and old.flags.writeable:
            old[...] = value
        elif old is not value:
            # a new shape: a private copy, never an array (or a view of one) another entry is bound to
            ws.set(entry, value.copy() if hasattr(value, "copy") else value)

    # ------------------------------------------------------------------ backward
    def _backward(self, start: int, end: int) -> None:
        """Backward through layers start down to end (inclusive indices); param diffs accumulate."""
        for info in self._layers[end:start + 1]:
            if info.python is not None:
                info.python.before_backward()
        fn, entries = backward_function(self, end, start)
        for entry, value in zip(entries, fn()):
            self.write_blob(entry, value)

    # ------------------------------------------------------------------ for solvers
    def export_graph(self) -> Any:
        """The forward pass as a cgvm Graph over this net's workspace (what exporters such as
        cgvm.onnx.export read, without importing this frontend)."""
        from cgvm.frontends.caffe.graph_export import graph_from_prototxt

        return graph_from_prototxt("", net=self)

    def training_graph(self) -> "TrainingGraph":
        """Symbolic loss and gradients of the whole net for one compiled training step.

        Compile with ``cgvm.Function([], [tg.loss, *tg.outputs.values()], updates={**tg.state_updates,
        **your_param_updates}, workspace=net.workspace)``; call ``net.prepare_step()`` before each
        call (data layers' batches, dropout seeds, carried recurrent states). Gradients are of the
        total loss (loss weights applied); params with lr_mult 0 are left out.
        """
        build = self._build(0, len(self._layers) - 1)
        loss = range_loss(self._layers, build)
        if loss is None:
            raise CaffeNetError(f"{self.filename}: the net has no loss (no top with a loss weight)")
        params = [p for p in self.learnable_params if p.name in build.params and p.lr_mult != 0.0]
        values = {p.name: build.params[p.name] for p in params}
        grads = grad_map({loss: None}, list(values.values()))
        outputs = OrderedDict((name, build.current[name]) for name in self.outputs)
        return TrainingGraph(loss, outputs, params, values,
                             {p.name: grads[id(values[p.name])] for p in params if id(values[p.name]) in grads},
                             {build.params[n]: v for n, v in build.state_updates.items()})

    def prepare_step(self) -> None:
        """Host work before a compiled training step: data layers' next batch, new dropout seeds, and
        the recurrent states carried from the last step (h_T copied into h_0)."""
        self._prepare_range(0, len(self._layers) - 1)

    # ------------------------------------------------------------------ weights
    def copy_from(self, path: str) -> None:
        """Load weights by layer name from a .caffemodel or HDF5 file (all or nothing)."""
        from cgvm.frontends.caffe import weights

        weights.copy_from(self, path)

    def save(self, path: str) -> None:
        """Write the net with its weights as a binary .caffemodel (no diffs)."""
        from cgvm.frontends.caffe import weights

        weights.save(self, path)

    def share_with(self, other: "Net") -> None:
        """Use ``other``'s weights for same-named layers (Caffe's ShareTrainedLayersWith)."""
        from cgvm.frontends.caffe import weights

        weights.share_with(self, other)

    def clear_param_diffs(self) -> None:
        """Zero every learnable blob's diff (Caffe's ClearParamDiffs)."""
        for p in self._params.values():
            self.workspace[p.diff_name][...] = 0

    @property
    def learnable_params(self) -> List[ParamInfo]:
        """Every owned learnable blob in declaration order (shared params once)."""
        return list(self._params.values())

    # ------------------------------------------------------------------ introspection
    @property
    def name(self) -> str:
        return self.param.name

    @property
    def layer_infos(self) -> List[LayerInfo]:
        return self._layers

    @property
    def blobs(self) -> "OrderedDict[str, Blob]":
        return OrderedDict((name, Blob(self.workspace, self._entry(name))) for name in self._blob_order)

    @property
    def params(self) -> "OrderedDict[str, List[ParamBlob]]":
        return OrderedDict((info.name, [ParamBlob(self.workspace, p.name) for p in info.params])
                           for info in self._layers if info.params)

    @property
    def layers(self) -> List[LayerView]:
        return [LayerView(info, self.workspace) for info in self._layers]

    @property
    def layer_dict(self) -> "OrderedDict[str, LayerView]":
        return OrderedDict((view.name, view) for view in self.layers)

    @property
    def _layer_names(self) -> List[str]:
        return [info.name for info in self._layers]

    @property
    def _blob_names(self) -> List[str]:
        return list(self._blob_order)

    @property
    def inputs(self) -> List[str]:
        return [name for info in self._layers if info.type == "Input" for name in info.tops]

    @property
    def outputs(self) -> List[str]:
        consumed = {name for info in self._layers for name in info.bottoms}
        return sorted({name for name in self._blob_order if name not in consumed})

    @property
    def top_names(self) -> "OrderedDict[str, List[str]]":
        return OrderedDict((info.name, list(info.tops)) for info in self._layers)

    @property
    def bottom_names(self) -> "OrderedDict[str, List[str]]":
        return OrderedDict((info.name, list(info.bottoms)) for info in self._layers)

    def layer_index(self, name: str) -> int:
        for i, info in enumerate(self._layers):
            if info.name == name:
                return i
        raise KeyError(f"the net has no layer {name!r}")


def _phase(phase: Any) -> int:
    from cgvm.frontends.caffe.filter import to_phase

    return to_phase(phase)


def _check_bottoms(net: caffe_pb2.NetParameter, lines: List[Optional[int]], where) -> None:
    """Every bottom must be produced by an earlier layer (before Split insertion, to name the line)."""
    produced = set(net.input)
    for index, (layer, line) in enumerate(zip(net.layer, lines)):
        for b, name in enumerate(layer.bottom):
            if name not in produced:
                raise CaffeNetError(f"{where(index, layer, line)}: unknown bottom blob {name!r} (bottom {b}); no "
                                    "earlier layer produces it")
        produced.update(layer.top)


def _lines_after_splits(filtered, kept: List[Optional[int]], split) -> List[Optional[int]]:
    """Source line of each layer after insert_splits (a Split gets its producer's line)."""
    lines, j = [], 0
    for layer in split.layer:
        if j < len(filtered.layer) and layer.name == filtered.layer[j].name and layer.type == filtered.layer[j].type:
            lines.append(kept[j] if j < len(kept) else None)
            j += 1
        else:
            lines.append(kept[j - 1] if 0 < j <= len(kept) else None)
    return lines
