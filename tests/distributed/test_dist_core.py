"""Core API data parallelism on 2 MPI ranks: same weights as one process with the double batch,
identical weights on every rank, any bucket size, blocking or overlapped; faults end every rank."""
import re

import numpy as np
import pytest

from dist_launch import program, run_ranks


def _weights(prefix, rank):
    with np.load(f"{prefix}_rank{rank}.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, global batch 16, 100 SGD steps."""
    d = tmp_path_factory.mktemp("core_ref")
    r = run_ranks(None, [program("core_mlp.py"), str(d / "one"), "16", "100"], cwd=d)
    assert r.returncode == 0, r.output
    return _weights(d / "one", 0)


@pytest.mark.parametrize("bucket,mode", [(None, "overlap"), ("0", "overlap"), ("100000000", "blocking")])
def test_two_ranks_of_batch_8_train_like_one_process_of_batch_16(tmp_path, reference, bucket, mode):
    args = [program("core_mlp.py"), str(tmp_path / "two"), "16", "100"] + ([bucket, mode] if bucket else [])
    r = run_ranks(2, args, cwd=tmp_path)
    assert r.returncode == 0, r.output
    w0, w1 = _weights(tmp_path / "two", 0), _weights(tmp_path / "two", 1)
    for name, want in reference.items():
        assert np.array_equal(w0[name], w1[name]), f"{name} differs between the ranks"
        rel = np.abs(w0[name] - want).max() / np.abs(want).max()
        assert rel < 1e-5, f"{name}: 2 ranks x 8 vs 1 x 16 differ by {rel:.3g} (relative)"


@pytest.mark.parametrize("kind", ["raise", "kill"])
def test_a_failing_rank_ends_every_rank_quickly_naming_it(tmp_path, kind):
    r = run_ranks(2, [program("core_mlp.py"), str(tmp_path / "f"), "16", "100000"], cwd=tmp_path,
                  env={"CGVM_TEST_FAULT": f"{kind}:1:20"}, timeout=60)
    assert r.returncode != 0
    assert r.seconds < 30, f"took {r.seconds:.1f} s to stop"
    if kind == "raise":
        assert "rank 1 of 2 failed: RuntimeError: injected failure at step 20" in r.output, r.output
    else:
        assert "BAD TERMINATION" in r.output, r.output
        killed = re.search(r"rank 1 = pid (\d+) on ", r.output).group(1)   # from the start-up table
        # the launcher names the process it saw end first: rank 1 itself, or (on a loaded machine)
        # rank 0 once it stopped, whose own message then names rank 1 as the one that died
        named = set(re.findall(r"PID (\d+) RUNNING AT", r.output))
        assert killed in named or f"rank(s) that died: rank 1 (pid {killed} " in r.output, r.output
    assert not (tmp_path / "f_rank0.npz").exists()


def test_ranks_with_different_nets_fail_at_the_first_step(tmp_path):
    r = run_ranks(2, [program("core_mlp.py"), str(tmp_path / "m"), "16", "10"], cwd=tmp_path,
                  env={"CGVM_TEST_FAULT": "hidden:1"}, timeout=60)
    assert r.returncode != 0
    assert "ranks disagree on the gradients to reduce: rank 1 differs from rank 0" in r.output, r.output
    assert "(12, 16)" in r.output and "(12, 17)" in r.output


def test_theano_style_two_ranks_equal_one_process(tmp_path):
    one = run_ranks(None, [program("theano_mlp.py"), str(tmp_path / "one"), "16", "100"], cwd=tmp_path)
    assert one.returncode == 0, one.output
    two = run_ranks(2, [program("theano_mlp.py"), str(tmp_path / "two"), "16", "100"], cwd=tmp_path)
    assert two.returncode == 0, two.output
    ref, w0, w1 = _weights(tmp_path / "one", 0), _weights(tmp_path / "two", 0), _weights(tmp_path / "two", 1)
    for k, want in ref.items():
        assert np.array_equal(w0[k], w1[k])
        assert np.abs(w0[k] - want).max() / np.abs(want).max() < 1e-5, k


def test_collectives_on_arrays_workspace_entries_and_dlpack_tensors(tmp_path):
    r = run_ranks(2, [program("collectives.py")], cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert "rank 0 ok" in r.output and "rank 1 ok" in r.output


def test_a_stuck_rank_makes_the_others_time_out_instead_of_hanging(tmp_path):
    r = run_ranks(2, [program("core_mlp.py"), str(tmp_path / "s"), "16", "100"], cwd=tmp_path,
                  env={"CGVM_TEST_FAULT": "stall:1:5", "CGVM_DIST_TIMEOUT": "2"}, timeout=60)
    assert r.returncode != 0
    assert r.seconds < 30, f"took {r.seconds:.1f} s"
    assert re.search(r"rank 0 of 2: the allreduce of gradient bucket \d+ did not complete within 2 s", r.output), \
        r.output
