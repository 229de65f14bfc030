"""A Caffe net as one plain cgvm Graph, for tools that work on graphs (``cgvm info``, ``cgvm compile``).

``graph_from_prototxt(path, phase)`` builds the net as ``Net`` does (phase filtering, upgrades,
in-place tops, weight sharing) and returns the graph of its forward pass: the inputs are the
tops of its data layers (``Input``, ``DummyData``, ... with the shapes they declare), the
parameters are the net's learnable blobs under their workspace names (with the host-side state
some layers read: dropout seeds in TRAIN, LSTM/RNN carried states), and the outputs are the
net's output blobs (those no layer consumes), in ``Net.outputs`` order.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from cgvm.frontends.caffe.net import Net
from cgvm.ir import Graph, Value, input_value, rebuild


def graph_from_prototxt(path: str, phase: Any = "TEST", *, net: Optional[Net] = None) -> Graph:
    """The forward graph of the Caffe net in ``path`` (or of an already built ``net``)."""
    if net is None:
        net = Net(path, phase)
    build = net._build(0, len(net.layer_infos) - 1)
    replace: Dict[int, Value] = {}
    inputs: List[Value] = []
    for info in net.layer_infos:
        if info.data is None:
            continue
        for name in info.tops:
            leaf = build.params.get(net._entry(name))
            if leaf is None or id(leaf) in replace:
                continue
            replace[id(leaf)] = input_value(leaf.type, name)
            inputs.append(replace[id(leaf)])
    outputs = rebuild([build.current[name] for name in net.outputs], replace)
    name = net.name or os.path.splitext(os.path.basename(os.fspath(path)))[0]
    return Graph(inputs, outputs, name=name)
