"""``caffe.draw``: a net (a NetParameter proto) as a Graphviz graph.

Layers are filled boxes labelled with their name, type and key parameters (kernel, stride,
pad, pooling method; ``display_lrm`` adds lr_mult), blobs are grey octagons. A blob that an
in-place layer rewrites gets a new node per version, so the drawing stays acyclic. ``phase``
keeps only the layers an include/exclude rule admits in that phase (stages are ignored, as in
pycaffe). The DOT text is built here with no dependency; rendering to PNG, SVG or PDF runs
Graphviz's ``dot`` program when it is installed (a clear error says so when it is not).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from typing import Dict, List, Optional

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeError

__all__ = ["get_dot_source", "draw_net", "draw_net_to_file", "can_render"]

LAYER_STYLE = {"Convolution": "#FF5050", "Deconvolution": "#FF5050", "Pooling": "#FF9900",
               "InnerProduct": "#CC33FF"}
DEFAULT_LAYER_COLOR = "#6495ED"
BLOB_COLOR = "#E0E0E0"
TEXT_FORMATS = ("dot", "gv")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _in_phase(layer: caffe_pb2.LayerParameter, phase: Optional[int]) -> bool:
    if phase is None:
        return True
    if layer.include:
        return any(not rule.HasField("phase") or rule.phase == phase for rule in layer.include)
    return not any(rule.HasField("phase") and rule.phase == phase for rule in layer.exclude)


def _layer_label(layer: caffe_pb2.LayerParameter, display_lrm: bool) -> str:
    lines = [layer.name, f"({layer.type})"]
    if layer.type in ("Convolution", "Deconvolution"):
        p = layer.convolution_param
        kernel = p.kernel_size[0] if len(p.kernel_size) else (p.kernel_h or 1)
        stride = p.stride[0] if len(p.stride) else (p.stride_h or 1)
        pad = p.pad[0] if len(p.pad) else p.pad_h
        lines.append(f"kernel size: {kernel}")
        lines.append(f"stride: {stride}")
        lines.append(f"pad: {pad}")
    elif layer.type == "Pooling":
        p = layer.pooling_param
        method = caffe_pb2.PoolingParameter.PoolMethod.Name(p.pool)
        lines.append(f"pool {method}")
        lines.append(f"kernel size: {p.kernel_size or p.kernel_h}")
        lines.append(f"stride: {p.stride or p.stride_h}")
        lines.append(f"pad: {p.pad or p.pad_h}")
    if display_lrm and layer.param:
        lines.append("lr mult: " + ", ".join(f"{ps.lr_mult:g}" for ps in layer.param))
    return "\n".join(lines)


def get_dot_source(caffe_net: caffe_pb2.NetParameter, rankdir: str = "LR", phase: Optional[int] = None,
                   display_lrm: bool = False) -> str:
    """The DOT text of the net."""
    if rankdir not in ("LR", "TB", "BT", "RL"):
        raise ValueError(f"rankdir must be LR, TB, BT or RL, got {rankdir!r}")
    name = caffe_net.name or "net"
    lines: List[str] = [f"digraph {_quote(name)} {{", f"  graph [rankdir={rankdir}];",
                        '  node [fontname="Helvetica", fontsize=10];']
    current: Dict[str, str] = {}          # blob name -> node id of its latest version
    versions: Dict[str, int] = {}

    def blob_node(blob: str, new: bool) -> str:
        if blob in current and not new:
            return current[blob]
        versions[blob] = versions.get(blob, -1) + 1
        node = f"blob_{blob}" if versions[blob] == 0 else f"blob_{blob}_{versions[blob]}"
        current[blob] = node
        lines.append(f"  {_quote(node)} [label={_quote(blob)}, shape=octagon, style=filled, "
                     f"fillcolor={_quote(BLOB_COLOR)}];")
        return node

    for index, layer in enumerate(caffe_net.layer):
        if not _in_phase(layer, phase):
            continue
        node = f"layer_{index}_{layer.name}"
        color = LAYER_STYLE.get(layer.type, DEFAULT_LAYER_COLOR)
        lines.append(f"  {_quote(node)} [label={_quote(_layer_label(layer, display_lrm))}, shape=record, "
                     f"style=filled, fillcolor={_quote(color)}];")
        for bottom in layer.bottom:
            lines.append(f"  {_quote(blob_node(bottom, False))} -> {_quote(node)};")
        for top in layer.top:
            target = blob_node(top, new=top in current)
            lines.append(f"  {_quote(node)} -> {_quote(target)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def can_render() -> bool:
    """Whether PNG/SVG/PDF output is possible here (graphviz's ``dot`` program is found)."""
    return shutil.which("dot") is not None


def draw_net(caffe_net: caffe_pb2.NetParameter, rankdir: str = "LR", ext: str = "png", phase: Optional[int] = None,
             display_lrm: bool = False) -> bytes:
    """The drawing as bytes in format ``ext`` ("dot" gives the DOT text)."""
    source = get_dot_source(caffe_net, rankdir, phase, display_lrm)
    ext = ext.lower().lstrip(".")
    if ext in TEXT_FORMATS:
        return source.encode()
    dot = shutil.which("dot")
    if dot is None:
        raise CaffeError(f"drawing to .{ext} needs Graphviz's `dot` program, which is not installed here; "
                         "install graphviz (e.g. `apt-get install graphviz`) or write a .dot file instead")
    try:
        done = subprocess.run([dot, f"-T{ext}"], input=source.encode(), capture_output=True, check=False,
                              timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CaffeError(f"running Graphviz's dot failed: {exc}") from exc
    if done.returncode != 0:
        raise CaffeError(f"Graphviz's dot could not render .{ext}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def draw_net_to_file(caffe_net: caffe_pb2.NetParameter, filename: str, rankdir: str = "LR",
                     phase: Optional[int] = None, display_lrm: bool = False) -> None:
    """Draw the net into ``filename``; the format comes from its extension (.dot, .png, .svg, .pdf...)."""
    ext = os.path.splitext(filename)[1].lstrip(".") or "png"
    data = draw_net(caffe_net, rankdir, ext, phase, display_lrm)
    with open(filename, "wb") as f:
        f.write(data)
