"""The Caffe commands of the ``cgvm`` command line: train, test, time, run, draw, data.

They take Caffe's flags (``--solver --model --weights --snapshot --iterations --phase --level
--stage --gpu``) and print what the ``caffe`` tool prints (its log lines go to stdout here).
``--gpu`` selects the CuPy backend, with a clear error where CuPy or a GPU is missing; Python
layers run only with ``--allow-python-layers``; Ctrl-C stops training with a snapshot. Long
runs show a progress bar when tqdm is installed and the output is a terminal.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from typing import Any, Iterator, List, Optional

import numpy as np

from cgvm.backend import host_array
from cgvm.commands import UsageError, command, refuse_weights_file
from cgvm.frontends.caffe.cli_inputs import int_list, load_npy, read_labels
from cgvm.errors import BackendUnavailable, CgvmError

# --------------------------------------------------------------------------- shared flags


def _net_flags(p: argparse.ArgumentParser, phase_default: Optional[str] = None) -> None:
    p.add_argument("--phase", default=phase_default, choices=["TRAIN", "TEST"], help="net phase")
    p.add_argument("--level", type=int, default=0, help="NetState level")
    p.add_argument("--stage", default="", help="comma-separated NetState stages")
    _runtime_flags(p)


def _runtime_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", nargs="?", const="0", default=None,
                   help="run on the GPU through CuPy (device id, default 0)")
    p.add_argument("--allow-python-layers", action="store_true",
                   help="run the Python code of `type: \"Python\"` layers")
    p.add_argument("--threads", type=int, default=0,
                   help="BLAS threads (default: $CGVM_NUM_THREADS, else the cores not already busy)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _backend(args: argparse.Namespace) -> str:
    """"numpy", or "cupy" for --gpu or CGVM_BACKEND=cupy (an error that says why when it cannot run)."""
    if args.gpu is None and os.environ.get("CGVM_BACKEND", "").strip().lower() in ("cupy", "gpu", "cuda"):
        args.gpu = "0"
    if args.gpu is None:
        return "numpy"
    from cgvm.backend import get_backend

    try:
        ids = [int(d) for d in str(args.gpu).split(",") if d.strip() not in ("", "all")] or [0]
    except ValueError:
        raise CgvmError(f"--gpu takes a device id or a comma-separated list of ids (0, 1, ...), "
                        f"got {args.gpu!r}") from None
    try:
        get_backend("cupy")
        from cgvm.backend.cupy import use_device

        if len(ids) > 1:
            print(f"cgvm: multi-GPU training is not supported; using GPU {ids[0]}", file=sys.stderr)
        use_device(ids[0], "--gpu")
    except BackendUnavailable as exc:
        raise CgvmError(f"--gpu needs the CuPy backend: {exc}") from exc
    except CgvmError:
        raise
    except Exception as exc:  # CuPy present without a working driver/device
        from cgvm.backend.cupy import INSTALL_HINT

        raise CgvmError(f"--gpu needs CuPy and a CUDA device ({type(exc).__name__}: {exc}); "
                        f"{INSTALL_HINT}, or drop --gpu") from exc
    from cgvm.frontends.caffe import pycaffe

    pycaffe._mode["backend"] = "cupy"
    return "cupy"


def _stages(args: argparse.Namespace) -> List[str]:
    return [s for s in args.stage.split(",") if s]


@contextlib.contextmanager
def _threads(args: argparse.Namespace) -> Iterator[None]:
    """--threads N sizes the VM's BLAS pool (else the VM picks the cores not already busy)."""
    if args.threads:
        from cgvm.backend.threads import set_num_threads

        set_num_threads(args.threads)
    yield


class _Progress:
    """A tqdm bar (when installed and stderr is a terminal) that log lines print above."""

    def __init__(self, total: int, enabled: bool, initial: int = 0):
        self.bar = None
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, initial=initial, unit="iter", dynamic_ncols=True, leave=False)

    def write(self, text: str) -> None:
        if self.bar is None:
            sys.stdout.write(text)
        elif text.strip():
            self.bar.write(text.rstrip("\n"))

    def flush(self) -> None:
        sys.stdout.flush()

    def update(self, done: int, loss: float) -> None:
        if self.bar is not None:
            self.bar.n = done
            self.bar.set_postfix(loss=f"{loss:.4g}", refresh=False)
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# --------------------------------------------------------------------------- train


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--solver", required=True, help="solver .prototxt")
    p.add_argument("--weights", default="", help="comma-separated .caffemodel files to finetune from")
    p.add_argument("--snapshot", default="", help=".solverstate to resume from")
    p.add_argument("--level", type=int, default=0, help="NetState level")
    p.add_argument("--stage", default="", help="comma-separated NetState stages")
    p.add_argument("--tensorboard", default="", metavar="DIR",
                   help="log losses, learning rate, test outputs and the graph to TensorBoard runs in DIR")
    _runtime_flags(p)


@command("train", "train or finetune a model from a solver prototxt (as `caffe train`)", _train_args)
def _train(args: argparse.Namespace) -> int:
    from cgvm.frontends.caffe.prototxt import read_solver
    from cgvm.frontends.caffe.solver import SOLVERS

    if args.weights and args.snapshot:
        raise CgvmError("give --weights or --snapshot, not both (a snapshot carries its own weights)")
    refuse_weights_file(args.solver, "--solver a solver .prototxt")
    if not os.path.isfile(args.solver):
        raise CgvmError(f"solver file {args.solver!r} not found")
    backend = _backend(args)
    param = read_solver(args.solver)
    cls = SOLVERS.get(param.type)
    if cls is None:
        raise CgvmError(f"{args.solver}: unknown solver type {param.type!r}; known: {', '.join(SOLVERS)}")
    weights = [w for w in args.weights.split(",") if w] if args.weights else None
    if args.snapshot:
        weights = []   # as Caffe: resuming ignores the solver file's weights
    from cgvm.frontends.caffe.solver_parallel import join_mpi_run

    root = join_mpi_run()   # under mpiexec/srun: one solver per rank, gradients averaged (docs/distributed.md)
    progress = _Progress(param.max_iter, not args.no_progress and root)
    start = time.perf_counter()
    with _threads(args):
        solver = cls(args.solver, param=param, backend=backend, log=progress, weights=weights,
                     allow_python_layers=args.allow_python_layers or None, level=args.level,
                     stages=tuple(_stages(args)))
        solver.on_iteration = progress.update
        if args.snapshot:
            solver._log(f"Restoring previous solver status from {args.snapshot}")
            solver.restore(args.snapshot)
            if solver.iter >= param.max_iter:
                progress.close()
                print(f"Nothing to train: the snapshot {args.snapshot} is at iteration {solver.iter} and the "
                      f"solver's max_iter is {param.max_iter}; raise max_iter in {args.solver} to train on. "
                      "The snapshot was left as it is.")
                return 0
        # under MPI rank 0 alone logs, as it alone displays and tests
        board = solver.log_to_tensorboard(args.tensorboard) if args.tensorboard and root else None
        try:
            solver.solve(None)
        except KeyboardInterrupt:   # Caffe's default SIGINT effect: stop, keeping a snapshot
            progress.close()
            if param.snapshot_after_train:
                solver.snapshot()
            print("Optimization stopped early.")
        finally:
            progress.close()
            if board is not None:
                board.close()
                print(f"TensorBoard logs in {args.tensorboard} (cgvm board {args.tensorboard})")
    elapsed = time.perf_counter() - start
    if not root:
        return 0
    print(f"Trained {solver.iter} iterations in {elapsed:.1f} s ({solver.iter / max(elapsed, 1e-9):.1f} iter/s).")
    finals = {}
    for iteration, index, scores in solver.test_scores:
        if iteration == solver.iter:
            finals[index] = scores
    for index, scores in sorted(finals.items()):
        shown = ", ".join(f"{k} = {v:.4f}" for k, v in scores.items() if isinstance(v, float))
        print(f"Final test net #{index}: {shown}")
    return 0


# --------------------------------------------------------------------------- test


def _test_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="net .prototxt")
    p.add_argument("--weights", required=True, help="comma-separated .caffemodel files")
    p.add_argument("--iterations", type=int, default=50, help="number of batches")
    _net_flags(p, "TEST")


@command("test", "score a model: run --iterations batches and average its outputs (as `caffe test`)", _test_args)
def _test(args: argparse.Namespace) -> int:
    from cgvm.frontends.caffe.pycaffe import Net

    refuse_weights_file(args.model, "--model a net .prototxt")
    backend = _backend(args)
    with _threads(args):
        net = Net(args.model, phase=args.phase or "TEST", level=args.level, stages=_stages(args), backend=backend,
                  allow_python_layers=args.allow_python_layers or None)
        net.copy_from(args.weights)   # a comma list: all or nothing
        last = len(net.layer_infos) - 1
        names = net.outputs
        sums = {}
        total_loss = 0.0
        print(f"Running for {args.iterations} iterations.")
        for i in range(args.iterations):
            loss = net._forward(0, last)
            total_loss += loss
            k = 0
            for name in names:
                values = host_array(net.blobs[name].data).astype(np.float64)
                sums[name] = sums[name] + values if name in sums else values.copy()
                for v in values.ravel():
                    print(f"Batch {i}, {name} = {v:.6g}")
                    k += 1
    print(f"Loss: {total_loss / max(args.iterations, 1):.6g}")
    for name in names:
        weight = net.blob_loss_weights.get(name, 0.0)
        for v in (sums.get(name, np.zeros(1)) / max(args.iterations, 1)).ravel():
            extra = f" (* {weight:g} = {weight * v:.6g} loss)" if weight else ""
            print(f"{name} = {v:.6g}{extra}")
    return 0


# --------------------------------------------------------------------------- time


def _time_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="net .prototxt")
    p.add_argument("--iterations", type=int, default=50, help="benchmark iterations")
    p.add_argument("--weights", default="", help="optional .caffemodel")
    p.add_argument("--tensorboard", default="", metavar="DIR",
                   help="write per-op times of the whole-net program to DIR (TensorBoard + Chrome trace JSON)")
    _net_flags(p, "TRAIN")


@command("time", "benchmark a model layer by layer, forward and backward (as `caffe time`)", _time_args)
def _time(args: argparse.Namespace) -> int:
    from cgvm.frontends.caffe.pycaffe import Net

    refuse_weights_file(args.model, "--model a net .prototxt")
    backend = _backend(args)
    with _threads(args):
        net = Net(args.model, phase=args.phase or "TRAIN", level=args.level, stages=_stages(args), backend=backend,
                  allow_python_layers=args.allow_python_layers or None)
        if args.weights:
            net.copy_from(args.weights)
        infos = net.layer_infos
        last = len(infos) - 1
        sync = _synchronizer(backend)
        print(f"Initial loss: {net._forward(0, last):.6g}")
        net._backward(last, 0)
        for i in range(len(infos)):       # compile every single-layer program before timing
            net._forward(i, i)
        for i in reversed(range(len(infos))):
            net._backward(i, i)
        print("*** Benchmark begins ***")
        print(f"Testing for {args.iterations} iterations.")
        forward_us = [0.0] * len(infos)
        backward_us = [0.0] * len(infos)
        total_forward = total_backward = 0.0
        bench_start = time.perf_counter()
        progress = _Progress(args.iterations, not args.no_progress)
        for it in range(args.iterations):
            iter_start = time.perf_counter()
            for i in range(len(infos)):
                t = time.perf_counter()
                net._forward(i, i)
                sync()
                forward_us[i] += (time.perf_counter() - t) * 1e6
            mid = time.perf_counter()
            for i in reversed(range(len(infos))):
                t = time.perf_counter()
                net._backward(i, i)
                sync()
                backward_us[i] += (time.perf_counter() - t) * 1e6
            end = time.perf_counter()
            total_forward += (mid - iter_start) * 1e6
            total_backward += (end - mid) * 1e6
            progress.write(f"Iteration: {it + 1} forward-backward time: {(end - iter_start) * 1e3:.4g} ms.\n")
            progress.update(it + 1, 0.0)
        progress.close()
        n = max(args.iterations, 1)
        print("Average time per layer: ")
        for i, info in enumerate(infos):
            print(f"{info.name:>10}\tforward: {forward_us[i] / 1000 / n:.5g} ms.")
            print(f"{info.name:>10}\tbackward: {backward_us[i] / 1000 / n:.5g} ms.")
        print(f"Average Forward pass: {total_forward / 1000 / n:.5g} ms.")
        print(f"Average Backward pass: {total_backward / 1000 / n:.5g} ms.")
        print(f"Average Forward-Backward: {(total_forward + total_backward) / 1000 / n:.5g} ms.")
        print(f"Total Time: {(time.perf_counter() - bench_start) * 1000:.5g} ms.")
        _time_whole_net(net, n, sync)
        if args.tensorboard:
            from cgvm.frontends.caffe.board import write_time_profile

            layer_ms = {info.name: (forward_us[i] / 1000 / n, backward_us[i] / 1000 / n) for i, info in enumerate(infos)}
            _, trace = write_time_profile(net, args.tensorboard, n, layer_ms)
            print(f"Per-op profile written to {args.tensorboard} (TensorBoard graph dashboard, tag 'profile') "
                  f"and {trace} (Chrome trace JSON: chrome://tracing or ui.perfetto.dev).")
        print("*** Benchmark ends ***")
    return 0


def _time_whole_net(net: Any, n: int, sync) -> None:
    """How cgvm really runs the net: forward and backward compiled into one program (as a solver step)."""
    from cgvm.compiled_function import Function

    try:
        tg = net.training_graph()
    except CgvmError:   # no loss: time the forward program alone
        last = len(net.layer_infos) - 1
        net._forward(0, last)
        start = time.perf_counter()
        for _ in range(n):
            net._forward(0, last)
        sync()
        print(f"Whole-net forward (one program): {(time.perf_counter() - start) * 1000 / n:.5g} ms.")
        return
    step = Function([], [tg.loss] + list(tg.grads.values()), workspace=net.workspace, name="time_step")
    net.prepare_step()
    step()
    start = time.perf_counter()
    for _ in range(n):
        net.prepare_step()
        step()
    sync()
    print(f"Whole-net forward-backward (one program): {(time.perf_counter() - start) * 1000 / n:.5g} ms.")


def _synchronizer(backend: str):
    if backend != "cupy":
        return lambda: None
    import cupy

    return lambda: cupy.cuda.Device().synchronize()


# --------------------------------------------------------------------------- run


def _run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="deploy .prototxt (an Input layer)")
    p.add_argument("--weights", required=True, help=".caffemodel")
    p.add_argument("--input", required=True, action="append",
                   help="image (.jpg, .png, ...) or .npy; repeat for several")
    p.add_argument("--top", type=int, default=5, help="how many classes to print")
    p.add_argument("--labels", default="", help="text file: one class name per line")
    p.add_argument("--raw-scale", type=float, default=255.0, help="image values [0, 1] are multiplied by this")
    p.add_argument("--input-scale", type=float, default=1.0, help="multiplier after mean subtraction")
    p.add_argument("--mean-value", default="", help="comma-separated per-channel mean (after raw scale)")
    p.add_argument("--mean-file", default="", help=".binaryproto mean image")
    p.add_argument("--channel-swap", default="2,1,0", help="for 3-channel nets: RGB -> BGR as Caffe models expect")
    _runtime_flags(p)


@command("run", "classify images with a deploy net and print the top classes", _run_args)
def _run(args: argparse.Namespace) -> int:
    with _threads(args):
        return _classify(args)


def _classify(args: argparse.Namespace) -> int:
    from cgvm.frontends.caffe import io as cio
    from cgvm.frontends.caffe.pycaffe import Net

    refuse_weights_file(args.model, "a deploy .prototxt")
    backend = _backend(args)
    net = Net(args.model, phase="TEST", weights=args.weights, backend=backend,
              allow_python_layers=args.allow_python_layers or None)
    if not net.inputs:
        raise CgvmError(f"{args.model}: the net has no Input layer to feed (use a deploy prototxt)")
    name = net.inputs[0]
    shape = tuple(net.blobs[name].shape)
    if len(shape) != 4:
        raise CgvmError(f"{args.model}: input {name!r} has shape {shape}; `cgvm run` feeds images (N, C, H, W)")
    transformer = cio.Transformer({name: shape})
    transformer.set_transpose(name, (2, 0, 1))
    transformer.set_raw_scale(name, args.raw_scale)
    transformer.set_input_scale(name, args.input_scale)
    if shape[1] == 3 and args.channel_swap:
        transformer.set_channel_swap(name, int_list(args.channel_swap, "--channel-swap"))
    if args.mean_file:
        from cgvm.frontends.caffe.prototxt import read_blobproto

        mean = cio.blobproto_to_array(read_blobproto(args.mean_file))
        try:
            transformer.set_mean(name, mean.reshape(mean.shape[-3:]))
        except ValueError as exc:
            raise CgvmError(f"{args.mean_file}: a mean of shape {mean.shape} does not fit the input {shape}: "
                            f"{exc}") from exc
    elif args.mean_value:
        try:
            values = [float(v) for v in args.mean_value.split(",")]
            transformer.set_mean(name, np.array(values * (shape[1] if len(values) == 1 else 1), np.float32))
        except ValueError as exc:
            raise UsageError(f"--mean-value {args.mean_value!r}: give one number, or one per channel "
                             f"({shape[1]}): {exc}") from exc
    labels = read_labels(args.labels)
    batch = np.stack([_load_input(path, shape, transformer, name) for path in args.input])
    net.blobs[name].reshape(len(batch), *shape[1:])
    net.reshape()
    out = net.forward(**{name: batch})
    probs = host_array(out[net.outputs[0]]).reshape(len(batch), -1)
    for path, row in zip(args.input, probs):
        print(f"{path}: {net.outputs[0]}")
        for k in np.argsort(-row, kind="stable")[:args.top]:
            label = labels[k] if k < len(labels) else str(k)
            print(f"  {row[k]:.4f}  {label}")
    return 0


def _load_input(path: str, shape, transformer, name: str) -> np.ndarray:
    from cgvm.frontends.caffe import io as cio

    if not os.path.isfile(path):
        raise CgvmError(f"input {path!r} not found")
    if path.endswith(".npy"):
        array = load_npy(path)
        if array.shape == tuple(shape[1:]):
            return array.astype(np.float32)   # already preprocessed (C, H, W)
        if array.ndim == 2:
            array = array[:, :, None]
        if array.ndim != 3:
            raise CgvmError(f"{path}: array of shape {array.shape}; give C x H x W (preprocessed) or H x W [x K]")
        image = array.astype(np.float32)
    else:
        image = cio.load_image(path, color=shape[1] == 3)
    if image.shape[-1] != shape[1]:
        image = image.mean(axis=-1, keepdims=True) if shape[1] == 1 else np.repeat(image[:, :, :1], shape[1], -1)
    return transformer.preprocess(name, image)


# --------------------------------------------------------------------------- draw


def _draw_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="net .prototxt")
    p.add_argument("output", help="output file: .dot, .svg, .png, .pdf (all but .dot need graphviz's `dot`)")
    p.add_argument("--rankdir", default="LR", choices=["LR", "TB", "BT", "RL"])
    p.add_argument("--phase", default="ALL", choices=["TRAIN", "TEST", "ALL"])
    p.add_argument("--display-lrm", action="store_true", help="annotate layers with their lr_mult")


@command("draw", "draw a net as a graph (as python/draw_net.py)", _draw_args)
def _draw(args: argparse.Namespace) -> int:
    from cgvm.frontends.caffe import caffe_pb2, draw
    from cgvm.frontends.caffe.prototxt import read_net

    net = read_net(args.model)
    phase = None if args.phase == "ALL" else getattr(caffe_pb2, args.phase)
    draw.draw_net_to_file(net, args.output, args.rankdir, phase, args.display_lrm)
    print(f"Drawing net to {args.output}")
    return 0


# --------------------------------------------------------------------------- data


def _data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", choices=["digits"], help="digits: scikit-learn's handwritten digits, 28x28")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--channels", type=int, default=1, choices=[1, 3], help="3 replicates the grey image")
    p.add_argument("--seed", type=int, default=0, help="train/test split permutation")
    p.add_argument("--limit", type=int, default=0, help="keep only this many images per split")
    p.add_argument("--format", default="lmdb,hdf5", help="comma-separated: lmdb, hdf5")


@command("data", "write an example data set as Caffe data (LMDB and HDF5)", _data_args)
def _data(args: argparse.Namespace) -> int:
    from cgvm.frontends.caffe.digits import write_digits

    formats = tuple(f for f in args.format.split(",") if f)
    bad = [f for f in formats if f not in ("lmdb", "hdf5")]
    if bad:
        raise CgvmError(f"unknown format {bad[0]!r}; use lmdb and/or hdf5")
    counts = write_digits(args.out, seed=args.seed, channels=args.channels, formats=formats, limit=args.limit)
    print(f"Wrote {counts['train']} training and {counts['test']} test digits "
          f"({args.channels}x28x28) to {args.out} as {' and '.join(formats)}.")
    return 0
