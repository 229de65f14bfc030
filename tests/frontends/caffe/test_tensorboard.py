"""`cgvm train --tensorboard`, `solver.log_to_tensorboard` and `cgvm time --tensorboard` on LeNet and a few
digits: the curves read back by TensorBoard's EventAccumulator are the numbers Caffe's log printed."""
from __future__ import annotations

import json
import os
import re

import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("sklearn")
pytest.importorskip("lmdb")
pytest.importorskip("h5py")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.compat.proto import config_pb2  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

from cgvm.cli import main  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
LENET = os.path.join(REPO, "models", "lenet")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tb")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert main(["data", "digits", "--out", "data/digits", "--limit", "100"]) == 0
    finally:
        os.chdir(cwd)
    return root


def _solver(path, max_iter=6):
    path.write_text(f'net: "{LENET}/lenet_train_test.prototxt"\ntest_iter: 2\ntest_interval: 3\nbase_lr: 0.01\n'
                    f'momentum: 0.9\nlr_policy: "inv"\ngamma: 0.1\npower: 0.75\ndisplay: 3\nmax_iter: {max_iter}\n'
                    f'snapshot_prefix: "snaps/lenet"\nrandom_seed: 1\n')
    os.makedirs("snaps", exist_ok=True)
    return str(path)


def read(path):
    ea = EventAccumulator(str(path), size_guidance={"tensors": 0})
    ea.Reload()
    return ea


def curve(ea, tag):
    return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in ea.Tensors(tag)]


def parse_log(text):
    """What Caffe's parse_log.py reads: train rows (outputs, lr) and test rows per iteration."""
    train, test, lr, smoothed = {}, {}, {}, {}
    it, kind = None, None
    for line in text.splitlines():
        m = re.match(r"Iteration (\d+) \(.*\), loss = (\S+)", line)
        if m:
            it, kind = int(m[1]), "train"
            smoothed[it] = float(m[2])
        m = re.match(r"Iteration (\d+), Testing net", line)
        if m:
            it, kind = int(m[1]), "test"
        m = re.match(r"Iteration (\d+), lr = (\S+)", line)
        if m:
            lr[int(m[1])] = float(m[2])
        m = re.match(r"\s+(Train|Test) net output #\d+: (\w+) = (\S+)", line)
        if m:
            (train if m[1] == "Train" else test).setdefault(m[2], []).append((it, float(m[3])))
    return train, test, lr, smoothed


def approx_curve(points):
    return [(s, pytest.approx(v, rel=1e-5, abs=1e-7)) for s, v in points]


def test_train_tensorboard_curves_are_the_log(workdir, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(workdir)
    solver = _solver(tmp_path / "solver.prototxt")
    logs = tmp_path / "logs"
    assert main(["train", "--solver", solver, "--no-progress", "--tensorboard", str(logs)]) == 0
    out = capsys.readouterr().out
    train_rows, test_rows, lr, smoothed = parse_log(out)
    assert sorted(os.listdir(logs)) == ["test", "train"]
    train, test = read(logs / "train"), read(logs / "test")
    assert curve(train, "loss") == approx_curve(train_rows["loss"]) and len(train_rows["loss"]) == 2
    assert curve(train, "learning_rate") == approx_curve(sorted(lr.items()))
    assert curve(train, "smoothed_loss") == approx_curve(sorted(smoothed.items()))[:2]
    for name in ("accuracy", "loss"):
        assert curve(test, name) == approx_curve(test_rows[name]) and [s for s, _ in test_rows[name]] == [0, 3, 6]

    graph = train.Graph()
    names = [n.name for n in graph.node]
    for layer in ("conv1", "pool1", "conv2", "pool2", "ip1", "ip2", "loss"):
        assert any(n.split("/")[0].split("+")[0] == layer for n in names), layer
    assert any("relu1" in n for n in names)
    assert any(n.startswith("gradients/conv1/") for n in names) and any(n.startswith("updates/conv1/") for n in names)
    for param in ("conv1/0", "conv1/1", "ip2/0"):
        assert next(n for n in graph.node if n.name == param).op == "Parameter"
    before = config_pb2.RunMetadata.FromString(train.Tensors("before_passes")[0].tensor_proto.string_val[0])
    assert len(before.function_graphs[0].pre_optimization_graph.node) > len(graph.node) // 2


def test_pycaffe_solver_logs_to_tensorboard(workdir, monkeypatch, tmp_path):
    from cgvm.frontends.caffe.solver import get_solver

    monkeypatch.chdir(workdir)
    solver = get_solver(_solver(tmp_path / "solver.prototxt", max_iter=4), log=False)
    board = solver.log_to_tensorboard(str(tmp_path / "logs"))
    solver.step(4)
    board.close()
    test = read(tmp_path / "logs" / "test")
    want = [(it, scores["accuracy"]) for it, index, scores in solver.test_scores]
    assert curve(test, "accuracy") == approx_curve(want) and [s for s, _ in want] == [0, 3]
    train = read(tmp_path / "logs" / "train")
    assert [s for s, _ in curve(train, "loss")] == [0, 3]
    assert curve(train, "smoothed_loss")[-1] == (3, pytest.approx(solver.smoothed_loss, rel=1e-6))


def test_time_tensorboard_profile(workdir, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(workdir)
    logs = tmp_path / "prof"
    assert main(["time", "--model", f"{LENET}/lenet_train_test.prototxt", "--iterations", "2", "--no-progress",
                 "--tensorboard", str(logs)]) == 0
    out = capsys.readouterr().out
    assert f"Per-op profile written to {logs}" in out
    ea = read(logs)
    meta = config_pb2.RunMetadata.FromString(ea.Tensors("profile")[0].tensor_proto.string_val[0])
    graph = meta.function_graphs[0].pre_optimization_graph
    stats = meta.step_stats.dev_stats[0].node_stats
    assert {s.node_name for s in stats} <= {n.name for n in graph.node}
    assert any(s.node_name.startswith("conv1/") for s in stats)
    assert all(s.op_end_rel_micros >= 0 for s in stats)
    table = tensor_util.make_ndarray(ea.Tensors("profile/layers")[0].tensor_proto).item().decode()
    assert "| conv1 |" in table and "| ip2 |" in table
    events = json.load(open(logs / "cgvm_time.trace.json"))["traceEvents"]
    steps = [e for e in events if e.get("cat") == "step"]
    assert [e["name"] for e in steps] == ["iteration 1", "iteration 2"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") != "step"]
    assert len(ops) == 2 * len(stats)
    for e in ops:   # each op inside its step
        s = next(s for s in steps if s["ts"] <= e["ts"] <= s["ts"] + s["dur"])
        assert e["ts"] + e["dur"] <= s["ts"] + s["dur"] + 1.0
