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
"""
from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import count as _counter
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from cgvm.autodiff import grad_map
from cgvm.errors import CgvmError
from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeNetError
from cgvm.frontends.caffe.fillers import fill
from cgvm.frontends.caffe.filter import filter_net, insert_splits, layer_included
from cgvm.frontends.caffe.layers import AUTO_TOP_TYPES, CONVERTERS, DATA_LAYERS, LOSS_TYPES
from cgvm.frontends.caffe.prototxt import describe_fork_extension, read_net_with_lines
from cgvm.compiled import Function
from cgvm.ir import TensorType, Value, param_value, source_scope
from cgvm.ir.builder import rebuild
from cgvm.ops import elementwise as ew
from cgvm.ops import reduce as red
from cgvm.vm.workspace import Workspace

from cgvm.frontends.caffe.blob import Blob, LayerView, ParamBlob  # noqa: E402  (re-exported)

_net_ids = _counter()


@dataclass
class ParamInfo:
    """One learnable blob: its workspace entry, owner layer and the solver's multipliers.

    ``lr_mult``/``decay_mult`` are those of the owner (the first layer that declared the
    param); a sharing layer's different non-default values are an error, as in Caffe.
    """

    name: str
    layer: str
    index: int
    shape: Tuple[int, ...]
    lr_mult: float = 1.0
    decay_mult: float = 1.0

    @property
    def diff_name(self) -> str:
        return self.name + "@diff"


@dataclass
class LayerInfo:
    """A layer of the constructed net."""

    param: caffe_pb2.LayerParameter
    index: int
    where: str
    bottoms: List[str]
    tops: List[str]
    loss_weights: List[float]
    data: Any = None                                    # a data-layer object, or None
    params: List[ParamInfo] = field(default_factory=list)
    seed_entry: Optional[str] = None                    # Dropout in TRAIN
    carried_states: List[Tuple[str, str]] = field(default_factory=list)   # (initial, final) entries
    python: Any = None                                  # the user's Python layer object

    @property
    def name(self) -> str:
        return self.param.name

    @property
    def type(self) -> str:
        return self.param.type


class _Build:
    """The values of one graph built over a layer range."""

    def __init__(self) -> None:
        self.params: Dict[str, Value] = {}          # workspace name -> param Value (leaves)
        self.versions: List[Tuple[int, int, Value]] = []   # (layer index, top index, value)
        self.current: Dict[str, Value] = {}         # blob name -> its latest value
        self.consumed: set = set()                  # ids of version values read inside the range
        self.leaves: Dict[str, Value] = {}          # blob name -> value read from outside the range
        self.state_updates: Dict[str, Value] = {}   # BatchNorm running averages (TRAIN), carried states
        # (initial entry, final entry, shape, dtype) of every carried state the graph reads
        self.carried: List[Tuple[str, str, Tuple[int, ...], np.dtype]] = []


class _LayerContext:
    """The LayerContext converters see (see layers.base)."""

    def __init__(self, net: "Net", info: LayerInfo, build: _Build):
        self.net, self.info, self.build = net, info, build
        self.layer = info.param
        self.phase = net.phase if not info.param.HasField("phase") else info.param.phase
        self.where = info.where

    def error(self, message: str) -> CaffeNetError:
        return CaffeNetError(f"{self.where}: {message}")

    def param(self, index, shape, filler, *, lr_mult=None, decay_mult=None) -> Value:
        return self.net._param(self.info, self.build, index, tuple(int(d) for d in shape), filler,
                               lr_mult, decay_mult, self)

    def dropout_seed(self) -> Value:
        entry = self.net._entry(self.info.name) + "@seed"
        if self.net._setting_up:
            self.info.seed_entry = entry   # the net draws a new seed before each forward of this layer
        if entry not in self.net.workspace:
            self.net.workspace.set(entry, np.array(self.net._rng.integers(1 << 62), dtype=np.int64))
        return self.net._leaf_value(self.build, entry, np.int64)

    def update_state(self, target: Value, new_value: Value) -> None:
        self.build.state_updates[target.name] = new_value

    def carried_state(self, name: str, shape: Sequence[int], dtype: Any) -> Tuple[Value, Value]:
        net, ws = self.net, self.net.workspace
        base = net._entry(self.info.name) + "@" + name
        initial, final = base + "_0", base + "_T"
        shape = tuple(int(d) for d in shape)
        dtype = np.dtype(getattr(dtype, "np", dtype))
        for entry in (initial, final):
            held = ws.get(entry)
            # setup, or a graph built for another batch size (a reshape): the state starts at zero
            if held is None or tuple(held.shape) != shape or held.dtype != dtype:
                ws.set(entry, np.zeros(shape, dtype))
        if net._setting_up:
            self.info.carried_states.append((initial, final))
        self.build.carried.append((initial, final, shape, dtype))
        return net._leaf_value(self.build, initial), net._leaf_value(self.build, final)

    def python_layer(self) -> object:
        return self.info.python


class _DataContext:
    def __init__(self, net: "Net", info: LayerInfo):
        self.net, self.where = net, info.where
        self.rng, self.dtype = net._rng, net.dtype

    def error(self, message: str) -> CaffeNetError:
        return CaffeNetError(f"{self.where}: {message}")


class Net:
    """A Caffe net: ``Net(prototxt, phase)``, ``Net(prototxt, weights, phase)`` or keyword forms.

    Keywords beyond pycaffe's: ``workspace`` (share one with other nets: same-named params are
    then shared, as a solver's train and test nets), ``backend``, ``dtype`` (float32; float64 for
    gradient checks), ``seed`` (fillers and dropout), ``allow_python_layers`` (run the user's
    code of ``type: "Python"`` layers; off unless asked, or CGVM_ALLOW_PYTHON_LAYERS=1).
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
            allow_python_layers = os.environ.get("CGVM_ALLOW_PYTHON_LAYERS", "") not in ("", "0")
        self.allow_python_layers = bool(allow_python_layers)
        self.param, lines, self.filename = self._read(network_file, filename)
        self.phase = _phase(phase)
        self._construct(lines, level, list(stages))
        if weights:
            self.copy_from(weights)

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
                info.data = DATA_LAYERS[kind](layer, self._layer_phase(layer), _DataContext(self, info))
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
        """Shape every blob (data layers first fill), create learnable blobs, check every layer."""
        ws = self.workspace
        for info in self._layers:
            if info.data is not None:
                for name, shape in zip(info.tops, info.data.top_shapes()):
                    ws.set(self._entry(name), np.zeros(shape, self.dtype))
        self._setting_up = True
        try:
            build = self._build(0, len(self._layers) - 1)
        finally:
            self._setting_up = False
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

    def _ensure_blob(self, entry: str, shape: Sequence[int]) -> None:
        ws = self.workspace
        # a dimension known only at run time (Filter's kept items) starts empty; forward stores the real blob
        shape = tuple(0 if d is None else int(d) for d in shape)
        if entry not in ws or tuple(ws[entry].shape) != shape:
            ws.set(entry, np.zeros(shape, self.dtype))
        if entry + "@diff" not in ws or tuple(ws[entry + "@diff"].shape) != shape:
            ws.set(entry + "@diff", np.zeros(shape, self.dtype))

    def _param(self, info: LayerInfo, build: _Build, index: int, shape: Tuple[int, ...], filler,
               lr_mult: Optional[float], decay_mult: Optional[float], ctx: _LayerContext) -> Value:
        layer = info.param
        spec = layer.param[index] if index < len(layer.param) else None
        name = spec.name if spec is not None and spec.name else f"{layer.name}/{index}"
        if self._setting_up:
            self._declare_param(info, index, name, shape, filler, spec, lr_mult, decay_mult, ctx)
        hit = build.params.get(name)
        if hit is None:
            hit = build.params[name] = param_value(name, TensorType(shape, self.dtype))
        elif tuple(hit.shape) != shape:
            raise ctx.error(f"param {name!r} has shape {tuple(hit.shape)}; this layer needs {shape}")
        return hit

    def _declare_param(self, info, index, name, shape, filler, spec, lr_mult, decay_mult, ctx) -> None:
        explicit_lr = spec.lr_mult if spec is not None and spec.HasField("lr_mult") else None
        explicit_decay = spec.decay_mult if spec is not None and spec.HasField("decay_mult") else None
        if lr_mult is not None and explicit_lr not in (None, lr_mult):
            raise ctx.error(f"param {index} must have lr_mult {lr_mult} (this layer's blobs are not learned), "
                            f"got {explicit_lr}")
        lr = lr_mult if lr_mult is not None else (1.0 if explicit_lr is None else explicit_lr)
        decay = decay_mult if decay_mult is not None else (1.0 if explicit_decay is None else explicit_decay)
        existing = self._params.get(name)
        if existing is not None:   # weight sharing by param name
            strict = spec is None or spec.share_mode == caffe_pb2.ParamSpec.STRICT
            fits = existing.shape == shape if strict else int(np.prod(existing.shape)) == int(np.prod(shape))
            if not fits:
                raise ctx.error(f"cannot share param {name!r}: it has shape {existing.shape} (owner layer "
                                f"'{existing.layer}'), this layer needs {shape}")
            for label, mine, theirs in (("lr_mult", explicit_lr, existing.lr_mult),
                                        ("decay_mult", explicit_decay, existing.decay_mult)):
                if mine is not None and mine != theirs and existing.layer != info.name:
                    raise ctx.error(f"shared param {name!r} has {label} {theirs} in layer '{existing.layer}' "
                                    f"and {mine} here; sharers must agree")
            info.params.append(existing)
            return
        if len(info.params) != index:
            raise ctx.error(f"internal: param {index} declared out of order")
        param_info = ParamInfo(name, info.name, index, shape, lr, decay)
        self._params[name] = param_info
        info.params.append(param_info)
        ws = self.workspace
        if name in ws and tuple(ws[name].shape) == shape:
            pass   # a workspace shared with another net already holds it: share
        else:
            if name in ws:
                raise ctx.error(f"the workspace already holds {name!r} with shape {tuple(ws[name].shape)}; this "
                                f"layer needs {shape}")
            try:
                ws.set(name, fill(filler, shape, self._rng).astype(self.dtype, copy=False))
            except CaffeNetError as exc:
                raise ctx.error(str(exc)) from None
        if name + "@diff" not in ws or tuple(ws[name + "@diff"].shape) != shape:
            ws.set(name + "@diff", np.zeros(shape, self.dtype))

    def _leaf_value(self, build: _Build, entry: str, dtype: Any = None) -> Value:
        hit = build.params.get(entry)
        if hit is None:
            array = self.workspace[entry]
            hit = build.params[entry] = param_value(entry, TensorType(array.shape, dtype or array.dtype))
        return hit

    # ------------------------------------------------------------------ graph building
    def _build(self, lo: int, hi: int, given: Optional[Dict[str, Value]] = None) -> _Build:
        """Graph values of layers lo..hi. ``given`` (blob name -> Value) stands in for data layers'
        tops and for blobs read from outside the range (symbolic_net's inputs from other frontends)."""
        from cgvm.errors import GraphBuildError

        given = given or {}
        build = _Build()
        produced_at: Dict[str, Tuple[int, int]] = {}
        for i in range(lo, hi + 1):
            info = self._layers[i]
            if info.data is not None:
                tops = [given[name] if name in given else self._leaf_value(build, self._entry(name))
                        for name in info.tops]
            else:
                bottoms = []
                for name in info.bottoms:
                    if name in build.current:
                        bottoms.append(build.current[name])
                        build.consumed.add(id(build.current[name]))
                    else:
                        leaf = given[name] if name in given else self._leaf_value(build, self._entry(name))
                        build.leaves[name] = leaf
                        bottoms.append(leaf)
                ctx = _LayerContext(self, info, build)
                convert = CONVERTERS.get(info.type) or _python_converter()
                with source_scope(info.where):
                    try:
                        tops = list(convert(info.param, bottoms, ctx))
                    except CaffeNetError:
                        raise
                    except (GraphBuildError, CgvmError) as exc:
                        raise CaffeNetError(_with_where(str(exc), info.where)) from None
                if len(tops) != len(info.tops):
                    raise CaffeNetError(f"{info.where}: makes {len(tops)} top(s), the prototxt names "
                                        f"{len(info.tops)}")
            for t, (name, value) in enumerate(zip(info.tops, tops)):
                build.versions.append((i, t, value))
                build.current[name] = value
                produced_at[name] = (i, t)
        return build

    def _loss(self, build: _Build) -> Optional[Value]:
        total = None
        for i, t, value in build.versions:
            weight = self._layers[i].loss_weights[t]
            if weight:
                term = red.sum(value) if value.ndim else value
                term = term if weight == 1.0 else ew.mul(term, float(weight))
                total = term if total is None else ew.add(total, term)
        return total

    def _range_key(self, kind: str, lo: int, hi: int) -> tuple:
        """Cache key: the range and the shapes of every blob it reads from outside."""
        ws = self.workspace._data
        leaves = self._range_leaves(lo, hi)
        return (kind, lo, hi) + tuple(ws[e].shape for e in leaves)

    def _range_leaves(self, lo: int, hi: int) -> List[str]:
        key = ("leaves", lo, hi)
        hit = self._functions.get(key)
        if hit is None:
            made, leaves = set(), []
            for info in self._layers[lo:hi + 1]:
                names = info.tops if info.data is not None else info.bottoms
                for name in names:
                    if name not in made and self._entry(name) not in leaves:
                        leaves.append(self._entry(name))
                made.update(info.tops)
            hit = self._functions[key] = leaves
        return hit

    # ------------------------------------------------------------------ forward
    def _forward_function(self, lo: int, hi: int):
        key = self._range_key("forward", lo, hi)
        hit = self._functions.get(key)
        if hit is None:
            build = self._build(lo, hi)
            loss = self._loss(build)
            outputs = [v for _, _, v in build.versions]
            entries = [self._version_entry[(i, t)] for i, t, _ in build.versions]
            latest = {}
            for (i, t, _), entry in zip(build.versions, entries):
                latest[self._layers[i].tops[t]] = entry
            canonical = []
            for (i, t, _), entry in zip(build.versions, entries):
                name = self._layers[i].tops[t]
                canonical.append(self._entry(name) if latest[name] == entry and entry != self._entry(name) else None)
            updates = {build.params[name]: value for name, value in build.state_updates.items()}
            fn = Function([], ([loss] if loss is not None else []) + outputs, updates=updates,
                          workspace=self.workspace, name=f"{self.name or 'net'}_forward_{lo}_{hi}")
            hit = self._functions[key] = (fn, loss is not None, entries, canonical, build.carried)
        return hit

    def _prepare_range(self, lo: int, hi: int) -> None:
        ws = self.workspace
        for info in self._layers[lo:hi + 1]:
            if info.data is not None:
                for name, array in info.data.next_batch().items():
                    ws.set(self._entry(name), np.asarray(array, self.dtype))
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
        fn, has_loss, entries, canonical, carried = self._forward_function(lo, hi)
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
        ws.set(entry, value)
        diff = entry + "@diff"
        old = ws.get(diff)
        if old is None or old.shape != value.shape:
            ws.set(diff, np.zeros(value.shape, self.dtype))

    # ------------------------------------------------------------------ backward
    def _backward_function(self, lo: int, hi: int):
        key = self._range_key("backward", lo, hi)
        hit = self._functions.get(key)
        if hit is not None:
            return hit
        build = self._build(lo, hi)
        seeds: Dict[Value, Value] = {}
        for i, t, value in build.versions:
            if id(value) in build.consumed or not value.dtype.is_float:
                continue
            seed = self._leaf_value(build, self._entry(self._layers[i].tops[t]) + "@diff")
            seeds[value] = seed if value not in seeds else ew.add(seeds[value], seed)
        learn = [self._params[name] for name in build.params if name in self._params
                 and self._params[name].lr_mult != 0.0]
        wrt = [build.params[p.name] for p in learn]
        if self.force_backward:
            data_tops = [v for i, _, v in build.versions if self._layers[i].data is not None]
            wrt += [v for v in list(build.leaves.values()) + data_tops if v.dtype.is_float]
        else:  # as Caffe: a blob entering the range gets a diff when something learnable lies upstream of it
            needs = self._blobs_needing_backward()
            wrt += [v for name, v in build.leaves.items() if name in needs and v.dtype.is_float]
        gmap = grad_map(seeds, wrt) if seeds and wrt else {}
        blob_grads, blob_entries = [], []
        first_version: Dict[str, Value] = {}
        for i, t, value in build.versions:
            first_version.setdefault(self._layers[i].tops[t], value)
        for name, value in list(first_version.items()) + list(build.leaves.items()):
            g = gmap.get(id(value))
            if g is not None and self._entry(name) + "@diff" not in blob_entries:
                blob_grads.append(g)
                blob_entries.append(self._entry(name) + "@diff")
        updates = {}
        for p in learn:
            g = gmap.get(id(build.params[p.name]))
            if g is not None:
                target = self._leaf_value(build, p.diff_name)
                updates[target] = ew.add(target, g)
        stored = {id(v): self._leaf_value(build, self._version_entry[(i, t)]) for i, t, v in build.versions}
        targets = list(updates)
        cut = rebuild(blob_grads + [updates[t] for t in targets], stored)
        fn = Function([], cut[:len(blob_grads)], updates=dict(zip(targets, cut[len(blob_grads):])),
                      workspace=self.workspace, name=f"{self.name or 'net'}_backward_{lo}_{hi}")
        hit = self._functions[key] = (fn, blob_entries)
        return hit

    def _blobs_needing_backward(self) -> set:
        """Blobs computed from a learnable parameter (Caffe's blob_need_backward without force_backward)."""
        needs: set = set()
        for info in self._layers:
            learnable = any(p.lr_mult != 0.0 for p in info.params)
            if learnable or any(b in needs for b in info.bottoms):
                needs.update(info.tops)
        return needs

    def _backward(self, start: int, end: int) -> None:
        """Backward through layers start down to end (inclusive indices); param diffs accumulate."""
        for info in self._layers[end:start + 1]:
            if info.python is not None:
                info.python.before_backward()
        fn, entries = self._backward_function(end, start)
        for entry, value in zip(entries, fn()):
            self.workspace.set(entry, value)

    # ------------------------------------------------------------------ for solvers
    def training_graph(self) -> "TrainingGraph":
        """Symbolic loss and gradients of the whole net for one compiled training step.

        Compile with ``cgvm.Function([], [tg.loss, *tg.outputs.values()], updates={**tg.state_updates,
        **your_param_updates}, workspace=net.workspace)``; call ``net.prepare_step()`` before each
        call (data layers' batches, dropout seeds, carried recurrent states). Gradients are of the
        total loss (loss weights applied); params with lr_mult 0 are left out.
        """
        build = self._build(0, len(self._layers) - 1)
        loss = self._loss(build)
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


@dataclass
class TrainingGraph:
    """What ``Net.training_graph()`` returns: everything symbolic, nothing compiled."""

    loss: Value                                 # scalar: sum of loss_weight * sum(top)
    outputs: "OrderedDict[str, Value]"          # the net's outputs (sorted by name)
    params: List[ParamInfo]                     # learnable params with lr_mult != 0
    param_values: Dict[str, Value]              # workspace name -> param Value read by the graph
    grads: Dict[str, Value]                     # workspace name -> d loss / d param
    state_updates: Dict[Value, Value]           # BatchNorm averages, carried states; pass them as updates


def _phase(phase: Any) -> int:
    from cgvm.frontends.caffe.filter import to_phase

    return to_phase(phase)


def _with_where(message: str, where: str) -> str:
    return message if where in message else f"{where}: {message}"


def _python_converter():
    from cgvm.frontends.caffe.layers.python_layer import convert_python_layer

    return convert_python_layer


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
