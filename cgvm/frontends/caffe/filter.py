"""Which layers a net has in a given state, and where Caffe adds Split layers.

`filter_net` / `filter_by_state` select layers by their include/exclude rules as Caffe's
Net::FilterNet and StateMeetsRule do; `insert_splits` gives every blob read by more than one
consumer its own Split layer, named exactly as Caffe's util/insert_splits names them (pycaffe shows
those names in `net.blobs`).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Union

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeNetError

PhaseLike = Union[int, str]  # caffe_pb2.TRAIN / caffe_pb2.TEST, or "TRAIN" / "test"


def to_phase(phase: PhaseLike) -> int:
    """caffe_pb2.TRAIN or caffe_pb2.TEST from an enum value or a name (any case)."""
    if isinstance(phase, str):
        try:
            return caffe_pb2.Phase.Value(phase.upper())
        except ValueError:
            raise ValueError(f"unknown phase {phase!r}; expected TRAIN or TEST") from None
    if phase not in (caffe_pb2.TRAIN, caffe_pb2.TEST):
        raise ValueError(f"unknown phase {phase!r}; expected caffe_pb2.TRAIN (0) or TEST (1)")
    return int(phase)


def state_meets_rule(state: caffe_pb2.NetState, rule: caffe_pb2.NetStateRule) -> bool:
    """A rule is met when every condition it sets holds: phase equal, min_level <= level <=
    max_level, all of its `stage`s present in the state, none of its `not_stage`s present."""
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    if any(stage not in stages for stage in rule.stage):
        return False
    return not any(stage in stages for stage in rule.not_stage)


def layer_included(layer: caffe_pb2.LayerParameter, state: caffe_pb2.NetState) -> bool:
    """No rules: included. `include` rules: included if any is met. `exclude` rules: included
    unless one is met. A layer with both kinds is an error, as in Caffe."""
    if layer.include and layer.exclude:
        raise CaffeNetError(f"layer {layer.name!r} has both include and exclude rules; "
                            "Caffe allows one kind or the other, not both")
    if layer.include:
        return any(state_meets_rule(state, rule) for rule in layer.include)
    return not any(state_meets_rule(state, rule) for rule in layer.exclude)


def filter_by_state(net: caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """The net with only the layers its own `state` includes (Caffe's Net::FilterNet)."""
    filtered = caffe_pb2.NetParameter()
    filtered.CopyFrom(net)
    filtered.ClearField("layer")
    filtered.layer.extend(layer for layer in net.layer if layer_included(layer, net.state))
    return filtered


def filter_net(
    net: caffe_pb2.NetParameter,
    phase: PhaseLike | None,
    level: int = 0,
    stages: Iterable[str] = (),
) -> caffe_pb2.NetParameter:
    """Set the net's state as `caffe.Net(file, phase, level=, stages=)` does, then filter.

    The phase and level replace the file's own; the stages are added to the file's. `phase=None`
    keeps the file's phase. The returned net carries the state it was filtered with.
    """
    stated = caffe_pb2.NetParameter()
    stated.CopyFrom(net)
    if phase is not None:
        stated.state.phase = to_phase(phase)
    stated.state.stage.extend(stages)
    stated.state.level = level
    return filter_by_state(stated)


def split_layer_name(blob: str, layer: str, top_index: int) -> str:
    """Caffe's name for the Split layer after top `top_index` (blob `blob`) of layer `layer`."""
    return f"{blob}_{layer}_{top_index}_split"


def split_blob_name(blob: str, layer: str, top_index: int, split_index: int) -> str:
    """Caffe's name for output `split_index` of that Split layer."""
    return f"{blob}_{layer}_{top_index}_split_{split_index}"


# Where a blob was produced: (layer index, top index); layer index -1 = a net-level `input`.
_TopId = tuple[int, int]
_NET_INPUT_LAYER_NAME = "input"  # the name Caffe's upgrade gives the Input layer too


def insert_splits(net: caffe_pb2.NetParameter) -> caffe_pb2.NetParameter:
    """The net with a Split layer after every top that more than one consumer reads.

    A top's consumers are the bottoms that read that very production of the blob (an in-place
    layer re-produces it) plus, when the top has a non-zero loss_weight, the loss itself. The
    Split follows the producer; consumers read its tops in order; a loss weight moves to split
    top 0 (the producer's loss weights are cleared). Net-level `input` blobs, left only by an
    un-upgraded net, get their Splits first, under the producer name "input".
    """
    last_top: dict[str, _TopId] = {}
    source_of_bottom: dict[tuple[int, int], _TopId] = {}
    consumer_count: defaultdict[_TopId, int] = defaultdict(int)
    loss_weight_of: dict[_TopId, float] = {}
    for index, blob in enumerate(net.input):
        last_top[blob] = (-1, index)
    for layer_index, layer in enumerate(net.layer):
        for bottom_index, blob in enumerate(layer.bottom):
            if blob not in last_top:
                raise CaffeNetError(f"unknown bottom blob {blob!r} (layer {layer.name!r}, bottom "
                                    f"index {bottom_index}): no earlier layer produces it")
            source = last_top[blob]
            source_of_bottom[(layer_index, bottom_index)] = source
            consumer_count[source] += 1
        for top_index, blob in enumerate(layer.top):
            last_top[blob] = (layer_index, top_index)
        for top_index in range(min(len(layer.loss_weight), len(layer.top))):
            top = last_top[layer.top[top_index]]
            loss_weight_of[top] = layer.loss_weight[top_index]
            if loss_weight_of[top]:
                consumer_count[top] += 1

    split_net = caffe_pb2.NetParameter()
    split_net.CopyFrom(net)
    split_net.ClearField("layer")
    next_split: defaultdict[_TopId, int] = defaultdict(int)

    def producer_name(layer_index: int) -> str:
        return _NET_INPUT_LAYER_NAME if layer_index < 0 else net.layer[layer_index].name

    for index, blob in enumerate(net.input):
        count = consumer_count[(-1, index)]
        if count > 1:
            _add_split_layer(split_net, _NET_INPUT_LAYER_NAME, blob, index, count, 0.0)
    for layer_index, layer in enumerate(net.layer):
        copy = split_net.layer.add()
        copy.CopyFrom(layer)
        for bottom_index, blob in enumerate(copy.bottom):
            source = source_of_bottom[(layer_index, bottom_index)]
            if consumer_count[source] > 1:
                copy.bottom[bottom_index] = split_blob_name(
                    blob, producer_name(source[0]), source[1], next_split[source])
                next_split[source] += 1
        for top_index, blob in enumerate(copy.top):
            top = (layer_index, top_index)
            count = consumer_count[top]
            if count > 1:
                loss_weight = loss_weight_of.get(top, 0.0)
                _add_split_layer(split_net, layer.name, blob, top_index, count, loss_weight)
                if loss_weight:
                    copy.ClearField("loss_weight")  # as Caffe: all of the producer's weights
                    next_split[top] += 1  # split top 0 is the loss, not a consumer
    return split_net


def _add_split_layer(net: caffe_pb2.NetParameter, producer: str, blob: str, top_index: int,
                     count: int, loss_weight: float) -> None:
    split = net.layer.add()
    split.name = split_layer_name(blob, producer, top_index)
    split.type = "Split"
    split.bottom.append(blob)
    for split_index in range(count):
        split.top.append(split_blob_name(blob, producer, top_index, split_index))
        if loss_weight:
            split.loss_weight.append(loss_weight if split_index == 0 else 0.0)
