"""The ``cgvm`` command line.

Core commands live here (compile, dis, info, bench, demo); frontends add theirs (the Caffe
frontend adds train, test, time, run, draw, data) by registering in COMMANDS.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable, Dict, List, Optional, Tuple

from .errors import CgvmError

# name -> (help, add_arguments(parser), run(args) -> exit code)
COMMANDS: Dict[str, Tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}


def command(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None]):
    def deco(fn: Callable[[argparse.Namespace], int]):
        COMMANDS[name] = (help, add_arguments, fn)
        return fn
    return deco


def load_graph_file(path: str, args: argparse.Namespace):
    """A graph from a serialized cgvm graph, or from a Caffe prototxt when that frontend is present."""
    if path.endswith(".onnx"):
        from .frontends.onnx.cli_commands import graph_from_onnx  # the ONNX frontend provides this hook

        return graph_from_onnx(path, args)
    if path.endswith((".prototxt", ".pt")):
        from .frontends.caffe import graph_from_prototxt  # the Caffe frontend provides this hook

        return graph_from_prototxt(path, phase=getattr(args, "phase", "TEST"))
    from .ir.serialize import load_graph

    return load_graph(path)


def _compile_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a serialized graph (.cgvm), a Caffe .prototxt or an .onnx model")
    p.add_argument("--print-after", default="", help="comma-separated pass names, or 'all'")
    p.add_argument("--phase", default="TEST", choices=["TRAIN", "TEST"])
    p.add_argument("--debug", action="store_true", help="verify the IR after every pass")


@command("compile", "run the compiler passes and print the IR after the chosen ones", _compile_args)
def _compile(args: argparse.Namespace) -> int:
    from .compiler import generate, run_passes

    graph = load_graph_file(args.model, args)
    shown = [s for s in args.print_after.split(",") if s]
    out = run_passes(graph, debug=args.debug, print_after=shown)
    if not shown:
        print(out)
    prog = generate(out)
    print(f"// {len(out.nodes)} nodes, {len(prog.instrs)} instructions, {prog.n_slots} slots", file=sys.stderr)
    return 0


@command("dis", "print the bytecode of a compiled model", _compile_args)
def _dis(args: argparse.Namespace) -> int:
    from .compiler import generate, run_passes
    from .vm import dis

    print(dis(generate(run_passes(load_graph_file(args.model, args), debug=args.debug))))
    return 0


def _info_args(p: argparse.ArgumentParser) -> None:
    _compile_args(p)
    p.add_argument("--memory", action="store_true", help="report peak, planned and unplanned memory")
    p.add_argument("--train", action="store_true", help="with --memory: a training step (loss and gradients)")
    p.add_argument("--recompute", default="none", choices=["none", "sqrt"],
                   help="with --memory --train: recompute activations in backward (sublinear memory)")
    p.add_argument("--shape", action="append", default=[],
                   help="NAME=D0,D1,... concrete shape of an input with unknown dimensions")


@command("info", "summarize a model: inputs, parameters, ops, and (--memory) the memory plan", _info_args)
def _info(args: argparse.Namespace) -> int:
    from collections import Counter

    from .compiler import run_passes

    loaded = load_graph_file(args.model, args)
    graph = run_passes(loaded)
    print(f"graph {graph.name}: {len(graph.inputs)} inputs, {len(graph.params)} parameters, "
          f"{len(graph.nodes)} nodes, {len(graph.outputs)} outputs")
    for v in graph.inputs:
        print(f"  input {v.name}: {v.type!r}")
    nparams = sum(p.type.size or 0 for p in graph.params)
    print(f"  parameters: {nparams} values in {len(graph.params)} tensors")
    for op, n in Counter(n.op.name for n in graph.nodes).most_common():
        print(f"  {op:<20} {n}")
    if args.memory:
        from .compiler.memory_report import format_report, memory_report

        recompute = None if args.recompute == "none" else args.recompute
        report = memory_report(loaded, dict(_parse_shape(s) for s in args.shape),
                               train=args.train, recompute=recompute)
        print("\n".join(format_report(report)))
    return 0


def _parse_shape(text: str):
    name, _, dims = text.partition("=")
    return name, tuple(int(d) for d in dims.split(","))


def _bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default=None)


@command("bench", "run the benchmark suite beside the installed peers", _bench_args)
def _bench(args: argparse.Namespace) -> int:
    try:
        from benchmarks.__main__ import main as bench_main
    except ImportError:
        raise CgvmError("the benchmarks live in the source checkout: run `python -m benchmarks` from it") from None
    return bench_main((["--quick"] if args.quick else []) + (["--only", args.only] if args.only else []))


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)


@command("demo", "train a classifier on the embedded digits data set and report test accuracy", _demo_args)
def _demo(args: argparse.Namespace) -> int:
    from .demo import train_digits

    acc = train_digits(epochs=args.epochs, seed=args.seed)
    return 0 if acc > 0 else 1


def _load_frontend_commands() -> None:
    """Frontends register their commands on import (the Caffe frontend: train, test, time, run, draw, data)."""
    from .frontends.caffe import cli_commands  # noqa: F401
    from .frontends.onnx import cli_commands as onnx_commands  # export; .onnx models for run, time, draw

    onnx_commands.register()


def build_parser() -> argparse.ArgumentParser:
    _load_frontend_commands()
    parser = argparse.ArgumentParser(prog="cgvm", description="Computational Graph Virtual Machine")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_arguments, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command][2](args)
    except CgvmError as exc:
        print(f"cgvm {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"cgvm {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    # run the importable module's main: frontends register their commands in cgvm.cli.COMMANDS,
    # which under `python -m cgvm.cli` is not this __main__ module's dict
    from cgvm.cli import main as _main

    sys.exit(_main())
