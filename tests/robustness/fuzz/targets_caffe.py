"""Fuzz targets for the Caffe frontend's loaders and the CLI's inputs (see target.py for the interface).

Each target writes its own small valid seed files; what a load changes (a net's weights, a
solver's iteration, histories, random and data state, the whole workspace) is fingerprinted
before and compared after a failure, which is then a PartialLoad. After a load that succeeds the
target is put back as it was, so every case starts from the same state.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import os
import struct
import zlib
from pathlib import Path
from typing import Any, Callable, Dict, List

import numpy as np

from fuzz.target import PartialLoad, Target

SMALL_NET = """name: "small"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 1 dim: 8 dim: 8 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "pool1" top: "pool1" }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "prob" type: "Softmax" bottom: "ip1" top: "prob" }
"""

TRAIN_NET = """name: "train"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 6 } shape { dim: 4 } data_filler { type: "gaussian" std: 1 }
                     data_filler { type: "constant" value: 1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1" inner_product_param { num_output: 5 weight_filler { type: "msra" } } }
layer { name: "bn" type: "BatchNorm" bottom: "ip1" top: "ip1" }
layer { name: "drop" type: "Dropout" bottom: "ip1" top: "ip1" dropout_param { dropout_ratio: 0.3 } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 3 weight_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip2" bottom: "label" top: "acc" include { phase: TEST } }
"""

LEGACY_NET = """name: "legacy"
input: "data"
input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 3
layers { name: "ip" type: INNER_PRODUCT bottom: "data" top: "ip" blobs_lr: 1 blobs_lr: 2
  inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layers { name: "relu" type: RELU bottom: "ip" top: "ip" }
"""

RECURRENT_NET = """name: "rnn"
layer { name: "x" type: "Input" top: "x" top: "cont" input_param { shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 } } }
layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
  recurrent_param { num_output: 5 weight_filler { type: "uniform" min: -0.1 max: 0.1 } } }
layer { name: "eltwise" type: "Eltwise" bottom: "h" bottom: "h" top: "sum" eltwise_param { operation: SUM } }
"""


ZOO_NET = """name: "zoo"
layer { name: "data" type: "Input" top: "data" top: "ids" input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } shape { dim: 2 dim: 3 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 4 kernel_size: 3 pad: 1 stride: 1 group: 1 weight_filler { type: "msra" } bias_term: true } }
layer { name: "deconv" type: "Deconvolution" bottom: "conv" top: "deconv" convolution_param { num_output: 2 kernel_size: 2 stride: 2 weight_filler { type: "bilinear" } } }
layer { name: "pool" type: "Pooling" bottom: "deconv" top: "pool" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "lrn" type: "LRN" bottom: "pool" top: "lrn" lrn_param { local_size: 3 alpha: 0.0001 beta: 0.75 } }
layer { name: "bn" type: "BatchNorm" bottom: "lrn" top: "bn" }
layer { name: "scale" type: "Scale" bottom: "bn" top: "scale" scale_param { bias_term: true } }
layer { name: "prelu" type: "PReLU" bottom: "scale" top: "prelu" }
layer { name: "elu" type: "ELU" bottom: "prelu" top: "elu" elu_param { alpha: 0.5 } }
layer { name: "power" type: "Power" bottom: "elu" top: "power" power_param { power: 2 scale: 0.5 shift: 1 } }
layer { name: "prod" type: "Eltwise" bottom: "power" bottom: "elu" top: "prod" eltwise_param { operation: PROD } }
layer { name: "concat" type: "Concat" bottom: "prod" bottom: "power" top: "concat" concat_param { axis: 1 } }
layer { name: "slice" type: "Slice" bottom: "concat" top: "s1" top: "s2" slice_param { axis: 1 slice_point: 1 } }
layer { name: "spp" type: "SPP" bottom: "s2" top: "spp" spp_param { pyramid_height: 2 } }
layer { name: "flat" type: "Flatten" bottom: "s1" top: "flat" }
layer { name: "reshape" type: "Reshape" bottom: "flat" top: "reshape" reshape_param { shape { dim: 0 dim: -1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "reshape" top: "ip" inner_product_param { num_output: 5 weight_filler { type: "xavier" variance_norm: AVERAGE } } }
layer { name: "embed" type: "Embed" bottom: "ids" top: "embed" embed_param { num_output: 3 input_dim: 4 weight_filler { type: "uniform" min: -1 max: 1 } } }
layer { name: "tile" type: "Tile" bottom: "ip" top: "tile" tile_param { axis: 1 tiles: 2 } }
layer { name: "red" type: "Reduction" bottom: "tile" top: "red" reduction_param { operation: SUMSQ axis: 1 } }
layer { name: "sm" type: "Softmax" bottom: "tile" top: "sm" }
layer { name: "argmax" type: "ArgMax" bottom: "sm" top: "argmax" argmax_param { top_k: 2 } }
layer { name: "mvn" type: "MVN" bottom: "spp" top: "mvn" }
layer { name: "sig" type: "Sigmoid" bottom: "mvn" top: "sig" }
layer { name: "im2col" type: "Im2col" bottom: "data" top: "cols" convolution_param { kernel_size: 2 stride: 2 } }
layer { name: "crop" type: "Crop" bottom: "deconv" bottom: "conv" top: "crop" crop_param { axis: 2 offset: 1 } }
layer { name: "silence" type: "Silence" bottom: "embed" }
"""


def _solver_text(net_line: str, kind: str = "SGD", extra: str = "", policy: str = 'lr_policy: "step"\nstepsize: 1') -> str:
    return (f'{net_line}\nbase_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\n{policy}\n'
            f'gamma: 0.5\nmax_iter: 4\ndisplay: 1\ntype: "{kind}"\nrandom_seed: 3\n{extra}')


# --------------------------------------------------------------------------- fingerprints

def _digest(arrays: Dict[str, Any]) -> str:
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(np.asarray(arrays[name]))
        h.update(name.encode() + str(a.shape).encode() + str(a.dtype).encode() + a.tobytes())
    return h.hexdigest()


def _workspace_arrays(ws) -> Dict[str, np.ndarray]:
    return {name: np.array(ws[name], copy=True) for name in list(ws.keys())}


def _solver_state(solver) -> Dict[str, Any]:
    nets = [solver.net] + solver.test_nets
    return {
        "iter": (solver.iter, solver.current_step),
        "workspace": _workspace_arrays(solver.workspace),
        "rng": [repr(net._rng.bit_generator.state) for net in nets],
        "data": [repr({info.name: info.data.get_state() for info in net.layer_infos
                       if info.data is not None and hasattr(info.data, "get_state")}) for net in nets],
    }


def _solver_fingerprint(solver) -> str:
    state = _solver_state(solver)
    return repr((state["iter"], _digest(state["workspace"]), state["rng"], state["data"]))


def _put_back_solver(solver, state: Dict[str, Any]) -> None:
    solver.iter, solver.current_step = state["iter"]
    ws = solver.workspace
    for name, array in state["workspace"].items():
        ws.set(name, array.copy())


class _Lazy:
    """Something built once per worker process (a net, a solver), on first use."""

    def __init__(self, make: Callable[[], Any]):
        self.make, self.value = make, None

    def __call__(self) -> Any:
        if self.value is None:
            self.value = self.make()
        return self.value


def _guarded(load: Callable[[], None], fingerprint: Callable[[], str], put_back: Callable[[], None]) -> None:
    before = fingerprint()
    try:
        load()
    except BaseException as exc:
        if fingerprint() != before:
            put_back()
            raise PartialLoad(f"changed the target, then failed: {type(exc).__name__}: {exc}") from exc
        raise
    put_back()


# --------------------------------------------------------------------------- prototxt -> Net

def _prototxt_target() -> Target:
    def seeds(folder: Path) -> List[bytes]:
        return [SMALL_NET.encode(), TRAIN_NET.encode(), LEGACY_NET.encode(), RECURRENT_NET.encode(), ZOO_NET.encode()]

    def load(path: Path) -> None:
        from cgvm.frontends.caffe.pycaffe import TEST, Net

        net = Net(str(path), TEST)
        net.forward()

    return Target("prototxt -> caffe.Net (+ forward)", ".prototxt", seeds, load)


# --------------------------------------------------------------------------- caffemodel -> copy_from

def _weights_target(hdf5: bool) -> Target:
    files: Dict[str, str] = {}

    def seeds(folder: Path) -> List[bytes]:
        from cgvm.frontends.caffe import weights
        from cgvm.frontends.caffe.pycaffe import TEST, Net

        (folder / "small.prototxt").write_text(SMALL_NET)
        files["net"] = str(folder / "small.prototxt")
        out = []
        for seed in (11, 12):
            net = Net(files["net"], TEST, seed=seed)
            path = folder / f"w{seed}.caffemodel{'.h5' if hdf5 else ''}"
            (weights.save_hdf5 if hdf5 else weights.save)(net, str(path))
            files[f"w{seed}"] = str(path)
            out.append(path.read_bytes())
        return out

    def make():
        from cgvm.frontends.caffe.pycaffe import TEST, Net

        net = Net(files["net"], TEST, seed=1)
        return net, _workspace_arrays(net.workspace)

    lazy = _Lazy(make)

    def load(path: Path) -> None:
        net, baseline = lazy()

        def put_back() -> None:
            for name, array in baseline.items():
                net.workspace.set(name, array.copy())

        # a comma list: a good file first, so a failure on the mutated one must undo it
        _guarded(lambda: net.copy_from(f"{files['w11']},{path}"),
                 lambda: _digest(_workspace_arrays(net.workspace)), put_back)

    suffix = ".caffemodel.h5" if hdf5 else ".caffemodel"
    return Target(f"caffemodel{'.h5' if hdf5 else ''} -> Net.copy_from (comma list)", suffix, seeds, load)


# --------------------------------------------------------------------------- binaryproto

def _binaryproto_target() -> Target:
    def seeds(folder: Path) -> List[bytes]:
        from cgvm.frontends.caffe import caffe_pb2
        from cgvm.frontends.caffe.io import array_to_blobproto

        mean = array_to_blobproto(np.arange(48, dtype=np.float32).reshape(1, 3, 4, 4))
        legacy = caffe_pb2.BlobProto(num=1, channels=1, height=2, width=3, data=[1, 2, 3, 4, 5, 6])
        double = caffe_pb2.BlobProto(double_data=[0.5, 1.5])
        double.shape.dim.extend([2])
        return [b.SerializeToString() for b in (mean, legacy, double)]

    def load(path: Path) -> None:
        from cgvm.frontends.caffe.io import blobproto_to_array
        from cgvm.frontends.caffe.prototxt import read_blobproto

        blobproto_to_array(read_blobproto(str(path)))

    return Target("binaryproto mean -> read_blobproto", ".binaryproto", seeds, load)


# --------------------------------------------------------------------------- solver prototxt

def _solver_target() -> Target:
    def seeds(folder: Path) -> List[bytes]:
        (folder / "train.prototxt").write_text(TRAIN_NET)
        inline = "net_param { " + TRAIN_NET.replace('name: "train"\n', "") + " }"
        return [_solver_text(f'net: "{folder / "train.prototxt"}"').encode(),
                _solver_text(inline, "Adam", 'test_iter: 1\ntest_interval: 2\nsnapshot: 2\nsnapshot_prefix: "snap"').encode(),
                _solver_text(f'net: "{folder / "train.prototxt"}"', "Nesterov", 'iter_size: 2\nclip_gradients: 1\n',
                             'lr_policy: "multistep"\nstepvalue: 1\nstepvalue: 3').encode()]

    def load(path: Path) -> None:
        from cgvm.frontends.caffe.solver import get_solver

        solver = get_solver(str(path), log=False)
        # the loader is under test, not a request for 10**12 test batches
        solver.param.test_iter[:] = [min(t, 2) for t in solver.param.test_iter]
        solver.param.iter_size = max(1, min(solver.param.iter_size, 2))
        solver.step(2)

    return Target("solver prototxt -> get_solver + 2 steps", ".prototxt", seeds, load)


# --------------------------------------------------------------------------- solverstate -> restore

def _solverstate_target(kind: str) -> Target:
    """kind: "binaryproto", "hdf5", or "runstate" (the JSON beside a binaryproto state)."""
    files: Dict[str, str] = {}

    def seeds(folder: Path) -> List[bytes]:
        from cgvm.frontends.caffe.solver import get_solver

        (folder / "train.prototxt").write_text(TRAIN_NET)
        fmt = "snapshot_format: HDF5\n" if kind == "hdf5" else ""
        solver_file = folder / "solver.prototxt"
        solver_file.write_text(_solver_text(f'net: "{folder / "train.prototxt"}"', "Adam",
                                            f'snapshot_prefix: "{folder / "snap"}"\n{fmt}'))
        files["solver"] = str(solver_file)
        solver = get_solver(str(solver_file), log=False)
        solver.step(2)
        model, state = solver.snapshot()
        files["state"] = state
        if kind == "runstate":
            return [Path(state + ".cgvm-run.json").read_bytes()]
        return [Path(state).read_bytes()]

    def make():
        from cgvm.frontends.caffe.solver import get_solver

        solver = get_solver(files["solver"], log=False)
        return solver, _solver_state(solver)

    lazy = _Lazy(make)

    def load(path: Path) -> None:
        solver, baseline = lazy()
        target = str(path)
        if kind == "runstate":   # the mutated JSON beside a good state
            target = str(path)[:-len(".cgvm-run.json")]
            Path(target).write_bytes(Path(files["state"]).read_bytes())
        _guarded(lambda: solver.restore(target), lambda: _solver_fingerprint(solver),
                 lambda: _put_back_solver(solver, baseline))

    suffix = {"binaryproto": ".solverstate", "hdf5": ".solverstate.h5", "runstate": ".solverstate.cgvm-run.json"}[kind]
    name = {"binaryproto": "solverstate -> restore", "hdf5": "solverstate.h5 -> restore",
            "runstate": "solverstate run-state JSON -> restore"}[kind]
    return Target(name, suffix, seeds, load)


# --------------------------------------------------------------------------- the CLI's inputs

_PNG = b"\x89PNG\r\n\x1a\n"
_NPY = b"\x93NUMPY"


def _png(width: int, height: int, grey: bytes) -> bytes:
    def chunk(tag: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", zlib.crc32(tag + body) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + grey[y * width:(y + 1) * width] for y in range(height))
    return (_PNG + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def _cli_target() -> Target:
    """One target over the CLI's file inputs; the kind of input is taken from the file's first bytes."""
    files: Dict[str, str] = {}

    def seeds(folder: Path) -> List[bytes]:
        from cgvm.frontends.caffe import weights
        from cgvm.frontends.caffe.io import array_to_blobproto
        from cgvm.frontends.caffe.pycaffe import TEST, Net

        deploy = SMALL_NET.replace("dim: 2 dim: 1", "dim: 1 dim: 1")
        (folder / "deploy.prototxt").write_text(deploy)
        (folder / "train.prototxt").write_text(TRAIN_NET)
        files["deploy"], files["train"] = str(folder / "deploy.prototxt"), str(folder / "train.prototxt")
        files["png"] = str(folder / "seed.png")
        Path(files["png"]).write_bytes(_png(8, 8, bytes(range(64))))
        net = Net(files["deploy"], TEST, seed=5)
        files["weights"] = str(folder / "deploy.caffemodel")
        weights.save(net, files["weights"])
        train = Net(files["train"], TEST, seed=5)
        files["train_weights"] = str(folder / "train.caffemodel")
        weights.save(train, files["train_weights"])
        npy = io.BytesIO()
        np.save(npy, np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8))
        npy3 = io.BytesIO()
        np.save(npy3, np.zeros((1, 8, 8), np.float32))
        mean = array_to_blobproto(np.full((1, 1, 8, 8), 0.5, np.float32)).SerializeToString()
        return [_png(8, 8, bytes(range(0, 256, 4))), npy.getvalue(), npy3.getvalue(), mean,
                b"zero\none\ntwo\nthree\n", deploy.encode(), TRAIN_NET.encode(), TRAIN_NET.encode() + b"\n",
                ZOO_NET.encode()]

    def load(path: Path) -> None:
        from cgvm import cli
        from cgvm.errors import CgvmError

        data = path.read_bytes()
        head = data[:16]
        if head.startswith(_PNG[:4]):
            argv = ["run", files["deploy"], "--weights", files["weights"], "--input", _renamed(path, ".png")]
        elif head.startswith(_NPY[:4]):
            argv = ["run", files["deploy"], "--weights", files["weights"], "--input", _renamed(path, ".npy")]
        elif b"layer" in data[:2000] or b"name:" in head:
            model = _renamed(path, ".prototxt")
            if b"DummyData" not in data:
                argv = ["info", model, "--memory"]
            elif len(data) % 2:
                argv = ["test", "--model", model, "--weights", files["train_weights"], "--iterations", "1"]
            else:
                argv = ["time", "--model", model, "--iterations", "1", "--no-progress"]
        elif b"\n" in data[:200] and not head.startswith(b"\x0a"):
            argv = ["run", files["deploy"], "--weights", files["weights"], "--input", files["png"],
                    "--labels", str(path)]
        else:
            argv = ["run", files["deploy"], "--weights", files["weights"], "--input", files["png"],
                    "--mean-file", str(path)]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(argv)
        if code:
            lines = err.getvalue().strip().splitlines()
            raise CgvmError(f"exit {code}: {lines[-1] if lines else '(no message)'}")

    return Target("CLI run / test / time / info inputs", ".input", seeds, load)


def _renamed(path: Path, suffix: str) -> str:
    new = path.with_suffix(suffix)
    if new != path:
        os.replace(path, new)
    return str(new)


def targets() -> List[Target]:
    """The Caffe loaders and the CLI's inputs."""
    return [_prototxt_target(), _weights_target(False), _weights_target(True), _binaryproto_target(),
            _solver_target(), _solverstate_target("binaryproto"), _solverstate_target("hdf5"),
            _solverstate_target("runstate"), _cli_target()]
