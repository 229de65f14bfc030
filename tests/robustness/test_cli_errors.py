"""The CLI's rough edges: one clear error line per failure (exit 2, --debug for the traceback), usage for a
wrong option, a closed pipe, --version, CGVM_BACKEND, bench outside a checkout, weights given as a
model, train --snapshot with nothing left to do, and bad images, labels, .npy and mean files."""
import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cgvm.caffe as caffe
from cgvm import cli
from cgvm.frontends.caffe import weights
from fuzz.targets_caffe import SMALL_NET, TRAIN_NET, _png, _solver_text

REPO = Path(__file__).resolve().parents[2]
DEPLOY = SMALL_NET.replace("dim: 2 dim: 1", "dim: 1 dim: 1")


def _main(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _one_error_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith(f"cgvm {command}: error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def deploy(tmp_path):
    (tmp_path / "deploy.prototxt").write_text(DEPLOY)
    net = caffe.Net(str(tmp_path / "deploy.prototxt"), caffe.TEST, seed=3)
    weights.save(net, str(tmp_path / "deploy.caffemodel"))
    (tmp_path / "ok.png").write_bytes(_png(8, 8, bytes(range(64))))
    return tmp_path


def _run(deploy, *extra):
    return ["run", str(deploy / "deploy.prototxt"), "--weights", str(deploy / "deploy.caffemodel"), *extra]


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    from cgvm import __version__

    assert capsys.readouterr().out.strip() == f"cgvm {__version__}"


def test_unknown_option_prints_the_subcommand_usage(deploy, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["info", str(deploy / "deploy.prototxt"), "--no-such-flag"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: cgvm info ") and "unrecognized arguments: --no-such-flag" in err


def test_print_after_unknown_pass(deploy, capsys):
    with pytest.raises(SystemExit):
        cli.main(["compile", str(deploy / "deploy.prototxt"), "--print-after=prune,nosuchpass"])
    err = capsys.readouterr().err
    assert "usage: cgvm compile" in err and "unknown pass 'nosuchpass'" in err and "prune" in err
    from cgvm.compiler import pass_names
    assert set(pass_names()) >= {"prune", "fold", "cse"}


@pytest.mark.parametrize("value, message", [("data=1,x,8,8", "NAME=D0,D1"), ("data", "NAME=D0,D1"),
                                            ("data=1,-1", "non-negative"), ("nosuch=1,1,8,8", "no input 'nosuch'")])
def test_info_shape_errors(deploy, capsys, value, message):
    with pytest.raises(SystemExit):
        cli.main(["info", str(deploy / "deploy.prototxt"), "--memory", "--shape", value])
    err = capsys.readouterr().err
    assert "usage: cgvm info" in err and message in err


def test_info_memory_train_without_phase_train_says_what_it_did(tmp_path, capsys):
    (tmp_path / "train.prototxt").write_text(TRAIN_NET)
    code, out, err = _main(["info", str(tmp_path / "train.prototxt"), "--memory", "--train"], capsys)
    assert code == 0 and "note: --train differentiates the net of phase TEST" in err and "--phase TRAIN" in err
    code, out, err = _main(["info", str(tmp_path / "train.prototxt"), "--memory", "--train", "--phase", "TRAIN"],
                           capsys)
    assert code == 0 and "note:" not in err


@pytest.mark.parametrize("argv", [["info", "{m}"], ["test", "--model", "{m}", "--weights", "{m}"],
                                  ["run", "{m}", "--weights", "{m}", "--input", "x.png"]])
def test_caffemodel_given_as_the_model(deploy, capsys, argv):
    model = str(deploy / "deploy.caffemodel")
    with pytest.raises(SystemExit):
        cli.main([a.replace("{m}", model) for a in argv])
    err = capsys.readouterr().err
    assert "holds trained weights" in err and "--weights" in err and f"usage: cgvm {argv[0]}" in err


def test_errors_are_one_line_and_debug_adds_the_traceback(deploy, capsys):
    bad = deploy / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    code, out, err = _main(_run(deploy, "--input", str(bad)), capsys)
    assert code == 2
    line = _one_error_line(err, "run")
    assert "bad.png" in line and "cannot read the image" in line
    code, out, err = _main(["--debug"] + _run(deploy, "--input", str(bad)), capsys)
    assert code == 2 and "Traceback" in err and "The above exception was the direct cause" in err
    code, out, err = _main(_run(deploy, "--input", str(bad), "--debug"), capsys)   # after the command too
    assert code == 2 and "Traceback" in err


def test_bad_npy_inputs(deploy, capsys):
    good = io.BytesIO()
    np.save(good, np.zeros((8, 8), np.float32))
    cases = {"truncated.npy": good.getvalue()[:100], "empty.npy": b"",
             "header.npy": good.getvalue()[:12] + b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,"}
    strings = io.BytesIO()
    np.save(strings, np.array(["a", "b"]))
    cases["strings.npy"] = strings.getvalue()
    claims = bytearray(good.getvalue())
    at = claims.index(b"(8, 8)")
    claims[at:at + 6] = b"(9, 9)"   # the header claims more than the file holds
    cases["claims.npy"] = bytes(claims)
    for name, data in cases.items():
        (deploy / name).write_bytes(data)
        code, out, err = _main(_run(deploy, "--input", str(deploy / name)), capsys)
        assert code == 2, name
        assert name in _one_error_line(err, "run")


def test_bad_labels_and_mean_files(deploy, capsys):
    (deploy / "labels.txt").write_bytes(b"cat\n\xff\xfedog\n")
    code, out, err = _main(_run(deploy, "--input", str(deploy / "ok.png"), "--labels", str(deploy / "labels.txt")),
                           capsys)
    assert code == 2 and "labels.txt:2: not UTF-8" in _one_error_line(err, "run")
    code, out, err = _main(_run(deploy, "--input", str(deploy / "ok.png"), "--labels", str(deploy)), capsys)
    assert code == 2 and "directory" in _one_error_line(err, "run")
    (deploy / "mean.binaryproto").write_bytes(b"\x08\x01\x10")
    code, out, err = _main(_run(deploy, "--input", str(deploy / "ok.png"), "--mean-file",
                                str(deploy / "mean.binaryproto")), capsys)
    assert code == 2 and "mean.binaryproto" in err
    (deploy / "labels.txt").write_text("zero\none\ntwo\nthree\n")
    code, out, err = _main(_run(deploy, "--input", str(deploy / "ok.png"), "--labels", str(deploy / "labels.txt")),
                           capsys)
    assert code == 0 and "zero" in out or "three" in out


def test_backend_environment_is_validated(deploy, capsys, monkeypatch):
    monkeypatch.setenv("CGVM_BACKEND", "tpu")
    code, out, err = _main(["info", str(deploy / "deploy.prototxt")], capsys)
    assert code == 2 and "CGVM_BACKEND='tpu'" in _one_error_line(err, "info") and "numpy" in err
    try:
        import cupy  # noqa: F401
    except ImportError:
        monkeypatch.setenv("CGVM_BACKEND", "cupy")
        code, out, err = _main(_run(deploy, "--input", str(deploy / "ok.png")), capsys)
        assert code == 2 and "pip install 'cgvm[gpu]'" in _one_error_line(err, "run")
    monkeypatch.setenv("CGVM_BACKEND", "numpy")
    assert _main(["info", str(deploy / "deploy.prototxt")], capsys)[0] == 0


def test_bench_outside_a_checkout_says_how(capsys, monkeypatch):
    assert cli._find_benchmarks() == str(REPO)   # from the checkout, from any working directory
    monkeypatch.setattr(cli, "_find_benchmarks", lambda: None)
    code, out, err = _main(["bench", "--quick"], capsys)
    assert code == 2 and "source checkout" in _one_error_line(err, "bench") and "python -m benchmarks" in err


def test_closed_pipe_is_quiet(deploy):
    """`cgvm info ... | head -1`: no BrokenPipeError traceback, no 'Exception ignored' at exit."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "cgvm.cli", "compile", str(deploy / "deploy.prototxt"),
                             "--print-after=all"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    proc.stdout.readline()
    proc.stdout.close()   # the reader goes away before the command is done printing
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err


def test_train_snapshot_with_nothing_left_to_do(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.prototxt").write_text(TRAIN_NET)
    solver = tmp_path / "solver.prototxt"
    solver.write_text(_solver_text('net: "train.prototxt"', extra='snapshot_prefix: "snap"\n').replace(
        "max_iter: 4", "max_iter: 2"))
    code, out, err = _main(["train", "--solver", str(solver), "--no-progress"], capsys)
    assert code == 0
    state = tmp_path / "snap_iter_2.solverstate"
    before = (state.read_bytes(), state.stat().st_mtime_ns, (tmp_path / "snap_iter_2.caffemodel").read_bytes())
    code, out, err = _main(["train", "--solver", str(solver), "--snapshot", str(state), "--no-progress"], capsys)
    assert code == 0
    assert "Nothing to train" in out and "iteration 2" in out and "max_iter is 2" in out
    assert "Trained" not in out
    after = (state.read_bytes(), state.stat().st_mtime_ns, (tmp_path / "snap_iter_2.caffemodel").read_bytes())
    assert after == before


def test_directory_and_missing_files_are_one_line(deploy, capsys):
    code, out, err = _main(["test", "--model", str(deploy), "--weights", "x", "--iterations", "1"], capsys)
    assert code == 2
    _one_error_line(err, "test")
    code, out, err = _main(["run", str(deploy / "nope.prototxt"), "--weights", "x", "--input", "y"], capsys)
    assert code == 2 and "nope.prototxt" in _one_error_line(err, "run")
