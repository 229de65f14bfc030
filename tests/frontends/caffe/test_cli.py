"""The Caffe commands of `cgvm` (data, train, test, time, run, draw) against models/ on a few
digits, plus a short LeNet training run on the digits whose loss must drop."""
from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("lmdb")
pytest.importorskip("h5py")

from cgvm.cli import main  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
LENET = os.path.join(REPO, "models", "lenet")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A working directory holding data/digits (200 images per split), as the README's job makes it."""
    root = tmp_path_factory.mktemp("cli")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert main(["data", "digits", "--out", "data/digits", "--limit", "200"]) == 0
    finally:
        os.chdir(cwd)
    return root


@pytest.fixture
def in_workdir(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    return workdir


def small_solver(path, max_iter=6, extra=""):
    path.write_text(f'net: "{LENET}/lenet_train_test.prototxt"\ntest_iter: 2\ntest_interval: {max_iter}\n'
                    f'base_lr: 0.01\nmomentum: 0.9\nweight_decay: 0.0005\nlr_policy: "inv"\ngamma: 0.0001\n'
                    f'power: 0.75\ndisplay: 3\nmax_iter: {max_iter}\nsnapshot_prefix: "snaps/lenet"\n'
                    f'random_seed: 1\n{extra}')
    os.makedirs("snaps", exist_ok=True)
    return str(path)


def test_data_digits_writes_lmdb_hdf5_and_samples(in_workdir, capsys):
    assert main(["data", "digits", "--out", "rgb", "--limit", "10", "--channels", "3", "--format", "hdf5"]) == 0
    assert "Wrote 10 training and 10 test digits (3x28x28)" in capsys.readouterr().out
    import h5py

    with h5py.File("rgb/digits_train.h5") as f:
        assert f["data"].shape == (10, 3, 28, 28) and f["label"].shape == (10,)
        assert 0.0 <= f["data"][:].min() and f["data"][:].max() <= 1.0
    assert os.path.isdir("data/digits/digits_train_lmdb") and os.path.isdir("data/digits/digits_test_lmdb")
    assert len(os.listdir("data/digits/samples")) == 10


def test_train_test_time_run_draw(in_workdir, capsys):
    solver = small_solver(in_workdir / "solver.prototxt")
    assert main(["train", "--solver", solver, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Iteration 3 (" in out and "Train net output #0: loss = " in out and "Optimization Done." in out
    assert "Final test net #0: accuracy = " in out
    weights = "snaps/lenet_iter_6.caffemodel"
    assert os.path.isfile(weights) and os.path.isfile("snaps/lenet_iter_6.solverstate")

    assert main(["test", "--model", f"{LENET}/lenet_train_test.prototxt", "--weights", weights,
                 "--iterations", "2"]) == 0
    out = capsys.readouterr().out
    assert "Batch 1, accuracy = " in out and "Loss: " in out and "loss = " in out and "(* 1 = " in out

    assert main(["time", "--model", f"{LENET}/lenet_train_test.prototxt", "--iterations", "2",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "*** Benchmark begins ***" in out and "Testing for 2 iterations." in out
    assert "     conv1\tforward: " in out and "     conv1\tbackward: " in out
    assert "Average Forward-Backward: " in out and "*** Benchmark ends ***" in out

    sample = sorted(os.listdir("data/digits/samples"))[0]
    assert main(["run", f"{LENET}/lenet_deploy.prototxt", "--weights", weights, "--input",
                 f"data/digits/samples/{sample}", "--input-scale", "0.00390625", "--top", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(": prob") and len(lines) == 4
    assert abs(sum(float(line.split()[0]) for line in lines[1:])) <= 1.0 + 1e-3

    assert main(["draw", f"{LENET}/lenet_train_test.prototxt", "lenet.dot", "--phase", "TEST"]) == 0
    assert open("lenet.dot").read().startswith("digraph")


def test_train_resumes_from_snapshot(in_workdir, capsys):
    solver = small_solver(in_workdir / "resume.prototxt", max_iter=4, extra="snapshot: 2\n")
    assert main(["train", "--solver", solver, "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["train", "--solver", solver, "--snapshot", "snaps/lenet_iter_2.solverstate", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "Restoring previous solver status from snaps/lenet_iter_2.solverstate" in out
    assert "Trained 4 iterations" in out


def test_flag_errors(in_workdir, capsys):
    solver = small_solver(in_workdir / "bad.prototxt")
    assert main(["train", "--solver", solver, "--weights", "a.caffemodel", "--snapshot", "b.solverstate"]) == 2
    assert "give --weights or --snapshot, not both" in capsys.readouterr().err
    assert main(["train", "--solver", "missing.prototxt"]) == 2
    assert "not found" in capsys.readouterr().err
    try:
        import cupy  # noqa: F401
        cupy.cuda.runtime.getDeviceCount()
    except Exception:
        assert main(["test", "--model", f"{LENET}/lenet_train_test.prototxt", "--weights", "x", "--gpu"]) == 2
        assert "--gpu needs" in capsys.readouterr().err


def test_lenet_digits_loss_drops(in_workdir):
    """A short run of the README's job: LeNet on the digits learns (loss falls well below ln 10)."""
    from cgvm.frontends.caffe.solver import get_solver

    solver = get_solver(small_solver(in_workdir / "short.prototxt", max_iter=40), log=False)
    solver.param.test_initialization = False
    losses = []
    solver.on_iteration = lambda it, loss: losses.append(loss)
    solver.param.average_loss = 1
    solver.step(40)
    first, last = losses[0], float(np.mean(losses[-5:]))
    assert first > 2.0 and last < 0.5 * first, (first, last)


def test_every_model_builds_and_cifar10_quick_trains(in_workdir, capsys):
    from cgvm.frontends.caffe import caffe_pb2
    from cgvm.frontends.caffe.pycaffe import Net

    assert main(["data", "digits", "--out", "data/digits_rgb", "--limit", "64", "--channels", "3"]) == 0
    capsys.readouterr()
    models = os.path.join(REPO, "models")
    for net_file, batch in (("lenet/lenet_deploy.prototxt", 1), ("cifar10_quick/cifar10_quick_deploy.prototxt", 1)):
        net = Net(os.path.join(models, net_file), caffe_pb2.TEST)
        assert net.forward()["prob"].shape == (batch, 10)
    for net_file in ("lenet/lenet_train_test.prototxt", "cifar10_quick/cifar10_quick_train_test.prototxt"):
        for phase in (caffe_pb2.TRAIN, caffe_pb2.TEST):
            assert "loss" in Net(os.path.join(models, net_file), phase).forward()
    text = open(os.path.join(models, "cifar10_quick", "cifar10_quick_solver.prototxt")).read()
    text = text.replace("max_iter: 500", "max_iter: 2").replace("test_interval: 250", "test_interval: 2")
    text = text.replace('net: "models/', f'net: "{models}/').replace("test_iter: 9", "test_iter: 1")
    (in_workdir / "cifar_solver.prototxt").write_text(text)
    os.makedirs("data/digits_rgb", exist_ok=True)
    assert main(["train", "--solver", "cifar_solver.prototxt", "--no-progress"]) == 0
    assert "Final test net #0: accuracy = " in capsys.readouterr().out
