"""The GPU check's scripts on a machine without a GPU: the environment report says what is missing,
the check stops before installing or running anything, the summary reads junit files, and the GPU
benchmarks refuse cleanly."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import gpu_env  # noqa: E402

from cgvm.backend import available_backends  # noqa: E402

NO_GPU = "cupy" not in available_backends()


def _env():
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("CGVM_BACKEND", None)
    return env


def test_requirements_cover_the_core_and_name_no_gpu_builds():
    names = gpu_env.requirements()
    assert set(gpu_env.CORE) <= set(names) and "onnx" in names and "pytest-xdist" in names
    assert not [n for n in names if n.startswith(("cupy", "torch"))]   # the GPU machine brings those


def test_a_module_counts_as_present_or_as_a_waiting_wheel(tmp_path):
    assert gpu_env.check_module("numpy", str(tmp_path))["status"] == "present"
    assert gpu_env.check_module("cgvm-no-such-dist", str(tmp_path))["status"] == "missing"
    (tmp_path / "cgvm_no_such_dist-1.0-py3-none-any.whl").write_bytes(b"")
    row = gpu_env.check_module("cgvm-no-such-dist", str(tmp_path))
    assert row == {"name": "cgvm-no-such-dist", "status": "wheel", "detail": "cgvm_no_such_dist-1.0-py3-none-any.whl"}


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("mode", [["--check"], []])
def test_check_script_without_a_gpu_says_what_is_missing(tmp_path, mode):
    out = tmp_path / "out"
    venv = tmp_path / "venv"
    proc = subprocess.run(["bash", os.path.join(ROOT, "scripts", "gpu_check.sh")] + mode + [str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(_env(), GPU_CHECK_PYTHON=sys.executable, GPU_CHECK_VENV=str(venv),
                                   GPU_CHECK_WHEELS=str(tmp_path / "no-wheels")))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((out / "environment.json").read_text())
    assert report["ready"] is False and "cupy" in report["missing"]
    text = (out / "environment.txt").read_text()
    assert "NOT ready, missing:" in text and "cupy-cuda13x" in text
    assert not venv.exists()                       # nothing installed, nothing run
    assert not (out / "junit_gpu.xml").exists()
    if not mode:
        assert (out / "summary.md").read_text().startswith("# GPU check: not run")


def test_summary_counts_junit_results_and_partial_runs(tmp_path):
    (tmp_path / "junit_gpu.xml").write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="a" name="t1"/>'
        '<testcase classname="a" name="t2"><failure message="AssertionError: x != y">tb</failure></testcase>'
        '<testcase classname="a" name="t3"><failure message="AssertionError: x != y">tb</failure></testcase>'
        '<testcase classname="a" name="t4"><skipped message="needs a GPU"/></testcase>'
        '<testcase classname="a" name="t5"><error message="fixture broke"/></testcase>'
        '</testsuite></testsuites>')
    (tmp_path / "benchmarks.md").write_text("| benchmark | cgvm |\n|---|---|\n| chain | 1 ms |\n")
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_summary.py"), str(tmp_path),
                           "--rc", "gpu=1", "--rc", "suite=124", "--rc", "benchmarks=0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "5 tests: 1 passed, 2 failed, 1 errors, 1 skipped; finished (exit 1)" in text
    assert "- 2 x `AssertionError: x != y`" in text
    assert "junit_suite.xml missing" in text and "| chain | 1 ms |" in text


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
def test_gpu_benchmarks_refuse_cleanly_without_a_gpu():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu"], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=_env())
    assert proc.returncode == 2
    assert "needs an NVIDIA GPU with CuPy" in proc.stderr and "cgvm[gpu-cuda13]" in proc.stderr
    assert "Traceback" not in proc.stderr
