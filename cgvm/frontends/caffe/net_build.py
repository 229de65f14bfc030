"""Building the graph of a Net's layer range: the records of a constructed net, the contexts
converters and data layers see, and the walk that runs every layer's converter.

``build_range`` is what ``Net._build`` runs: layers lo..hi in file order, each converter inside
``source_scope(layer.where)``. Learnable blobs are declared by ``NetLayerContext.param`` while the
net sets up (the first build over every layer) and only looked up by later builds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from cgvm.errors import CgvmError
from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeNetError
from cgvm.frontends.caffe.fillers import check_filler, fill
from cgvm.frontends.caffe.layers import CONVERTERS
from cgvm.ir import TensorType, Value, param_value, source_scope
from cgvm.ops import elementwise as ew
from cgvm.ops import reduce as red

if TYPE_CHECKING:
    from cgvm.frontends.caffe.net import Net


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


class RangeBuild:
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


class NetLayerContext:
    """The LayerContext converters see (see layers.base)."""

    def __init__(self, net: "Net", info: LayerInfo, build: RangeBuild):
        self.net, self.info, self.build = net, info, build
        self.layer = info.param
        self.phase = net.phase if not info.param.HasField("phase") else info.param.phase
        self.where = info.where

    def error(self, message: str) -> CaffeNetError:
        return CaffeNetError(f"{self.where}: {message}")

    def param(self, index, shape, filler, *, lr_mult=None, decay_mult=None) -> Value:
        shape = tuple(int(d) for d in shape)
        layer = self.info.param
        spec = layer.param[index] if index < len(layer.param) else None
        name = spec.name if spec is not None and spec.name else f"{layer.name}/{index}"
        if self.net._setting_up:
            self._declare_param(index, name, shape, filler, spec, lr_mult, decay_mult)
        hit = self.build.params.get(name)
        if hit is None:
            hit = self.build.params[name] = param_value(name, TensorType(shape, self.net.dtype))
        elif tuple(hit.shape) != shape:
            raise self.error(f"param {name!r} has shape {tuple(hit.shape)}; this layer needs {shape}")
        return hit

    def _declare_param(self, index, name, shape, filler, spec, lr_mult, decay_mult) -> None:
        """Record the layer's param ``index`` in the net and create its workspace entries (at setup)."""
        net, info = self.net, self.info
        explicit_lr = spec.lr_mult if spec is not None and spec.HasField("lr_mult") else None
        explicit_decay = spec.decay_mult if spec is not None and spec.HasField("decay_mult") else None
        if lr_mult is not None and explicit_lr not in (None, lr_mult):
            raise self.error(f"param {index} must have lr_mult {lr_mult} (this layer's blobs are not learned), "
                             f"got {explicit_lr}")
        lr = lr_mult if lr_mult is not None else (1.0 if explicit_lr is None else explicit_lr)
        decay = decay_mult if decay_mult is not None else (1.0 if explicit_decay is None else explicit_decay)
        existing = net._params.get(name)
        if existing is not None:   # weight sharing by param name
            strict = spec is None or spec.share_mode == caffe_pb2.ParamSpec.STRICT
            fits = existing.shape == shape if strict else int(np.prod(existing.shape)) == int(np.prod(shape))
            if not fits:
                raise self.error(f"cannot share param {name!r}: it has shape {existing.shape} (owner layer "
                                 f"'{existing.layer}'), this layer needs {shape}")
            for label, mine, theirs in (("lr_mult", explicit_lr, existing.lr_mult),
                                        ("decay_mult", explicit_decay, existing.decay_mult)):
                if mine is not None and mine != theirs and existing.layer != info.name:
                    raise self.error(f"shared param {name!r} has {label} {theirs} in layer '{existing.layer}' "
                                     f"and {mine} here; sharers must agree")
            info.params.append(existing)
            return
        if len(info.params) != index:
            raise self.error(f"internal: param {index} declared out of order")
        param_info = ParamInfo(name, info.name, index, shape, lr, decay)
        net._params[name] = param_info
        info.params.append(param_info)
        ws = net.workspace
        if name in ws and tuple(ws[name].shape) != shape:
            raise self.error(f"the workspace already holds {name!r} with shape {tuple(ws[name].shape)}; this "
                             f"layer needs {shape}")
        check_filler(filler, shape, self.error)
        where = self.error

        def make() -> None:
            if name not in ws:   # else a workspace shared with another net already holds it: share
                try:
                    ws.set(name, fill(filler, shape, net._rng).astype(net.dtype, copy=False))
                except CaffeNetError as exc:
                    raise where(str(exc)) from exc
            if name + "@diff" not in ws or tuple(ws[name + "@diff"].shape) != shape:
                ws.set(name + "@diff", np.zeros(shape, net.dtype))

        net._defer(name, shape, make)

    def dropout_seed(self) -> Value:
        net = self.net
        entry = net._entry(self.info.name) + "@seed"
        if net._setting_up:
            self.info.seed_entry = entry   # the net draws a new seed before each forward of this layer
        if entry not in net.workspace:
            net._defer(entry, (), lambda: net.workspace.set(entry, np.array(net._rng.integers(1 << 62),
                                                                            dtype=np.int64)))
        hit = self.build.params.get(entry)
        if hit is None:
            hit = self.build.params[entry] = param_value(entry, TensorType((), np.int64))
        return hit

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
                net._defer(entry, shape, lambda entry=entry: ws.set(entry, np.zeros(shape, dtype)))
        if net._setting_up:
            self.info.carried_states.append((initial, final))
        self.build.carried.append((initial, final, shape, dtype))
        values = []
        for entry in (initial, final):
            hit = self.build.params.get(entry)
            if hit is None:
                hit = self.build.params[entry] = param_value(entry, TensorType(shape, dtype))
            values.append(hit)
        return values[0], values[1]

    def python_layer(self) -> object:
        return self.info.python


class NetDataContext:
    """The DataContext data-layer factories see (see layers.base)."""

    def __init__(self, net: "Net", info: LayerInfo):
        self.net, self.where = net, info.where
        self.rng, self.dtype = net._rng, net.dtype

    def error(self, message: str) -> CaffeNetError:
        return CaffeNetError(f"{self.where}: {message}")


def build_range(net: "Net", lo: int, hi: int, given: Optional[Dict[str, Value]] = None) -> RangeBuild:
    """Graph values of layers lo..hi. ``given`` (blob name -> Value) stands in for data layers'
    tops and for blobs read from outside the range (symbolic_net's inputs from other frontends)."""
    from cgvm.errors import GraphBuildError, ResourceLimitError

    given = given or {}
    build = RangeBuild()
    produced_at: Dict[str, Tuple[int, int]] = {}
    for i in range(lo, hi + 1):
        info = net._layers[i]
        if info.data is not None:
            tops = [given[name] if name in given else net._leaf_value(build, net._entry(name))
                    for name in info.tops]
        else:
            bottoms = []
            for name in info.bottoms:
                if name in build.current:
                    bottoms.append(build.current[name])
                    build.consumed.add(id(build.current[name]))
                else:
                    leaf = given[name] if name in given else net._leaf_value(build, net._entry(name))
                    build.leaves[name] = leaf
                    bottoms.append(leaf)
            ctx = NetLayerContext(net, info, build)
            convert = CONVERTERS.get(info.type) or _python_converter()
            with source_scope(info.where):
                try:
                    tops = list(convert(info.param, bottoms, ctx))
                except (CaffeNetError, ResourceLimitError):
                    raise
                except (GraphBuildError, CgvmError) as exc:
                    raise CaffeNetError(_with_where(str(exc), info.where)) from exc
            if len(tops) != len(info.tops):
                raise CaffeNetError(f"{info.where}: makes {len(tops)} top(s), the prototxt names "
                                    f"{len(info.tops)}")
        for t, (name, value) in enumerate(zip(info.tops, tops)):
            build.versions.append((i, t, value))
            build.current[name] = value
            produced_at[name] = (i, t)
    return build


def range_loss(layers: Sequence[LayerInfo], build: RangeBuild) -> Optional[Value]:
    """The build's total loss: sum of loss_weight * sum(top) over weighted tops; None without any."""
    terms = []
    for i, t, value in build.versions:
        weight = layers[i].loss_weights[t]
        if weight:
            term = red.sum(value) if value.ndim else value
            terms.append(term if weight == 1.0 else ew.mul(term, float(weight)))
    return ew.add_n(terms)


def _with_where(message: str, where: str) -> str:
    return message if where in message else f"{where}: {message}"


def _python_converter() -> Callable:
    from cgvm.frontends.caffe.layers.python_layer import convert_python_layer

    return convert_python_layer
