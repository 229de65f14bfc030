"""NCCL through CuPy on real GPUs under mpiexec (skipped without CuPy, NCCL or a GPU; cgvm's CI has none):
one rank per GPU, collectives on device arrays and an MLP whose gradient buckets go through NCCL on a
communication stream, against a one-process NumPy run of the global batch. With one GPU it runs one
rank (the bucket ops still run), and checks that two ranks on it either work or fail with NCCL's
one-GPU-per-rank rule named. The same glue is checked on the CPU with a fake CuPy in test_nccl_glue.py.

    python -m pytest -q -p no:cacheprovider tests/distributed/test_nccl_gpu.py
"""
import pytest

from dist_launch import program, run_ranks

cupy = pytest.importorskip("cupy")


def _gpus() -> int:
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:   # no driver, or a broken one
        pytest.skip(f"CuPy finds no usable CUDA device: {e}")
    if count == 0:
        pytest.skip("no CUDA device")
    try:
        from cupy.cuda import nccl
    except ImportError as e:
        pytest.skip(f"this CuPy has no NCCL: {e}")
    if not getattr(nccl, "available", True):
        pytest.skip("this CuPy was built without NCCL")
    return count


GPU_ENV = {"CGVM_BACKEND": "cupy", "CGVM_DIST_QUIET": "1"}


def test_nccl_on_one_gpu(tmp_path):
    _gpus()
    r = run_ranks(1, [program("nccl_gpu.py"), "20"], cwd=tmp_path, env=GPU_ENV, timeout=300)
    assert r.returncode == 0, r.output
    assert "rank 0 of 1: nccl gpu ok (20 steps)" in r.output, r.output


def test_nccl_on_two_gpus_or_two_ranks_on_one(tmp_path):
    gpus = _gpus()
    r = run_ranks(2, [program("nccl_gpu.py"), "20"], cwd=tmp_path, env=GPU_ENV, timeout=180)
    if gpus >= 2:
        assert r.returncode == 0, r.output
        assert "rank 0 of 2: nccl gpu ok" in r.output and "rank 1 of 2: nccl gpu ok" in r.output, r.output
    elif r.returncode != 0:   # NCCL refuses two ranks on one device: the error must say so, and fast
        assert "NCCL needs one GPU per rank" in r.output, r.output
        assert r.seconds < 90
