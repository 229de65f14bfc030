"""A Caffe net as symbolic values: the bridge from a prototxt to the other frontends.

    import cgvm.caffe as caffe

    sym = caffe.symbolic_net("lenet.prototxt", inputs={"data": x}, outputs=["ip1"], workspace=ws)
    features = sym["ip1"]          # a cgvm Value: give it to a Keras layer or a Theano expression
    sym.params                     # {"conv1/0": Value, ...}: the learnable blobs the outputs read

The net is constructed as ``Net`` constructs it (phase filtering, Split insertion, fillers), so
its learnable blobs are Workspace entries under the names a ``Net`` gives them (``"<layer>/<i>"``
or the ParamSpec name); a Net, a solver or a second ``symbolic_net`` over the same Workspace
shares them. Then the layers are converted once more with the caller's Values standing in for
the ``inputs`` blobs; nothing is compiled or run. Caffe layers size their learnable blobs and
reshapes from concrete shapes, so the inputs need fully known shapes (fix the batch size).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeNetError
from cgvm.frontends.caffe.net import Net
from cgvm.frontends.caffe.net_build import ParamInfo
from cgvm.ir import Value
from cgvm.ir.builder import as_value
from cgvm.ir.graph import PARAM, toposort
from cgvm.vm.workspace import Workspace

__all__ = ["SymbolicNet", "symbolic_net"]


class SymbolicNet(dict):
    """``{blob name: Value}`` for the requested outputs, with what a training step needs besides.

    ``params``: workspace name -> parameter Value for every learnable blob the outputs depend on
    (lr_mult 0 left out), in the net's declaration order; these are the very Values in the
    graph, so ``grad(cost, list(sym.params.values()))`` reaches them. ``param_infos`` gives their
    owner layer and lr/decay multipliers. ``state_updates`` (BatchNorm running averages in TRAIN,
    the final states LSTM/RNN carry to the next run) go into the compiled function's updates; call
    ``prepare_step()`` before each run when the built layers include data layers, Dropout in TRAIN
    or recurrent layers (new batches, new dropout seeds, carried states moved into place).
    """

    def __init__(self, net: Net, outputs: Mapping[str, Value], params: "OrderedDict[str, Value]",
                 param_infos: Dict[str, ParamInfo], state_updates: Dict[Value, Value], layer_range: range):
        super().__init__(outputs)
        self.net = net
        self.params = params
        self.param_infos = param_infos
        self.state_updates = state_updates
        self.layer_range = layer_range

    @property
    def workspace(self) -> Workspace:
        return self.net.workspace

    def prepare_step(self) -> None:
        """Host work before running the graph: data layers' next batch, new dropout seeds."""
        self.net._prepare_range(self.layer_range.start, self.layer_range.stop - 1)


def symbolic_net(network_file: Any, inputs: Mapping[str, Any], outputs: Optional[Iterable[str]] = None, *,
                 phase: Any = caffe_pb2.TEST, workspace: Optional[Workspace] = None, weights: Optional[str] = None,
                 end: Optional[str] = None, dtype: Any = None, seed: Optional[int] = None, level: int = 0,
                 stages: Sequence[str] = (), filename: Optional[str] = None) -> SymbolicNet:
    """The Caffe net of ``network_file`` applied to symbolic ``inputs``; returns ``{blob: Value}``.

    ``inputs``: blob name -> a cgvm Value or anything with ``__cgvm_value__()`` (a Theano-style
    variable, a KerasTensor). A data layer's top (``Input``, ``Data``...) takes the given value;
    a blob that a layer computes enters as the net holds it after its last writer (in-place
    layers included), and only the layers after that one are built. ``outputs``: blob names
    (default: the net's outputs, the blobs no layer consumes); each is the blob as the net holds
    it after the last layer built, so an in-place ReLU on ``ip1`` is included in ``ip1``. The
    built layers end at the last one writing an output, or at layer ``end`` when given.

    ``workspace``: where the learnable blobs live (a new Workspace unless given; pass the one
    the other frontends use). ``weights``: a .caffemodel or HDF5 file to load (else fillers).
    ``dtype``: the net's float dtype (default: that of the first float input, else float32).
    ``phase``, ``level``, ``stages``, ``seed``, ``filename`` are as for ``Net``.
    """
    given = _given_values(inputs)
    if dtype is None:
        dtype = next((v.dtype.np for v in given.values() if v.dtype.is_float), np.float32)
    net = Net(network_file, phase=phase, level=level, stages=stages, weights=weights, workspace=workspace,
              dtype=dtype, seed=seed, filename=filename)
    blobs = set(net._blob_names)
    for name in given:
        if name not in blobs:
            raise CaffeNetError(f"{net.filename}: symbolic_net: the net has no blob {name!r} to take an input "
                                f"for; its blobs: {', '.join(net._blob_names)}")
    wanted = list(outputs) if outputs is not None else net.outputs
    for name in wanted:
        if name not in blobs:
            raise CaffeNetError(f"{net.filename}: symbolic_net: the net has no blob {name!r} to output; its "
                                f"blobs: {', '.join(net._blob_names)}")
    lo, hi = _layer_range(net, given, wanted, end)
    build = net._build(lo, hi, given)
    values = OrderedDict()
    for name in wanted:
        value = build.current.get(name, given.get(name))
        if value is None:
            last = net.layer_infos[hi].name
            raise CaffeNetError(f"{net.filename}: symbolic_net: blob {name!r} is not computed by the layers "
                                f"built (from '{net.layer_infos[lo].name}' to '{last}')")
        values[name] = value
    params, infos = _params_read(net, list(values.values()))
    state_updates = {build.params[n]: v for n, v in build.state_updates.items()}
    return SymbolicNet(net, values, params, infos, state_updates, range(lo, hi + 1))


def _given_values(inputs: Mapping[str, Any]) -> Dict[str, Value]:
    given: Dict[str, Value] = {}
    for name, x in inputs.items():
        if not (isinstance(x, Value) or hasattr(x, "__cgvm_value__")):
            raise TypeError(f"symbolic_net: input {name!r} must be symbolic (a cgvm Value, a Theano-style variable "
                            f"or a KerasTensor), got {type(x).__name__}")
        value = as_value(x)
        if any(d is None for d in value.shape):
            raise CaffeNetError(f"symbolic_net: input {name!r} has shape {tuple(value.shape)} with unknown "
                                "dimensions; Caffe layers size their blobs from concrete shapes, so give the input "
                                "a fixed shape, e.g. T.TensorType('float32', shape=(64, 1, 28, 28))('x')")
        given[name] = value
    return given


def _writers(net: Net, blob: str) -> List[int]:
    return [i for i, info in enumerate(net.layer_infos) if blob in info.tops]


def _layer_range(net: Net, given: Dict[str, Value], wanted: List[str], end: Optional[str]) -> tuple:
    """(first, last) layer index to build: after every computed input's last writer, up to the outputs."""
    infos = net.layer_infos
    lo = 0
    for name in given:
        computed = [i for i in _writers(net, name) if infos[i].data is None]
        if computed:
            lo = max(lo, computed[-1] + 1)
    if end is not None:
        try:
            hi = net.layer_index(end)
        except KeyError:
            raise CaffeNetError(f"{net.filename}: symbolic_net: no layer named {end!r} to end at") from None
    else:
        hi = max([w for name in wanted for w in _writers(net, name) if w >= lo] or [lo - 1])
    if hi < lo:
        if all(name in given for name in wanted):
            return lo, lo - 1
        raise CaffeNetError(f"{net.filename}: symbolic_net: no layer to build: the outputs "
                            f"{wanted} are all computed before the inputs {sorted(given)} enter")
    return lo, hi


def _params_read(net: Net, outputs: List[Value]):
    """Learnable (lr_mult != 0) parameter Values the outputs depend on, in declaration order."""
    read: Dict[str, Value] = {}
    for node in toposort(outputs):
        for v in node.inputs:
            if v.kind == PARAM:
                read.setdefault(v.name, v)
    for v in outputs:
        if v.kind == PARAM:
            read.setdefault(v.name, v)
    ws = net.workspace
    params: "OrderedDict[str, Value]" = OrderedDict()
    infos: Dict[str, ParamInfo] = {}
    for info in net.learnable_params:
        value = read.get(info.name)
        if value is None:
            continue
        have = tuple(ws[info.name].shape)
        if have != tuple(value.shape):
            raise CaffeNetError(f"{net.filename}: layer '{info.layer}': param {info.name!r} is {have} in the "
                                f"workspace (sized from the prototxt's input shapes), but the given inputs make it "
                                f"{tuple(value.shape)}; give inputs of the prototxt's shapes (any batch size)")
        if info.lr_mult != 0.0:
            params[info.name] = value
            infos[info.name] = info
    return params, infos
