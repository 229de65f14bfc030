"""The ONNX frontend's part of the ``cgvm`` command line.

* ``cgvm run model.onnx --input x.npy ...``: run an ONNX model on NumPy inputs, print the outputs
  (``--output out.npz`` saves them).
* ``cgvm time --model model.onnx``: forward time per call; ``cgvm draw model.onnx out.dot``.
  (``compile``, ``dis`` and ``info`` read .onnx files through ``cgvm.cli.load_graph_file``;
  ``cgvm export``, which reads every frontend's files, is a command of cgvm.cli itself.)

``run``, ``time`` and ``draw`` are the Caffe frontend's commands for prototxt files; for a .onnx
model they dispatch here.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Dict, List

import numpy as np

from cgvm.commands import COMMANDS
from cgvm.errors import CgvmError

ONNX_SUFFIX = ".onnx"


def is_onnx(path: Any) -> bool:
    return isinstance(path, str) and path.lower().endswith(ONNX_SUFFIX)


def _parse_dim_fix(items: List[str]) -> Dict[str, int]:
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if not value:
            raise CgvmError(f"--dim {item!r}: write NAME=SIZE")
        out[name] = int(value)
    return out


def graph_from_onnx(path: str, args: argparse.Namespace):
    """The cgvm Graph of an ONNX file (for compile, dis, info): symbolic dims from --shape NAME=dims
    where given, else unknown."""
    from .model import load

    model = load(path)
    shapes = dict(_shape_arg(s) for s in getattr(args, "shape", []) or [])
    types = model.input_types()
    from cgvm.ir import TensorType

    types = [TensorType(shapes[n], t.dtype) if n in shapes else t for n, t in zip(model.input_names, types)]
    return model.graph(types)


def _shape_arg(text: str):
    name, _, dims = text.partition("=")
    return name, tuple(int(d) for d in dims.split(","))


# --------------------------------------------------------------------------- export


# --------------------------------------------------------------------------- run


def _load_inputs(model: Any, specs: List[str]) -> List[np.ndarray]:
    named: Dict[str, np.ndarray] = {}
    ordered: List[np.ndarray] = []
    for spec in specs:
        name, eq, path = spec.partition("=")
        if not eq:
            name, path = "", spec
        if not os.path.isfile(path):
            raise CgvmError(f"input {path!r} not found")
        arr = np.load(path, allow_pickle=False)
        if name:
            named[name] = arr
        else:
            ordered.append(arr)
    names = model.input_names
    if len(ordered) + len(named) != len(names):
        raise CgvmError(f"the model takes {len(names)} inputs {names}; --input gave {len(ordered) + len(named)}")
    unknown = sorted(set(named) - set(names))
    if unknown:
        raise CgvmError(f"--input names {unknown} are not inputs of the model {names}")
    free = iter(ordered)
    return [named[n] if n in named else next(free) for n in names]


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", default="", help="with an .onnx model: save the outputs to this .npz")


def _onnx_run(args: argparse.Namespace) -> int:
    from .model import load

    model = load(args.model)
    arrays = _load_inputs(model, args.input)
    want = model.input_types()
    arrays = [a.astype(t.dtype.np) if a.dtype != t.dtype.np and np.can_cast(a.dtype, t.dtype.np, "same_kind")
              else a for a, t in zip(arrays, want)]
    outs = model.run(arrays)
    for name, out in zip(model.output_names, outs):
        out = np.asarray(out)
        print(f"{name}: {out.dtype}{list(out.shape)}")
        flat = out.reshape(-1)
        with np.printoptions(precision=5, suppress=True, threshold=20):
            print(f"  {flat[:20]}{' ...' if flat.size > 20 else ''}")
            if out.ndim == 2 and out.shape[1] > 1 and out.dtype.kind == "f":
                print(f"  argmax per row: {out.argmax(axis=1).tolist()}")
    if args.output:
        np.savez(args.output, **{n: np.asarray(o) for n, o in zip(model.output_names, outs)})
        print(f"saved outputs to {args.output}")
    return 0


# --------------------------------------------------------------------------- time


def _onnx_time(args: argparse.Namespace) -> int:
    from .model import load

    model = load(args.model)
    fixed = {}
    arrays = []
    rng = np.random.default_rng(0)
    for t in model.input_types(fixed):
        shape = tuple(1 if d is None else d for d in t.shape)
        arrays.append(rng.standard_normal(shape).astype(t.dtype.np) if t.dtype.is_float
                      else np.zeros(shape, t.dtype.np))
    model.run(arrays)                                   # translate, compile and warm up
    n = max(int(args.iterations), 1)
    start = time.perf_counter()
    for _ in range(n):
        model.run(arrays)
    per = (time.perf_counter() - start) / n * 1000
    shapes = ", ".join(f"{name}{list(a.shape)}" for name, a in zip(model.input_names, arrays))
    print(f"{args.model}: forward {per:.3f} ms per call over {n} calls ({shapes}; unknown dims as 1)")
    return 0


# --------------------------------------------------------------------------- draw


def onnx_dot(model: Any, rankdir: str = "LR") -> str:
    """DOT text of an ONNX graph: ops as boxes, tensors as edges, graph inputs and outputs as ovals."""
    g = model.graph
    init = {t.name for t in g.initializer}
    lines = [f'digraph "{g.name or "onnx"}" {{', f"  rankdir={rankdir};", '  node [fontname="Helvetica"];']
    producer: Dict[str, str] = {}
    for vi in g.input:
        if vi.name not in init:
            lines.append(f'  "in:{vi.name}" [label="{vi.name}", shape=oval];')
            producer[vi.name] = f"in:{vi.name}"
    for k, node in enumerate(g.node):
        nid = f"n{k}"
        label = f"{node.op_type}\\n{node.name}" if node.name else node.op_type
        lines.append(f'  "{nid}" [label="{label}", shape=box, style=filled, fillcolor="#dde8f6"];')
        for name in node.input:
            if name in producer:
                lines.append(f'  "{producer[name]}" -> "{nid}" [label="{name}"];')
        for name in node.output:
            producer[name] = nid
    for vi in g.output:
        lines.append(f'  "out:{vi.name}" [label="{vi.name}", shape=oval];')
        if vi.name in producer:
            lines.append(f'  "{producer[vi.name]}" -> "out:{vi.name}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _onnx_draw(args: argparse.Namespace) -> int:
    import shutil
    import subprocess

    from .model import read_model

    model, _ = read_model(args.model)
    source = onnx_dot(model, args.rankdir)
    ext = os.path.splitext(args.output)[1].lstrip(".").lower() or "dot"
    if ext in ("dot", "gv"):
        data = source.encode()
    else:
        dot = shutil.which("dot")
        if dot is None:
            raise CgvmError(f"drawing to .{ext} needs Graphviz's `dot` program; write a .dot file instead")
        done = subprocess.run([dot, f"-T{ext}"], input=source.encode(), capture_output=True, timeout=120)
        if done.returncode != 0:
            raise CgvmError(f"Graphviz's dot could not render .{ext}: {done.stderr.decode(errors='replace')}")
        data = done.stdout
    with open(args.output, "wb") as f:
        f.write(data)
    print(f"Drawing {args.model} to {args.output}")
    return 0


# --------------------------------------------------------------------------- dispatch on .onnx models


def _relax(p: argparse.ArgumentParser, *flags: str) -> None:
    """Options the Caffe form of a command requires that an ONNX model does not take."""
    for action in p._actions:
        if any(f in action.option_strings for f in flags):
            action.required = False


def _dispatching(name: str, model_attr: str, onnx_fn: Callable[[argparse.Namespace], int],
                 extra_args: Callable[[argparse.ArgumentParser], None], relax: tuple = ()) -> None:
    """Command ``name`` runs ``onnx_fn`` when its model argument is a .onnx file, else what it did."""
    help_text, add_args, fn = COMMANDS[name]

    def add_arguments(p: argparse.ArgumentParser) -> None:
        add_args(p)
        extra_args(p)
        _relax(p, *relax)

    def run(args: argparse.Namespace) -> int:
        if is_onnx(getattr(args, model_attr, None)):
            return onnx_fn(args)
        for flag in relax:
            if getattr(args, flag.lstrip("-").replace("-", "_"), None) in (None, ""):
                print(f"cgvm {name}: error: the following arguments are required: {flag}", file=sys.stderr)
                return 2
        return fn(args)

    COMMANDS[name] = (f"{help_text}; or an .onnx model", add_arguments, run)


def register() -> None:
    """Hook .onnx models into the Caffe frontend's run, time and draw (once)."""
    if getattr(register, "done", False):
        return
    register.done = True
    if "run" in COMMANDS:
        _dispatching("run", "model", _onnx_run, _run_args, relax=("--weights",))
    if "time" in COMMANDS:
        _dispatching("time", "model", _onnx_time, lambda p: None)
    if "draw" in COMMANDS:
        _dispatching("draw", "model", _onnx_draw, lambda p: None)
