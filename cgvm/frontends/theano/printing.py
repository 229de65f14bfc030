"""``theano.printing``: pprint (infix text), debugprint (indented tree) and pydotprint (dot / SVG).

``debugprint`` follows Theano's layout: one line per node, ``[id A]`` tags, children indented
under ``|``, repeated sub-trees abbreviated after their first appearance; on a compiled function
it prints the optimized graph, and the body graphs of ``scan``/``cond`` nodes below it.
``pydotprint`` writes Graphviz dot; for ``.svg``/``.png`` it runs ``dot`` when installed and
otherwise draws the SVG itself (nodes layered by depth), so it works without Graphviz.
"""
from __future__ import annotations

import html
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence, TextIO

from ...ir.graph import CONST, INPUT, PARAM, Graph, Value, toposort
from .var import TensorVariable, as_tensor_variable

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%", "pow": "**",
          "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _leaf_name(v: Value, shared_names: Dict[int, str]) -> str:
    if v.kind == CONST:
        data = v.data
        return repr(data.item()) if data.size == 1 else f"TensorConstant{{{data.shape}}}"
    if v.kind == PARAM:
        return shared_names.get(id(v)) or v.name
    return v.name or f"<{v.type!r}>"


def _shared_names() -> Dict[int, str]:
    from .var import SHARED_BY_VALUE

    out = {}
    for k, ref in list(SHARED_BY_VALUE.items()):
        var = ref()
        if var is not None and var.name:
            out[k] = var.name
    return out


def pprint(x: Any) -> str:
    """An infix rendering of the expression, e.g. ``((x * W) + b)``."""
    v = as_tensor_variable(x).value
    names = _shared_names()
    memo: Dict[int, str] = {}

    def text(u: Value) -> str:
        if u.node is None:
            return _leaf_name(u, names)
        hit = memo.get(id(u))
        if hit is not None:
            return hit
        node = u.node
        args = [text(i) for i in node.inputs]
        op = node.op.name
        if op in _INFIX and len(args) == 2:
            out = f"({args[0]} {_INFIX[op]} {args[1]})"
        elif op == "neg":
            out = f"(-{args[0]})"
        else:
            attrs = ", ".join(f"{k}={val!r}" for k, val in node.attrs.items()
                              if val is not None and not isinstance(val, Graph))
            out = f"{op}{{{attrs}}}({', '.join(args)})" if attrs else f"{op}({', '.join(args)})"
        if len(node.outputs) > 1:
            out = f"{out}[{u.index}]"
        memo[id(u)] = out
        return out

    return text(v)


def _id_gen(style: str):
    n = [0]

    def next_id() -> str:
        k = n[0]
        n[0] += 1
        if style == "int":
            return str(k)
        letters = ""
        k += 1
        while k:
            k, r = divmod(k - 1, 26)
            letters = chr(65 + r) + letters
        return letters
    return next_id


def debugprint(obj: Any, file: Optional[TextIO] = None, print_type: bool = False, ids: str = "CHAR",
               depth: int = -1, done: Optional[dict] = None, stop_on_name: bool = False, **_: Any) -> Any:
    """Print (or, with ``file='str'``, return) the graph of variables or of a compiled function."""
    outputs, graphs = _roots(obj)
    names = _shared_names()
    tags: Dict[int, str] = {} if done is None else done
    next_id = _id_gen("int" if ids == "int" else "CHAR")
    lines: List[str] = []

    def tag(v: Value) -> str:
        key = id(v.node) if v.node is not None else id(v)
        if key not in tags:
            tags[key] = next_id()
        return tags[key]

    def typ(v: Value) -> str:
        return f" <{v.type!r}>" if print_type else ""

    printed: set = set()

    def walk(v: Value, prefix: str, level: int) -> None:
        if v.node is None:
            lines.append(f"{prefix}{_leaf_name(v, names)} [id {tag(v)}]{typ(v)}")
            return
        node = v.node
        attrs = ", ".join(f"{k}={a!r}" for k, a in node.attrs.items() if a is not None and not isinstance(a, Graph))
        head = f"{node.op.name}{{{attrs}}}" if attrs else node.op.name
        out_ix = f".{v.index}" if len(node.outputs) > 1 else ""
        key = id(node)
        seen = key in printed
        lines.append(f"{prefix}{head}{out_ix} [id {tag(v)}]{typ(v)}{' ...' if seen and node.inputs else ''}")
        if seen or (depth >= 0 and level >= depth):
            return
        printed.add(key)
        for inp in node.inputs:
            walk(inp, prefix + " |", level + 1)
        for name, sub in node.attrs.items():
            if isinstance(sub, Graph):
                graphs.append((f"{node.op.name}.{name} [id {tag(v)}]", sub))

    for v in outputs:
        walk(v, "", 0)
    done_graphs: set = set()
    while graphs:
        title, g = graphs.pop(0)
        if id(g) in done_graphs:
            continue
        done_graphs.add(id(g))
        lines.append("")
        lines.append(f"Inner graph of {title}")
        for v in g.outputs:
            walk(v, "> ", 0)
    text = "\n".join(lines)
    if file == "str":
        return text
    print(text, file=file if file is not None else sys.stdout)
    return file


dprint = debugprint


def _roots(obj: Any):
    from .function import Function

    if isinstance(obj, Function):
        return list(obj.graph.outputs), []
    if isinstance(obj, Graph):
        return list(obj.outputs), []
    if isinstance(obj, (list, tuple)):
        return [as_tensor_variable(o).value for o in obj], []
    return [as_tensor_variable(obj).value], []


def _graph_of(obj: Any) -> Graph:
    from .function import Function

    if isinstance(obj, Function):
        return obj.graph
    if isinstance(obj, Graph):
        return obj
    outs = [as_tensor_variable(o).value for o in (obj if isinstance(obj, (list, tuple)) else [obj])]
    leaves = [v for n in toposort(outs) for v in n.inputs if v.node is None and v.kind == INPUT]
    return Graph(list(dict.fromkeys(leaves)), outs, name="expression")


def to_dot(obj: Any) -> str:
    """The graph as Graphviz dot text: ellipses for values, boxes for ops."""
    g = _graph_of(obj)
    names = _shared_names()
    lines = ["digraph G {", "  rankdir=TB;"]
    ids: Dict[int, str] = {}

    def vid(v: Value) -> str:
        if id(v) not in ids:
            ids[id(v)] = f"v{len(ids)}"
            label = _leaf_name(v, names) if v.node is None else repr(v.type)
            color = {INPUT: "green", PARAM: "cyan", CONST: "gray"}.get(v.kind, "white")
            lines.append(f'  {ids[id(v)]} [label="{_esc(label)}", shape=ellipse, style=filled, fillcolor={color}];')
        return ids[id(v)]

    for k, node in enumerate(g.nodes):
        lines.append(f'  n{k} [label="{_esc(node.op.name)}", shape=box];')
        for i in node.inputs:
            lines.append(f"  {vid(i)} -> n{k};")
        for o in node.outputs:
            lines.append(f"  n{k} -> {vid(o)};")
    for v in g.outputs:
        lines.append(f'  {vid(v)} [peripheries=2];')
    lines.append("}")
    return "\n".join(lines)


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def pydotprint(fct: Any, outfile: Optional[str] = None, format: str = "png", **_: Any) -> str:
    """Draw a graph to ``outfile`` (.dot, .svg, or .png when Graphviz is installed); returns the path."""
    outfile = outfile or f"theano_graph.{format}"
    fmt = outfile.rsplit(".", 1)[-1].lower() if "." in outfile else format
    dot = to_dot(fct)
    if fmt == "dot":
        data = dot.encode()
    elif shutil.which("dot"):
        data = subprocess.run(["dot", f"-T{fmt}"], input=dot.encode(), capture_output=True, check=True).stdout
    elif fmt == "svg":
        data = to_svg(fct).encode()
    else:
        raise RuntimeError(f"pydotprint: writing .{fmt} needs Graphviz's `dot`; write .svg or .dot instead")
    with open(outfile, "wb") as fh:
        fh.write(data)
    return outfile


def to_svg(obj: Any) -> str:
    """A self-contained SVG drawing of the graph: values and ops layered by depth, edges as lines."""
    g = _graph_of(obj)
    names = _shared_names()
    depth: Dict[int, int] = {}
    items: List[tuple] = []  # (key, label, is_op)
    edges: List[tuple] = []

    def value_item(v: Value) -> int:
        key = id(v)
        if key not in depth:
            depth[key] = 0 if v.node is None else depth[id(v.node)] + 1
            items.append((key, _leaf_name(v, names) if v.node is None else repr(v.type), False))
        return key

    for node in g.nodes:
        ins = [value_item(i) for i in node.inputs]
        depth[id(node)] = max([depth[i] for i in ins] + [0]) + 1
        items.append((id(node), node.op.name, True))
        edges += [(i, id(node)) for i in ins]
        for o in node.outputs:
            edges.append((id(node), value_item(o)))
    for v in g.outputs:
        value_item(v)
    rows: Dict[int, List[int]] = {}
    for key, _, _ in items:
        rows.setdefault(depth[key], []).append(key)
    pos: Dict[int, tuple] = {}
    w, h = 150, 60
    for d, keys in rows.items():
        for j, key in enumerate(keys):
            pos[key] = (20 + j * (w + 20), 20 + d * (h + 10))
    width = max(x for x, _ in pos.values()) + w + 20 if pos else 200
    height = max(y for _, y in pos.values()) + h + 20 if pos else 100
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">']
    for a, b in edges:
        (x1, y1), (x2, y2) = pos[a], pos[b]
        out.append(f'<line x1="{x1 + w / 2}" y1="{y1 + 40}" x2="{x2 + w / 2}" y2="{y2}" stroke="black"/>')
    for key, label, is_op in items:
        x, y = pos[key]
        shape = (f'<rect x="{x}" y="{y}" width="{w}" height="40" fill="#ddeeff" stroke="black"/>' if is_op else
                 f'<ellipse cx="{x + w / 2}" cy="{y + 20}" rx="{w / 2}" ry="20" fill="#eeffee" stroke="black"/>')
        out.append(shape)
        out.append(f'<text x="{x + w / 2}" y="{y + 25}" text-anchor="middle" font-size="11">'
                   f"{html.escape(label[:24])}</text>")
    out.append("</svg>")
    return "\n".join(out)


class Print:
    """``Print('msg')(x)``: the identity; the message is kept for the graph text (no run-time printing)."""

    def __init__(self, message: str = "", attrs: Sequence[str] = ("__str__",), global_fn: Any = None):
        self.message = message

    def __call__(self, x: Any) -> TensorVariable:
        return as_tensor_variable(x)
pp = pprint
