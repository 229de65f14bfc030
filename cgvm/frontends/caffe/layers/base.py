"""The converter table and what converters share.

A converter turns one Caffe layer into graph nodes:

    @register("ReLU")
    def relu(layer: caffe_pb2.LayerParameter, bottoms: list[Value], ctx: LayerContext) -> list[Value]

The net builds every converter's nodes inside ``source_scope("<file>:<line>: layer 'name' (Type)")``,
so every error about a node names the prototxt file, line and layer. ``LayerContext`` (implemented
by the net) gives converters their learnable blobs (``ctx.param``), the phase, and the
host-side state a few layers need (dropout seeds, BatchNorm running averages, recurrent
states carried between forwards).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeNetError
from cgvm.ir import Value
from cgvm.ir.builder import as_value
from cgvm.ops import elementwise as ew

Converter = Callable[[caffe_pb2.LayerParameter, List[Value], "LayerContext"], List[Value]]

#: Caffe layer type -> converter. Data layers (no graph nodes: their tops are filled on the host)
#: are in net.DATA_LAYERS instead.
CONVERTERS: Dict[str, Converter] = {}

#: Caffe layer type -> factory(layer_param, phase, ctx) -> a data layer object with
#: ``top_shapes() -> list of shapes`` (one per top, at setup) and ``next_batch() -> {top name: array}``
#: (called on the host before every forward that runs the layer; tops it leaves out keep their
#: contents). ``ctx`` is a DataContext. These layers add no graph nodes: their tops are
#: workspace entries the graph reads.
DATA_LAYERS: Dict[str, Callable[..., object]] = {}

#: Types whose top 0 carries loss weight 1 unless the prototxt says otherwise (Caffe's LossLayer).
LOSS_TYPES = {"SoftmaxWithLoss", "SigmoidCrossEntropyLoss", "EuclideanLoss", "HingeLoss", "ContrastiveLoss",
              "InfogainLoss", "MultinomialLogisticLoss"}

#: Types that may name fewer tops than they make (Caffe's AutoTopBlobs: loss layers).
AUTO_TOP_TYPES = LOSS_TYPES


def register(*type_names: str) -> Callable[[Converter], Converter]:
    """Register a converter under one or more Caffe type names (the registry refuses duplicates)."""
    def decorate(fn: Converter) -> Converter:
        for name in type_names:
            if name in CONVERTERS:
                raise ValueError(f"Caffe layer type {name!r} already has a converter")
            CONVERTERS[name] = fn
        return fn
    return decorate


def register_data_layer(*type_names: str) -> Callable:
    """Register a data-layer factory under one or more Caffe type names."""
    def decorate(factory: Callable) -> Callable:
        for name in type_names:
            if name in DATA_LAYERS:
                raise ValueError(f"Caffe data layer type {name!r} is already registered")
            DATA_LAYERS[name] = factory
        return factory
    return decorate


class DataContext(Protocol):
    """What a data-layer factory gets besides its LayerParameter and phase."""

    where: str                     # "<file>:<line>: layer 'name' (Type)"
    rng: "np.random.Generator"     # the net's generator (fillers, shuffling)
    dtype: "np.dtype"              # the net's float dtype (float32 unless asked otherwise)
    net: object                    # the Net being built (MemoryData reaches set_input_arrays through it)

    def error(self, message: str) -> CaffeNetError:
        """An error that names this layer's file, line, name and type."""


class LayerContext(Protocol):
    """What a converter may ask of the net while it builds one layer."""

    layer: caffe_pb2.LayerParameter
    phase: int            # caffe_pb2.TRAIN or caffe_pb2.TEST (the layer's own phase)
    where: str            # "<file>:<line>: layer 'name' (Type)"

    def param(self, index: int, shape: Sequence[int], filler: Optional[caffe_pb2.FillerParameter],
              *, lr_mult: Optional[float] = None, decay_mult: Optional[float] = None) -> Value:
        """Learnable blob ``index`` of this layer (created and filled on first use)."""

    def error(self, message: str) -> CaffeNetError:
        """An error that names this layer's file, line, name and type."""

    def dropout_seed(self) -> Value:
        """An int64 scalar read from the workspace, advanced by the net before every forward."""

    def update_state(self, target: Value, new_value: Value) -> None:
        """Write ``new_value`` into the workspace entry of param ``target`` after a forward (any phase)."""

    def carried_state(self, name: str, shape: Sequence[int], dtype: object) -> Tuple[Value, Value]:
        """State ``name`` of this layer carried from one forward to the next: ``(initial, final)``.

        ``initial`` reads what the previous forward of the layer ended with (zeros at setup and
        after the shape changes); give ``update_state(final, value)`` the value this forward ends
        with. The net copies final into initial on the host before every forward of the layer,
        in any phase; backward reads the same initial value the forward did.
        """

    def python_layer(self) -> object:
        """The user's Python layer object (Python layers only)."""


# --------------------------------------------------------------------------- shared helpers

def canonical_axis(axis: int, ndim: int, ctx: LayerContext, what: str = "axis") -> int:
    """Caffe's CanonicalAxisIndex: negative axes count from the end; out of range is an error."""
    if not -ndim <= axis < max(ndim, 1):
        raise ctx.error(f"{what} {axis} is out of range for a blob with {ndim} axes")
    return axis % ndim if ndim else 0


def need_bottoms(bottoms: Sequence[Value], counts: Sequence[int], ctx: LayerContext) -> None:
    """Check the number of bottoms is one of ``counts``."""
    if len(bottoms) not in counts:
        wanted = " or ".join(str(c) for c in counts)
        raise ctx.error(f"takes {wanted} bottom blob(s), got {len(bottoms)}")


def count(shape: Sequence[int], start: int = 0, end: Optional[int] = None) -> int:
    """Number of elements of the axes ``start:end`` (Caffe's Blob::count)."""
    n = 1
    for d in shape[start:end]:
        n *= int(d)
    return n


def as_index(label: Value) -> Value:
    """Caffe's float labels as int64 indices (labels carry no gradient)."""
    return label if label.dtype.is_int else ew.cast(label, dtype="int64")


def scalar(value: float, like: Value) -> Value:
    """A constant of ``like``'s dtype (so float64 nets stay float64)."""
    return as_value(float(value), like)
