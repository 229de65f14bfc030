"""`cgvm board LOGDIR`: serves TensorBoard on cgvm's logs (its HTTP API lists the runs, tags and graphs),
and says what is wrong where the directory or the tensorboard package is missing."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import urllib.request

import numpy as np
import pytest

from cgvm.cli import main

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_missing_logdir_is_an_error(tmp_path, capsys):
    assert main(["board", str(tmp_path / "nowhere")]) == 2
    assert "log directory" in capsys.readouterr().err


def test_missing_tensorboard_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    assert main(["board", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "TensorBoard, which is not installed" in err and "pip install 'cgvm[board]'" in err


def test_board_serves_the_runs_tags_and_graph(tmp_path):
    pytest.importorskip("tensorboard")
    import cgvm
    from cgvm.board import SummaryWriter
    from cgvm.ir import TensorType, input_value
    from cgvm.ops import elementwise as E

    x = input_value(TensorType((3,)), "x")
    f = cgvm.compile([x], E.tanh(E.mul(x, 2.0)))
    with SummaryWriter(tmp_path / "logs" / "run") as w:
        for step in range(4):
            w.add_scalar("loss", float(np.exp(-step)), step)
        w.add_graph(f)
    spec = importlib.util.spec_from_file_location("board_screenshot", os.path.join(REPO, "scripts", "board_screenshot.py"))
    shots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shots)
    with shots.serve(str(tmp_path / "logs")) as url:
        get = lambda path: json.loads(urllib.request.urlopen(url + path, timeout=30).read())  # noqa: E731
        assert get("/data/runs") == ["run"]
        assert "loss" in get("/data/plugin/scalars/tags")["run"]
        info = get("/data/plugin/graphs/info")["run"]
        assert info["run_graph"] and info["tags"]["before_passes"]["op_graph"]
        graph = urllib.request.urlopen(url + "/data/plugin/graphs/graph?run=run", timeout=30).read().decode()
        assert 'op: "tanh"' in graph or 'op: "multiply"' in graph
