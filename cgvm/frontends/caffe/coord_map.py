"""``caffe.coord_map``: how pixel coordinates of one NetSpec top relate to another's (FCN's crop inference).

A spatial layer maps the coordinates of its top to those of its bottom by an affine rule along
its spatial axes, ``bottom = a * top + b``, written here as a triple ``(axis, a, b)`` (axis: the
first axis the rule applies to; None for layers that keep coordinates as they are):

* Convolution, Pooling, Im2col (stride s, effective kernel k = (kernel - 1) * dilation + 1, pad p):
  top pixel i covers bottom pixels starting at s*i - p, centred at s*i - p + (k-1)/2; as the map
  from bottom to top it is ``a = 1/s``, ``b = (p - (k-1)/2) / s``;
* Deconvolution: the inverse, ``a = s``, ``b = (k-1)/2 - p``;
* Crop (axis c, offset o): ``(c - 1, 1, -o)``;
* element-wise layers (ReLU, BatchNorm, Eltwise, ...): the identity.

``coord_map_from_to(top_from, top_to)`` composes these back from both tops to a blob they share;
``crop(top_from, top_to)`` turns the result into a Crop layer that aligns ``top_from`` with
``top_to`` (the scales must agree and the offset be a whole, non-negative number of pixels).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from cgvm.frontends.caffe.net_spec import layers as _layers

# layers whose top pixel (x, y) comes from bottom pixel (x, y)
IDENTITY_MAP_TYPES = frozenset({
    "AbsVal", "BatchNorm", "Bias", "BNLL", "Dropout", "Eltwise", "ELU", "Log", "LRN", "Exp", "MVN",
    "Power", "ReLU", "PReLU", "Scale", "Sigmoid", "Split", "TanH", "Threshold"})
_WINDOW_TYPES = frozenset({"Convolution", "Pooling", "Im2col"})

CoordMap = Tuple[Optional[int], Any, Any]
IDENTITY: CoordMap = (None, 1, 0)


class UndefinedMapException(Exception):
    """The layer has no coordinate mapping (an InnerProduct, a loss, a data layer...)."""


class AxisMismatchException(Exception):
    """Two mappings start at different axes and cannot be composed."""


def _param(fn: Any, message: str) -> Dict[str, Any]:
    params = fn.params
    return params[message] if message in params else params


def _as_vector(value: Any) -> np.ndarray:
    return np.array(value, ndmin=1)


def _window(fn: Any) -> Tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """(axis, stride, effective kernel extent, pad) of a Convolution-like layer's spec."""
    spec = _param(fn, "convolution_param")
    legacy = {"pad_h", "pad_w", "kernel_h", "kernel_w", "stride_h", "stride_w"} & set(fn.params)
    assert not legacy, f"coord_map handles kernel_size/stride/pad, not the _h/_w forms ({sorted(legacy)})"
    kernel = _as_vector(spec["kernel_size"])
    dilation = _as_vector(spec.get("dilation", 1))
    return (spec.get("axis", 1), _as_vector(spec.get("stride", 1)), (kernel - 1) * dilation + 1,
            _as_vector(spec.get("pad", 0)))


def coord_map(fn: Any) -> CoordMap:
    """The (axis, a, b) map of one NetSpec layer function from its top to its bottom."""
    kind = fn.type_name
    if kind in _WINDOW_TYPES:
        axis, stride, extent, pad = _window(fn)
        return axis, 1 / stride, (pad - (extent - 1) / 2) / stride
    if kind == "Deconvolution":
        axis, stride, extent, pad = _window(fn)
        return axis, stride, (extent - 1) / 2 - pad
    if kind in IDENTITY_MAP_TYPES:
        return IDENTITY
    if kind == "Crop":
        spec = _param(fn, "crop_param")
        # Crop's axis counts the first cropped axis; the map's axis is the last one left alone
        return spec.get("axis", 2) - 1, 1, -_as_vector(spec.get("offset", 0))
    raise UndefinedMapException(f"no coordinate map through a {kind} layer")


def compose(first: CoordMap, then: CoordMap) -> CoordMap:
    """The map applying ``then`` and then ``first`` (x -> a1 * (a2 * x + b2) + b1)."""
    axis1, a1, b1 = first
    axis2, a2, b2 = then
    if axis1 is not None and axis2 is not None and axis1 != axis2:
        raise AxisMismatchException(f"cannot compose maps over axis {axis1} and axis {axis2}")
    return (axis2 if axis1 is None else axis1), a1 * a2, a1 * b2 + b1


def inverse(mapping: CoordMap) -> CoordMap:
    axis, a, b = mapping
    return axis, 1 / a, -b / a


def _spatial_bottoms(top: Any) -> Tuple[Any, ...]:
    inputs = top.fn.inputs
    # a Crop's second bottom only gives the size to crop to: coordinates follow the first
    return inputs[:1] if top.fn.type_name == "Crop" else inputs


def _maps_back_from(top: Any) -> Dict[Any, CoordMap]:
    """Every blob reachable backward from ``top`` through mapped layers, with its map to ``top``."""
    found = {top: IDENTITY}
    pending = [top]
    while pending:
        current = pending.pop()
        try:
            step = coord_map(current.fn)
        except UndefinedMapException:
            continue
        for bottom in _spatial_bottoms(current):
            if bottom not in found:
                found[bottom] = compose(found[current], step)
                pending.append(bottom)
    return found


def coord_map_from_to(top_from: Any, top_to: Any) -> CoordMap:
    """The (axis, a, b) taking coordinates of ``top_from`` to those of ``top_to``."""
    from_maps = _maps_back_from(top_from)
    seen = {top_to: IDENTITY}
    pending = [top_to]
    while pending:
        current = pending.pop(0)
        if current in from_maps:
            return compose(seen[current], inverse(from_maps[current]))
        try:
            step = coord_map(current.fn)
        except UndefinedMapException:
            continue
        for bottom in _spatial_bottoms(current):
            if bottom not in seen:
                seen[bottom] = compose(seen[current], step)
                pending.append(bottom)
    raise RuntimeError("the two tops share no blob through spatial layers, so their coordinates are "
                       "not related (is a layer without a coordinate map, such as InnerProduct, between them?)")


def crop(top_from: Any, top_to: Any) -> Any:
    """A Crop layer (NetSpec Top) cutting ``top_from`` to align with ``top_to``."""
    axis, a, b = coord_map_from_to(top_from, top_to)
    a, b = np.asarray(a), np.asarray(b)
    assert (a == 1).all(), f"the tops have different scales (a = {a}); Crop cannot align them"
    assert (b <= 0).all(), f"top_from would need a negative offset (b = {b}): it is smaller than top_to"
    assert (np.round(b) == b).all(), f"the offset is not a whole number of pixels (b = {b})"
    return _layers.Crop(top_from, top_to, crop_param=dict(axis=axis + 1, offset=list(-np.round(b).astype(int))))


__all__ = ["coord_map", "coord_map_from_to", "crop", "compose", "inverse", "UndefinedMapException",
           "AxisMismatchException", "IDENTITY_MAP_TYPES"]
