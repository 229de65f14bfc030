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
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.setattr(threads, "sampled_busy_cores", lambda seconds=0.05: 100.0)
    monkeypatch.setattr(os, "getloadavg", lambda: (100.0, 0.0, 0.0))
    assert threads.default_num_threads() == 1          # every core is busy: one thread
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert threads.default_num_threads() == cpus       # an idle machine: all of them


def test_load_average_counting_waits_on_io_is_checked_against_proc_stat(monkeypatch):
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    monkeypatch.delenv("CGVM_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (float(cpus), 0.0, 0.0))
    monkeypatch.setattr(threads, "sampled_busy_cores", lambda seconds=0.05: 0.0)
    assert threads.default_num_threads() == cpus       # /proc/stat: every core idle
    monkeypatch.setattr(threads, "sampled_busy_cores", lambda seconds=0.05: None)
    assert threads.default_num_threads() == 1          # no /proc/stat: the load average stands


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc/stat (Linux)")
def test_proc_stat_sample_sees_a_spinning_process():
    import subprocess
    import sys

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)
        busy = threads.sampled_busy_cores(0.3)
    finally:
        spinner.kill()
        spinner.wait()
    assert busy is not None and 0.7 <= busy <= (os.cpu_count() or 1) + 0.01
