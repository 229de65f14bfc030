"""Python layers (`type: "Python"`): the user's caffe.Layer subclass run as a host-side op.

They run the user's code, so a net builds them only when asked: ``Net(..., allow_python_layers=True)``,
or CGVM_ALLOW_PYTHON_LAYERS=1 in the environment (the CLI's --allow-python-layers sets it).

The op ``caffe_python_layer`` takes the layer's bottoms (and its learnable blobs, so that a
backward pass always reaches it) and calls ``reshape`` and ``forward`` on host blobs;
``caffe_python_layer_grad`` calls ``backward``. The layer object is not an attribute (attributes
must be hashable and serializable): the attribute is an id into a registry of live layers.
Learnable blobs made with ``self.blobs.add_blob(*shape)`` live in the net's workspace, so they
appear in ``net.params``, are saved and loaded, and the user's backward writes their diffs.
"""
from __future__ import annotations

import importlib
import itertools
from typing import Any, Dict, List, Sequence

import numpy as np

from cgvm.frontends.caffe.blob import Blob
from cgvm.frontends.caffe.errors import CaffeNetError
from cgvm.ir.attrs import Int
from cgvm.ir.types import TensorType
from cgvm.ops import shape as shp
from cgvm.ops.registry import OPAQUE, defop


class Layer:
    """Base class of Python layers (pycaffe's caffe.Layer)."""

    type = "Python"

    def __init__(self, layer_param: Any = None):
        self.layer_param = layer_param
        self.param_str = layer_param.python_param.param_str if layer_param is not None else ""
        self.phase = 0
        self.blobs = BlobVec(None, "")

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        pass


class BlobVec(list):
    """A Python layer's learnable blobs; ``add_blob(*shape)`` makes one in the net's workspace."""

    def __init__(self, workspace: Any, prefix: str):
        super().__init__()
        self._workspace = workspace
        self._prefix = prefix

    def add_blob(self, *shape: int) -> Blob:
        if self._workspace is None:
            raise RuntimeError("add_blob is available in setup(), once the layer belongs to a net")
        name = f"{self._prefix}/{len(self)}"
        dims = tuple(int(d) for d in shape)
        self._workspace.set(name, np.zeros(dims, np.float32))
        self._workspace.set(name + "@diff", np.zeros(dims, np.float32))
        blob = Blob(self._workspace, name)
        self.append(blob)
        return blob


class HostBlob:
    """A bottom or top handed to the user's layer: data, diff, shape, count, reshape."""

    def __init__(self, data: Any = None, diff: Any = None):
        self.data = np.zeros((0,), np.float32) if data is None else data
        self.diff = diff if diff is not None else np.zeros_like(self.data)

    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    @property
    def count(self) -> int:
        return int(self.data.size)

    def _legacy(self, i: int) -> int:
        return self.shape[i] if i < len(self.shape) else 1

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))

    def reshape(self, *dims: int) -> None:
        shape = tuple(int(d) for d in dims)
        if self.data.shape != shape:
            self.data = np.zeros(shape, self.data.dtype if self.data.size else np.float32)
            self.diff = np.zeros(shape, self.data.dtype)


class _Handle:
    """A live Python layer: the user's object and what the ops need to call it."""

    def __init__(self, layer: Layer, n_bottoms: int, n_tops: int, n_params: int):
        self.layer, self.n_bottoms, self.n_tops, self.n_params = layer, n_bottoms, n_tops, n_params
        self.set_up = False

    def top_shapes(self, bottom_shapes: Sequence[Sequence[int]]) -> List[tuple]:
        bottoms = [HostBlob(np.zeros(tuple(s), np.float32)) for s in bottom_shapes]
        tops = [HostBlob() for _ in range(self.n_tops)]
        self.layer.reshape(bottoms, tops)
        return [t.shape for t in tops]

    def before_forward(self) -> None:
        """Nothing to do on the host: reshape runs inside the op, before every forward."""

    def before_backward(self) -> None:
        """Nothing to do on the host: backward runs inside the gradient op."""


_LIVE: Dict[int, _Handle] = {}
_ids = itertools.count(1)


def create_python_layer(net: Any, info: Any) -> _Handle:
    """Import and construct the user's layer (setup runs when its bottoms' shapes are known)."""
    param = info.param.python_param
    if not net.allow_python_layers:
        raise CaffeNetError(
            f"{info.where}: this Python layer would run your code ({param.module}.{param.layer}); cgvm runs "
            "Python layers only when asked: Net(..., allow_python_layers=True), CGVM_ALLOW_PYTHON_LAYERS=1, "
            "or `cgvm ... --allow-python-layers`")
    if not param.module or not param.layer:
        raise CaffeNetError(f"{info.where}: python_param needs module and layer")
    try:
        module = importlib.import_module(param.module)
    except ImportError as exc:
        raise CaffeNetError(f"{info.where}: cannot import Python layer module {param.module!r} ({exc}); is it on "
                            "PYTHONPATH?") from exc
    cls = getattr(module, param.layer, None)
    if cls is None:
        raise CaffeNetError(f"{info.where}: module {param.module!r} has no layer class {param.layer!r}")
    layer = cls(info.param)
    layer.param_str = param.param_str
    layer.phase = info.param.phase if info.param.HasField("phase") else net.phase
    layer.blobs = BlobVec(net.workspace, info.name)
    return _Handle(layer, len(info.param.bottom), len(info.param.top), 0)


def convert_python_layer(layer_param, bottoms, ctx) -> List[Any]:
    """Nodes of a Python layer; at the net's setup, runs the user's setup() first."""
    handle: _Handle = ctx.python_layer()
    net = ctx.net
    if not handle.set_up:
        host_bottoms = [HostBlob(np.zeros(tuple(b.shape), np.float32)) for b in bottoms]
        host_tops = [HostBlob() for _ in layer_param.top]
        handle.layer.setup(host_bottoms, host_tops)
        handle.set_up = True
        handle.n_params = len(handle.layer.blobs)
        for index, blob in enumerate(handle.layer.blobs):
            ctx.param(index, blob.shape, None)
    params = [ctx.param(i, blob.shape, None) for i, blob in enumerate(handle.layer.blobs)]
    key = getattr(handle, "key", None)
    if key is None:
        key = handle.key = next(_ids)
        _LIVE[key] = handle
    del net
    outs = python_layer(*bottoms, *params, handle=key)
    if handle.n_tops == 1:
        return [outs]
    return list(outs)


def _handle(key: int) -> _Handle:
    hit = _LIVE.get(key)
    if hit is None:
        raise RuntimeError(f"Python layer {key} is no longer alive (its net was deleted)")
    return hit


def _forward_infer(types, handle):
    h = _handle(handle)
    dtype = types[0].dtype if types else "float32"
    shapes = h.top_shapes([t.shape for t in types[:h.n_bottoms]])
    return [TensorType(s, dtype) for s in shapes]


python_layer = defop("caffe_python_layer", num_inputs=(0, None), pattern=OPAQUE, stateful=True, writes_out=False,
                     num_outputs=lambda attrs, n: _handle(attrs["handle"]).n_tops, attrs={"handle": Int()},
                     infer=_forward_infer,
                     doc="A Caffe Python layer's forward on the host: (bottoms..., blobs...) -> tops.")


@python_layer.kernel_factory
def _(xp, handle):
    h = _handle(handle)

    def kernel(*arrays):
        bottoms = [HostBlob(np.asarray(a)) for a in arrays[:h.n_bottoms]]
        tops = [HostBlob() for _ in range(h.n_tops)]
        h.layer.reshape(bottoms, tops)
        h.layer.forward(bottoms, tops)
        results = tuple(xp.asarray(np.array(t.data, copy=True)) for t in tops)
        return results[0] if len(results) == 1 else results
    return kernel


@python_layer.grad
def _(node, *gouts):
    h = _handle(node.attrs["handle"])
    grads = [g if g is not None else shp.zeros_like(o) for g, o in zip(gouts, node.outputs)]
    outs = python_layer_grad(*node.inputs, *node.outputs, *grads, handle=node.attrs["handle"])
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    return outs[:h.n_bottoms] + outs[h.n_bottoms:]


def _grad_infer(types, handle):
    h = _handle(handle)
    return [t for t in types[:h.n_bottoms + h.n_params]]


python_layer_grad = defop("caffe_python_layer_grad", num_inputs=(0, None), pattern=OPAQUE, stateful=True,
                          writes_out=False, differentiable=False, attrs={"handle": Int()}, infer=_grad_infer,
                          num_outputs=lambda attrs, n: _handle(attrs["handle"]).n_bottoms +
                          _handle(attrs["handle"]).n_params,
                          doc="A Caffe Python layer's backward on the host: (bottoms, blobs, tops, top diffs) -> "
                              "(bottom diffs, zeros per blob: the layer writes blob diffs itself).")


@python_layer_grad.kernel_factory
def _(xp, handle):
    h = _handle(handle)

    def kernel(*arrays):
        nb, npar, nt = h.n_bottoms, h.n_params, h.n_tops
        bottom_data = arrays[:nb]
        param_data = arrays[nb:nb + npar]
        top_data = arrays[nb + npar:nb + npar + nt]
        top_diff = arrays[nb + npar + nt:]
        bottoms = [HostBlob(np.asarray(a), np.zeros(np.shape(a), np.asarray(a).dtype)) for a in bottom_data]
        tops = [HostBlob(np.asarray(d), np.asarray(g)) for d, g in zip(top_data, top_diff)]
        h.layer.backward(tops, [True] * nb, bottoms)
        results = tuple(xp.asarray(np.array(b.diff, copy=True)) for b in bottoms)
        results += tuple(xp.zeros(np.shape(p), dtype=np.asarray(p).dtype) for p in param_data)
        return results[0] if len(results) == 1 else results
    return kernel
