"""The core CLI commands (compile, dis, info, demo) on a serialized graph."""
import subprocess
import sys

import numpy as np
import pytest

from cgvm.cli import main
from cgvm.ir import Graph, TensorType, input_value, param_value
from cgvm.ir.serialize import save_graph
from cgvm.ops import elementwise as E
from cgvm.ops import linalg as L
from cgvm.ops import reduce as R


@pytest.fixture
def graph_file(tmp_path):
    x = input_value(TensorType((None, 4)), "x")
    w = param_value("w", TensorType((4, 3)))
    h = E.tanh(L.matmul(x, w))
    y = R.sum(E.add(h, E.exp(E.mul(np.ones(3, np.float32), 2.0))), axis=1)
    path = tmp_path / "model.cgvm"
    save_graph(Graph([x], [y], name="tiny"), str(path))
    return str(path)


def test_compile_prints_ir_after_passes(graph_file, capsys):
    assert main(["compile", graph_file, "--print-after", "prune,fold", "--debug"]) == 0
    out = capsys.readouterr().out
    assert "// after prune" in out and "// after fold" in out
    after_fold = out.split("// after fold")[1]
    assert "exp(" not in after_fold  # the constant branch was folded


def test_dis_prints_bytecode(graph_file, capsys):
    assert main(["dis", graph_file]) == 0
    out = capsys.readouterr().out
    assert "CALL matmul" in out and "RET" in out and "param r" in out


def test_info_reports_memory(graph_file, capsys):
    assert main(["info", graph_file, "--memory", "--shape", "x=32,4"]) == 0
    out = capsys.readouterr().out
    assert "1 parameters" in out and "planned" in out and "matmul" in out


def test_info_needs_concrete_shapes(graph_file, capsys):
    assert main(["info", graph_file, "--memory"]) == 2
    assert "--shape x=" in capsys.readouterr().err


def test_missing_file_is_a_clean_error(tmp_path, capsys):
    assert main(["dis", str(tmp_path / "nope.cgvm")]) == 2
    assert "error" in capsys.readouterr().err


def test_demo_trains_to_high_accuracy():
    pytest.importorskip("sklearn")
    from cgvm.demo import train_digits

    assert train_digits(epochs=30) >= 0.95


def test_console_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "cgvm.cli", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "compile" in r.stdout and "demo" in r.stdout
