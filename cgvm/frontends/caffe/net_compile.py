"""Compiling a Net's layer ranges into the Functions its forward and backward run.

Each Function is cached in ``net._functions`` under the range and the shapes of every blob the
range reads from outside, so a new batch size compiles anew and an old one is found again.
``TrainingGraph`` is what ``Net.training_graph`` returns: the same graphs, left uncompiled.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np

from cgvm.autodiff import grad_map
from cgvm.compiled_function import Function
from cgvm.frontends.caffe.net_build import LayerInfo, ParamInfo, range_loss
from cgvm.ir import Value
from cgvm.ir.builder import rebuild
from cgvm.ops import elementwise as ew

if TYPE_CHECKING:
    from cgvm.frontends.caffe.net import Net

# (function, whether its first output is the loss, entry of each further output, the blob's own
#  entry to store it under too (None if not the blob's latest value), carried states it reads)
ForwardFunction = Tuple[Function, bool, List[str], List[Optional[str]],
                        List[Tuple[str, str, Tuple[int, ...], np.dtype]]]


@dataclass
class TrainingGraph:
    """What ``Net.training_graph()`` returns: everything symbolic, nothing compiled."""

    loss: Value                                 # scalar: sum of loss_weight * sum(top)
    outputs: "OrderedDict[str, Value]"          # the net's outputs (sorted by name)
    params: List[ParamInfo]                     # learnable params with lr_mult != 0
    param_values: Dict[str, Value]              # workspace name -> param Value read by the graph
    grads: Dict[str, Value]                     # workspace name -> d loss / d param
    state_updates: Dict[Value, Value]           # BatchNorm averages, carried states; pass them as updates


def range_key(net: "Net", kind: str, lo: int, hi: int) -> tuple:
    """Cache key: the range and the shapes of every blob it reads from outside."""
    ws = net.workspace._data
    leaves = range_leaves(net, lo, hi)
    return (kind, lo, hi) + tuple(ws[e].shape for e in leaves)


def range_leaves(net: "Net", lo: int, hi: int) -> List[str]:
    """Workspace entries of the blobs layers lo..hi read from outside the range (data tops included)."""
    key = ("leaves", lo, hi)
    hit = net._functions.get(key)
    if hit is None:
        made, leaves = set(), []
        for info in net._layers[lo:hi + 1]:
            names = info.tops if info.data is not None else info.bottoms
            for name in names:
                if name not in made and net._entry(name) not in leaves:
                    leaves.append(net._entry(name))
            made.update(info.tops)
        hit = net._functions[key] = leaves
    return hit


def forward_function(net: "Net", lo: int, hi: int) -> ForwardFunction:
    """The Function computing every blob of layers lo..hi (the loss first, when there is one)."""
    key = range_key(net, "forward", lo, hi)
    hit = net._functions.get(key)
    if hit is None:
        build = net._build(lo, hi)
        loss = range_loss(net._layers, build)
        outputs = [v for _, _, v in build.versions]
        entries = [net._version_entry[(i, t)] for i, t, _ in build.versions]
        latest = {}
        for (i, t, _), entry in zip(build.versions, entries):
            latest[net._layers[i].tops[t]] = entry
        canonical = []
        for (i, t, _), entry in zip(build.versions, entries):
            name = net._layers[i].tops[t]
            canonical.append(net._entry(name) if latest[name] == entry and entry != net._entry(name) else None)
        updates = {build.params[name]: value for name, value in build.state_updates.items()}
        fn = Function([], ([loss] if loss is not None else []) + outputs, updates=updates,
                      workspace=net.workspace, name=f"{net.name or 'net'}_forward_{lo}_{hi}",
                      update_held_arrays=True, output_entries=([None] if loss is not None else []) + entries)
        hit = net._functions[key] = (fn, loss is not None, entries, canonical, build.carried)
    return hit


def backward_function(net: "Net", lo: int, hi: int) -> Tuple[Function, List[str]]:
    """The Function giving the blob diffs of layers lo..hi (and the workspace entries they go to);
    it adds the param gradients into the params' diffs itself."""
    key = range_key(net, "backward", lo, hi)
    hit = net._functions.get(key)
    if hit is not None:
        return hit
    build = net._build(lo, hi)
    seeds: Dict[Value, Value] = {}
    for i, t, value in build.versions:
        if id(value) in build.consumed or not value.dtype.is_float:
            continue
        seed = net._leaf_value(build, net._entry(net._layers[i].tops[t]) + "@diff")
        seeds[value] = seed if value not in seeds else ew.add(seeds[value], seed)
    learn = [net._params[name] for name in build.params if name in net._params
             and net._params[name].lr_mult != 0.0]
    wrt = [build.params[p.name] for p in learn]
    if net.force_backward:
        data_tops = [v for i, _, v in build.versions if net._layers[i].data is not None]
        wrt += [v for v in list(build.leaves.values()) + data_tops if v.dtype.is_float]
    else:  # as Caffe: a blob entering the range gets a diff when something learnable lies upstream of it
        needs = _blobs_needing_backward(net._layers)
        wrt += [v for name, v in build.leaves.items() if name in needs and v.dtype.is_float]
    gmap = grad_map(seeds, wrt) if seeds and wrt else {}
    blob_grads, blob_entries = [], []
    first_version: Dict[str, Value] = {}
    for i, t, value in build.versions:
        first_version.setdefault(net._layers[i].tops[t], value)
    for name, value in list(first_version.items()) + list(build.leaves.items()):
        g = gmap.get(id(value))
        if g is not None and net._entry(name) + "@diff" not in blob_entries:
            blob_grads.append(g)
            blob_entries.append(net._entry(name) + "@diff")
    updates = {}
    for p in learn:
        g = gmap.get(id(build.params[p.name]))
        if g is not None:
            target = net._leaf_value(build, p.diff_name)
            updates[target] = ew.add(target, g)
    stored = {id(v): net._leaf_value(build, net._version_entry[(i, t)]) for i, t, v in build.versions}
    targets = list(updates)
    cut = rebuild(blob_grads + [updates[t] for t in targets], stored)
    fn = Function([], cut[:len(blob_grads)], updates=dict(zip(targets, cut[len(blob_grads):])),
                  workspace=net.workspace, name=f"{net.name or 'net'}_backward_{lo}_{hi}", update_held_arrays=True,
                  output_entries=blob_entries)
    hit = net._functions[key] = (fn, blob_entries)
    return hit


def _blobs_needing_backward(layers: Sequence[LayerInfo]) -> set:
    """Blobs computed from a learnable parameter (Caffe's blob_need_backward without force_backward)."""
    needs: set = set()
    for info in layers:
        learnable = any(p.lr_mult != 0.0 for p in info.params)
        if learnable or any(b in needs for b in info.bottoms):
            needs.update(info.tops)
    return needs
