"""The ``cgvm`` command line.

Core commands live here (compile, dis, info, bench, demo); frontends add theirs (the Caffe
frontend adds train, test, time, run, draw, data) with cgvm.commands.command, which the
frontends import instead of this module.

Every command's cgvm error (and a missing or unreadable file) is printed as ``cgvm CMD: error:
...`` with exit status 2 (``cgvm --debug CMD`` adds the traceback); a wrong option or value
prints that command's usage; a closed pipe (``cgvm info ... | head``) ends quietly.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Dict, List, Optional, Tuple

from .commands import COMMANDS, UsageError, command, refuse_weights_file  # noqa: F401  (re-exported)
from .errors import CgvmError, ConfigError


def load_graph_file(path: str, args: argparse.Namespace):
    """A graph from a serialized cgvm graph, or from a Caffe prototxt when that frontend is present."""
    refuse_weights_file(path)
    if os.path.isdir(path):
        raise UsageError(f"{path} is a directory; give a model file (.prototxt, .onnx or .cgvm)")
    if path.endswith(".onnx"):
        from .frontends.onnx.cli_commands import graph_from_onnx  # the ONNX frontend provides this hook

        return graph_from_onnx(path, args)
    if path.endswith((".prototxt", ".pt")):
        from .frontends.caffe import graph_from_prototxt  # the Caffe frontend provides this hook

        return graph_from_prototxt(path, phase=getattr(args, "phase", "TEST"))
    from .ir.serialize import load_graph

    return load_graph(path)


def _pass_list(text: str) -> List[str]:
    """``--print-after``'s value: known pass names (or all), comma-separated."""
    from .compiler.passes import print_after_names

    names = [s for s in text.split(",") if s]
    try:
        print_after_names(names)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return names


def _compile_args(p: argparse.ArgumentParser) -> None:
    from .compiler import PIPELINE

    always = [q.name for q in PIPELINE if not q.option]
    asked = [f"{q.name} (compile --{q.option})" for q in PIPELINE if q.option]
    p.add_argument("model", help="a serialized graph (.cgvm), a Caffe .prototxt or an .onnx model")
    p.add_argument("--print-after", default=[], type=_pass_list, metavar="PASS[,PASS...]",
                   help="print the IR after these passes (whole after the first, then only what each "
                        f"changed): {', '.join(always)}, or all; and, when asked for, {', '.join(asked)}")
    p.add_argument("--phase", default="TEST", choices=["TRAIN", "TEST"])
    p.add_argument("--debug", action="store_true", help="verify the IR after every pass")


def _compile_command_args(p: argparse.ArgumentParser) -> None:
    _compile_args(p)
    p.add_argument("--recompute", default="none", choices=["none", "sqrt"],
                   help="run the recompute pass: a training graph's backward pass recomputes activations "
                        "(sublinear memory)")


@command("compile", "run the compiler passes and print the IR after the chosen ones", _compile_command_args)
def _compile(args: argparse.Namespace) -> int:
    from .compiler import generate, run_passes

    shown = args.print_after
    recompute = None if args.recompute == "none" else args.recompute
    if "recompute" in shown and recompute is None:
        raise UsageError("--print-after recompute: the recompute pass runs only with --recompute sqrt")
    graph = load_graph_file(args.model, args)
    out = run_passes(graph, debug=args.debug, print_after=shown, recompute=recompute)
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

    shapes = dict(_parse_shape(s) for s in args.shape)
    loaded = load_graph_file(args.model, args)
    names = [v.name for v in loaded.inputs]
    for name in shapes:
        if name not in names:
            raise UsageError(f"--shape {name}=...: the model has no input {name!r}; its inputs are "
                             f"{', '.join(names) or '(none)'}")
    if args.train and not args.memory:
        raise UsageError("--train goes with --memory (the memory of a training step)")
    if args.memory and args.train and args.model.endswith((".prototxt", ".pt")) and args.phase != "TRAIN":
        print(f"cgvm info: note: --train differentiates the net of phase {args.phase} (the default); give "
              "--phase TRAIN for the net as Caffe trains it (its TRAIN-phase layers, dropout and loss)",
              file=sys.stderr)
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
        report = memory_report(loaded, shapes, train=args.train, recompute=recompute)
        print("\n".join(format_report(report)))
    return 0


def _parse_shape(text: str) -> Tuple[str, Tuple[int, ...]]:
    """``NAME=D0,D1,...`` (each D a non-negative integer); UsageError for anything else."""
    name, sep, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not sep or not name or not shape or any(d < 0 for d in shape):
        raise UsageError(f"--shape {text!r}: write NAME=D0,D1,... with non-negative integer dimensions "
                         "(e.g. --shape data=1,3,224,224)")
    return name, shape


def _bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default=None)


def _find_benchmarks() -> Optional[str]:
    """The source checkout that holds benchmarks/: the working directory, or the one this cgvm runs from."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for root in (os.getcwd(), here):
        if os.path.isfile(os.path.join(root, "benchmarks", "__main__.py")):
            return root
    return None


@command("bench", "run the benchmark suite beside the installed peers", _bench_args)
def _bench(args: argparse.Namespace) -> int:
    root = _find_benchmarks()
    if root is None:
        raise CgvmError("the benchmarks are not part of the installed package; they live in cgvm's source "
                        "checkout: clone it, `pip install -e '.[test,interop]'` there, and run `cgvm bench` "
                        "(or `python -m benchmarks`) from its root")
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks.__main__ import main as bench_main

    return bench_main((["--quick"] if args.quick else []) + (["--only", args.only] if args.only else []))


def _export_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a Caffe .prototxt, a Keras .keras/.h5 file, or an .onnx file")
    p.add_argument("--weights", default="", help="a .caffemodel for a prototxt")
    p.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    p.add_argument("--batch", type=int, default=1, help="batch size of the example input for a Keras model")


# here, not in a frontend: it reads every frontend's files, and frontends never import each other
@command("export", "write a model as ONNX (a Caffe net with weights, a Keras model, an ONNX model)", _export_args)
def _export(args: argparse.Namespace) -> int:
    import numpy as np

    from .frontends.onnx import export, load

    path = args.model
    if not os.path.isfile(path):
        raise CgvmError(f"{path}: no such file")
    if path.endswith((".prototxt", ".pt")):
        from .frontends.caffe.pycaffe import Net

        model = export(Net(path, phase="TEST", weights=args.weights or None), args.output)
    elif path.endswith((".keras", ".h5", ".hdf5")):
        from .frontends.keras.saving import load_model

        km = load_model(path)
        shape = tuple(args.batch if d is None else d for d in km.input_shape)
        model = export(km, args.output, example=np.zeros(shape, np.float32))
    elif path.lower().endswith(".onnx"):
        model = export(load(path), args.output)
    else:
        raise UsageError(f"{path}: export reads .prototxt, .keras, .h5 or .onnx files")
    print(f"wrote {args.output}: {len(model.graph.node)} nodes, {len(model.graph.initializer)} initializers, "
          f"opset {model.opset_import[0].version}")
    return 0


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
    from .board import cli_command  # noqa: F401  (cgvm board)
    from .frontends.onnx import cli_commands as onnx_commands  # .onnx models for run, time, draw

    onnx_commands.register()


_SUBPARSERS: Dict[str, argparse.ArgumentParser] = {}


def build_parser() -> argparse.ArgumentParser:
    _load_frontend_commands()
    from . import __version__

    parser = argparse.ArgumentParser(prog="cgvm", description="Computational Graph Virtual Machine")
    parser.add_argument("--version", action="version", version=f"cgvm {__version__}")
    parser.add_argument("--debug", dest="debug_traceback", action="store_true",
                        help="print the traceback of an error (after the command: the same)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_arguments, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        if "--debug" not in p._option_string_actions:   # compile/dis/info's --debug also shows tracebacks
            p.add_argument("--debug", dest="debug_traceback", action="store_true", default=argparse.SUPPRESS,
                           help="print the traceback of an error")
        _SUBPARSERS[name] = p
    return parser


def check_backend_environment() -> None:
    """CGVM_BACKEND, when set, must name a backend that can run here (else: an error that says how)."""
    raw = os.environ.get("CGVM_BACKEND", "").strip()
    if not raw:
        return
    from .backend import get_backend
    from .errors import BackendUnavailable

    try:
        get_backend(raw)
    except BackendUnavailable as exc:
        raise ConfigError(f"CGVM_BACKEND={raw!r}: {exc}") from exc


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    sub = _SUBPARSERS[args.command]
    if extra:
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    debug = bool(getattr(args, "debug_traceback", False) or getattr(args, "debug", False) is True)
    try:
        check_backend_environment()
        code = COMMANDS[args.command][2](args)
        sys.stdout.flush()   # inside the try: a reader that closed the pipe is noticed here
        return _distributed_exit(code)
    except UsageError as exc:
        sub.error(str(exc))   # the command's usage, then the message; exits 2
    except (CgvmError, OSError) as exc:
        if isinstance(exc, BrokenPipeError):
            return _closed_pipe()
        if debug:
            traceback.print_exc()
        print(f"cgvm {args.command}: error: {_describe(exc)}", file=sys.stderr)
        return _distributed_exit(2)
    except KeyboardInterrupt:
        print(f"cgvm {args.command}: interrupted", file=sys.stderr)
        return 130
    return 2


def _describe(exc: BaseException) -> str:
    if isinstance(exc, CgvmError):
        return str(exc)
    if isinstance(exc, OSError) and exc.filename and exc.strerror:   # IsADirectoryError, PermissionError...
        return f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def _closed_pipe() -> int:
    """The reader went away (``| head``): stop quietly, and keep Python from complaining at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141


def _distributed_exit(code: int) -> int:
    """Under MPI, a rank exiting with an error aborts the others (they would wait in a collective)."""
    dist = sys.modules.get("cgvm.distributed")
    return dist.exit_code(code) if dist is not None else code


if __name__ == "__main__":
    # run the importable module's main: frontends register their commands in cgvm.cli.COMMANDS,
    # which under `python -m cgvm.cli` is not this __main__ module's dict
    from cgvm.cli import main as _main

    sys.exit(_main())
