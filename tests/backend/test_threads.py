"""The VM sizes NumPy's BLAS pool (and only NumPy's) so a shared machine is not oversubscribed."""
import os

import numpy as np
import pytest

from cgvm.backend import threads

threadpoolctl = pytest.importorskip("threadpoolctl")


def _numpy_blas_threads():
    numpy_dir = os.path.dirname(os.path.dirname(np.__file__))
    infos = [i for i in threadpoolctl.threadpool_info()
             if i["user_api"] == "blas" and i["filepath"].startswith(numpy_dir)]
    return [i["num_threads"] for i in infos]


def test_set_num_threads_sizes_numpys_blas():
    before = threads.num_threads()
    try:
        assert threads.set_num_threads(1) == 1
        assert _numpy_blas_threads() and all(n == 1 for n in _numpy_blas_threads())
    finally:
        threads.set_num_threads(before)


def test_default_follows_env_and_load(monkeypatch):
    monkeypatch.setenv("CGVM_NUM_THREADS", "3")
    assert threads.default_num_threads() == 3
    monkeypatch.delenv("CGVM_NUM_THREADS")
    monkeypatch.setattr(os, "getloadavg", lambda: (100.0, 0.0, 0.0))
    assert threads.default_num_threads() == 1          # every core is busy: one thread
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert threads.default_num_threads() == cpus       # an idle machine: all of them
