"""Running a program on N MPI ranks on loopback for the tests: mpiexec from the venv, a hard timeout."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).resolve().parent / "programs"


def mpiexec() -> str:
    """The mpiexec beside this Python (the mpich wheel's), else on PATH; skips the test without one."""
    pytest.importorskip("mpi4py")
    here = Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if not found:
        pytest.skip("no mpiexec: pip install 'cgvm[mpi]'")
    return found


class Run(NamedTuple):
    returncode: int
    output: str
    seconds: float


def child_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["CGVM_NUM_THREADS"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    env["CGVM_TEST_ROUNDTRIP"] = "0"
    for k in [k for k in env if k.startswith(("PMI_", "OMPI_", "PMIX_", "SLURM_", "MPI_LOCALRANKID"))]:
        del env[k]    # never inherit a launcher's identity: the child decides
    env.update(extra or {})
    return env


def run_ranks(n: Optional[int], args: List[str], *, cwd: Path, timeout: float = 90,
              env: Optional[Dict[str, str]] = None) -> Run:
    """``mpiexec -n n python args`` (n=None: one plain process, no launcher), killed after ``timeout``."""
    cmd = ([mpiexec(), "-n", str(n)] if n else []) + [sys.executable] + args
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=cwd, env=child_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise AssertionError(f"{' '.join(cmd)} hung for {timeout} s:\n{out[-3000:]}") from None
    return Run(done.returncode, done.stdout, time.monotonic() - t0)


def program(name: str) -> str:
    return str(PROGRAMS / name)
