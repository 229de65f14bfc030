"""Caffe on 2 MPI ranks: `mpiexec -n 2 cgvm train` with batch b trains the model one process trains with
batch 2b (LMDB with random crops and mirrors, HDF5 and ImageData shuffled, over several epochs, each rank
decoding only its records); pycaffe's multi-solver API; snapshots resume with another rank count; a killed
rank leaves the last snapshot whole."""
import numpy as np
import pytest

from caffe_files import read_weights, write_data, write_solver
from dist_launch import program, run_ranks

pytest.importorskip("lmdb")
pytest.importorskip("h5py")
pytest.importorskip("PIL")

CLI = ["-m", "cgvm.cli", "train", "--no-progress", "--solver"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("caffe_dist")
    write_data(d)
    return d


def _close(a, b, what):
    assert a.keys() == b.keys()
    for k in a:
        rel = np.abs(a[k] - b[k]).max() / np.abs(b[k]).max()
        assert rel < 1e-5, f"{what}: {k} differs by {rel:.3g} (relative)"


@pytest.mark.parametrize("kind", ["lmdb", "hdf5", "images"])
def test_cli_two_ranks_of_batch_8_equal_one_process_of_batch_16(data, kind):
    one = write_solver(data, f"{kind}_one", kind, 16, test=kind == "lmdb")
    two = write_solver(data, f"{kind}_two", kind, 8, test=kind == "lmdb")
    r1 = run_ranks(None, CLI + [one.name], cwd=data)
    assert r1.returncode == 0, r1.output
    r2 = run_ranks(2, CLI + [two.name], cwd=data)
    assert r2.returncode == 0, r2.output
    _close(read_weights(data / f"{kind}_two_snap/mlp_iter_100.caffemodel"),
           read_weights(data / f"{kind}_one_snap/mlp_iter_100.caffemodel"), kind)
    if kind == "lmdb":   # rank 0 alone logs and tests: the 3 tests of the run appear once each
        assert r2.output.count("Testing net (#0)") == 3, r2.output
        assert r2.output.count("Optimization Done.") == 1
        assert r2.output.count("Trained 100 iterations") == 1


def test_pycaffe_solvers_hold_identical_weights_and_resume_with_another_rank_count(data):
    two = write_solver(data, "py_two", "lmdb", 8, test=False)
    r = run_ranks(2, [program("caffe_driver.py"), two.name, "full", "100"], cwd=data)
    assert r.returncode == 0, r.output
    assert "rank 1: solver_count 2 solver_rank 1" in r.output
    w0, w1 = (dict(np.load(data / f"full_rank{k}.npz")) for k in (0, 1))
    for k in w0:
        assert np.array_equal(w0[k], w1[k]), f"{k} differs between the ranks"
    one = write_solver(data, "py_one", "lmdb", 16, test=False)
    # the snapshot 2 ranks wrote at iteration 50, resumed by ONE process of batch 16, ends where 2 ranks end
    resumed = run_ranks(None, CLI + [one.name, "--snapshot", "py_two_snap/mlp_iter_50.solverstate"], cwd=data)
    assert resumed.returncode == 0, resumed.output
    _close(read_weights(data / "py_one_snap/mlp_iter_100.caffemodel"), w0, "resumed with 1 rank")


def test_a_killed_rank_leaves_the_last_snapshot_and_resuming_reaches_the_same_weights(data):
    solver = write_solver(data, "kill", "lmdb", 8, test=False, lr_policy="step")
    r = run_ranks(2, [program("caffe_driver.py"), solver.name, "crash", "100"], cwd=data,
                  env={"CGVM_TEST_FAULT": "kill:1:70"}, timeout=60)
    assert r.returncode != 0 and "BAD TERMINATION" in r.output
    assert r.seconds < 30
    snaps = sorted(p.name for p in (data / "kill_snap").iterdir())
    assert "mlp_iter_50.solverstate" in snaps and not any("partial" in s for s in snaps), snaps
    assert "mlp_iter_100.caffemodel" not in snaps
    resumed = run_ranks(2, [program("caffe_driver.py"), solver.name, "resumed", "100",
                            "kill_snap/mlp_iter_50.solverstate"], cwd=data)
    assert resumed.returncode == 0, resumed.output
    straight = write_solver(data, "straight", "lmdb", 8, test=False, lr_policy="step")
    full = run_ranks(2, [program("caffe_driver.py"), straight.name, "straight", "100"], cwd=data)
    assert full.returncode == 0, full.output
    a, b = dict(np.load(data / "resumed_rank0.npz")), dict(np.load(data / "straight_rank0.npz"))
    for k in a:
        assert np.array_equal(a[k], b[k]), f"{k}: resumed run differs from the uninterrupted one"


def test_cli_rank_with_an_error_stops_every_rank(data):
    bad = write_solver(data, "bad", "lmdb", 8, test=False)
    bad.write_text(bad.read_text().replace('net: "bad_net.prototxt"', 'net: "missing_net.prototxt"'))
    r = run_ranks(2, CLI + [bad.name], cwd=data, timeout=60)
    assert r.returncode != 0
    assert "failed: exited with status 2" in r.output, r.output
    assert r.seconds < 30
