"""Readable text form of a graph: one line per node, with types, attributes and sources."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

from .graph import CONST, PARAM, Graph, Value


def _attr_text(value: Any) -> str:
    if isinstance(value, np.ndarray):
        if value.size <= 8:
            return np.array2string(value, separator=",").replace("\n", "")
        return f"<{value.dtype}{list(value.shape)}>"
    if isinstance(value, Graph):
        return f"<graph {value.name}: {len(value.nodes)} nodes>"
    return repr(value)


def format_graph(graph: Graph, *, show_source: bool = True, indent: str = "") -> str:
    names: Dict[int, str] = {}
    counter = [0]

    def name(v: Value) -> str:
        key = id(v)
        if key not in names:
            if v.kind == PARAM:
                names[key] = f"%{v.name}"
            elif v.kind == CONST:
                data = v.data
                names[key] = (repr(data.item()) if data.size == 1 and data.ndim == 0
                              else f"const<{v.type!r}>")
            else:
                names[key] = f"%{v.name}" if v.name and v.kind == "input" else f"%{counter[0]}"
                counter[0] += 1
        return names[key]

    head = ", ".join(f"{name(v)}: {v.type!r}" for v in graph.inputs)
    lines = [f"{indent}graph {graph.name}({head}) {{"]
    if graph.params:
        lines.append(f"{indent}  params " + ", ".join(f"{name(p)}: {p.type!r}" for p in graph.params))
    for node in graph.nodes:
        outs = ", ".join(name(o) for o in node.outputs)
        types = ", ".join(repr(o.type) for o in node.outputs)
        args = ", ".join(name(v) for v in node.inputs)
        attrs = ", ".join(f"{k}={_attr_text(v)}" for k, v in node.attrs.items()
                          if not isinstance(v, Graph))
        text = f"{indent}  {outs} = {node.op.name}({args})"
        if attrs:
            text += f" {{{attrs}}}"
        text += f" : {types}"
        if show_source and (node.source or node.name):
            tag = " ".join(x for x in (repr(node.name) if node.name else "", node.source or "") if x)
            text += f"  # {tag}"
        lines.append(text)
        for k, v in node.attrs.items():
            if isinstance(v, Graph):
                lines.append(f"{indent}    {k} =")
                lines.append(format_graph(v, show_source=show_source, indent=indent + "      "))
    lines.append(f"{indent}  return " + ", ".join(name(v) for v in graph.outputs))
    lines.append(f"{indent}}}")
    return "\n".join(lines)
