"""The self-contained code in docs/ runs as written, and the Keras example saves under the working directory."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _python_blocks(page: str):
    return re.findall(r"```python\n(.*?)```", (REPO / "docs" / page).read_text(), re.S)


@pytest.mark.parametrize("page, index", [("saving.md", 0), ("saving.md", 1), ("cgvm_files.md", 0), ("cgvm_files.md", 1)])
def test_doc_block_runs(tmp_path, monkeypatch, page, index):
    code = _python_blocks(page)[index].replace('"models/', f'"{REPO}/models/')
    monkeypatch.chdir(tmp_path)
    exec(compile(code, f"docs/{page}[{index}]", "exec"), {})
    written = {p.name for p in tmp_path.iterdir()}
    assert written & {"weights.npz", "w.npy", "tiny.cgvm", "lenet.cgvm"}


def test_cgvm_file_from_the_docs_is_read_by_the_tools(tmp_path, monkeypatch, capsys):
    from cgvm.cli import main

    monkeypatch.chdir(tmp_path)
    exec(_python_blocks("cgvm_files.md")[1].replace('"models/', f'"{REPO}/models/'), {})
    assert main(["info", "lenet.cgvm"]) == 0
    assert "graph LeNet" in capsys.readouterr().out


def test_docs_pages_exist():
    for page in ("gpu.md", "saving.md", "cgvm_files.md", "model_zoo.md"):
        assert (REPO / "docs" / page).stat().st_size > 500


def test_keras_example_saves_under_the_working_directory(tmp_path):
    pytest.importorskip("sklearn")
    env = dict(os.environ, PYTHONPATH=str(REPO), KERAS_BACKEND=os.environ.get("KERAS_BACKEND", "torch"))
    out = subprocess.run([sys.executable, str(REPO / "examples" / "keras" / "mnist_mlp.py"), "--epochs", "1"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "digits_mlp.keras").is_file()
    assert "reloaded predicts the same: True" in out.stdout
