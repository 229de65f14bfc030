"""Caffe's own pycaffe test suite (BVLC/caffe ``python/caffe/test/*.py``) run on ``cgvm.caffe``.

The files are read at test time from a local mirror of BVLC/caffe (none of their code is kept in
this repository); the only edit is the import line (``import caffe`` -> ``import cgvm.caffe as
caffe`` and its ``from caffe...`` forms). The prototxts under the mirror's ``models/`` and
``examples/`` come along because ``test_draw.py`` walks them. Skips cleanly without the mirror.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

from tests.shared_paths import PEERS, REPO_ROOT

MIRRORS = [Path(os.environ.get("CGVM_BVLC_CAFFE_MIRROR", "/work/.mirror/BVLC+caffe/repo")), PEERS / "BVLC+caffe"]


def _mirror() -> Path | None:
    for candidate in MIRRORS:
        if (candidate / "HEAD").exists() or (candidate / ".git").exists():
            return candidate
    return None


def _git(mirror: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(mirror), *args] if (mirror / "HEAD").exists()
                          else ["git", "-C", str(mirror), *args], check=True, capture_output=True).stdout


_IMPORT_REWRITES = [
    (re.compile(r"^(\s*)import caffe\.draw\s*$", re.M), r"\1import cgvm.caffe as caffe"),
    (re.compile(r"^(\s*)import caffe\s*$", re.M), r"\1import cgvm.caffe as caffe"),
    (re.compile(r"^(\s*)from caffe(\.[\w.]+)? import ", re.M), r"\1from cgvm.caffe\2 import "),
]


def change_imports(source: str) -> str:
    """The one edit allowed: point pycaffe's imports at cgvm.caffe."""
    for pattern, replacement in _IMPORT_REWRITES:
        source = pattern.sub(replacement, source)
    return source


def extract_suite(mirror: Path, into: Path) -> list[Path]:
    """Write the suite's test files (imports changed) and the prototxts test_draw walks under ``into``."""
    names = _git(mirror, "ls-tree", "-r", "--name-only", "HEAD").decode().splitlines()
    tests = []
    for name in names:
        keep_test = name.startswith("python/caffe/test/") and name.endswith(".py")
        keep_net = name.split("/")[0] in ("models", "examples") and name.endswith(".prototxt")
        if not (keep_test or keep_net):
            continue
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        blob = _git(mirror, "show", f"HEAD:{name}")
        if keep_test:
            target.write_text(change_imports(blob.decode()))
            tests.append(target)
        else:
            target.write_bytes(blob)
    return tests


@pytest.fixture(scope="module")
def suite_results(tmp_path_factory):
    mirror = _mirror()
    if mirror is None:
        pytest.skip("no local mirror of BVLC/caffe (set CGVM_BVLC_CAFFE_MIRROR)")
    pytest.importorskip("six")  # the suite imports it
    root = tmp_path_factory.mktemp("bvlc_caffe")
    tests = extract_suite(mirror, root)
    test_dir = root / "python" / "caffe" / "test"
    report = root / "report.xml"
    # the suite has Python layers: cgvm runs them only when asked (the user's opt-in, not a code change)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(test_dir), str(REPO_ROOT)]), CGVM_ALLOW_PYTHON_LAYERS="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(test_dir), "--continue-on-collection-errors",
                          f"--junitxml={report}", *[t.name for t in tests]], cwd=test_dir, env=env,
                         capture_output=True, text=True, timeout=900)
    if not report.exists():
        pytest.fail(f"the suite did not run:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}")
    results = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "skipped"
        results[f"{case.get('classname')}.{case.get('name')}"] = outcome
    return results, run.stdout


def test_every_pycaffe_suite_test_passes_on_cgvm(suite_results):
    results, output = suite_results
    failed = sorted(name for name, outcome in results.items() if outcome == "failed")
    passed = sum(outcome == "passed" for outcome in results.values())
    print(f"BVLC pycaffe suite on cgvm: {passed} of {len(results)} passed")
    assert len(results) >= 52, output[-3000:]
    assert not failed, f"{len(failed)} failed: {failed}\n{output[-6000:]}"
