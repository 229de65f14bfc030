"""Keras-style fit/evaluate/predict under keras.distribution.DataParallel on 2 MPI ranks: the same
weights as one process with the same (global) batch size, over a last batch that splits 3 + 2;
identical weights on the ranks; callbacks on rank 0 only."""
import json

import numpy as np
import pytest

from dist_launch import program, run_ranks


def _load(prefix, rank):
    with np.load(f"{prefix}_rank{rank}.npz") as f:
        arrays = {k: f[k] for k in f.files}
    with open(f"{prefix}_rank{rank}.json") as f:
        return arrays, json.load(f)


def test_fit_on_two_ranks_equals_one_process(tmp_path):
    args = ["16", "2", "805"]   # 51 steps an epoch, 102 steps; the last batch of each epoch holds 5 rows
    one = run_ranks(None, [program("keras_fit.py"), str(tmp_path / "one")] + args, cwd=tmp_path)
    assert one.returncode == 0, one.output
    two = run_ranks(2, [program("keras_fit.py"), str(tmp_path / "two")] + args, cwd=tmp_path)
    assert two.returncode == 0, two.output
    (ref, ref_logs), (w0, logs0), (w1, logs1) = _load(tmp_path / "one", 0), _load(tmp_path / "two", 0), \
        _load(tmp_path / "two", 1)
    for k, want in ref.items():
        assert np.array_equal(w0[k], w1[k]), f"{k} differs between the ranks"
        rel = np.abs(w0[k] - want).max() / np.abs(want).max()
        assert rel < 1e-5, f"{k}: 2 ranks vs 1 process differ by {rel:.3g} (relative)"
    assert logs0["callback_calls"] == 102 and logs1["callback_calls"] == 0
    np.testing.assert_allclose(logs0["history"]["loss"], ref_logs["history"]["loss"], rtol=1e-5)
    np.testing.assert_allclose(logs0["evaluate"]["loss"], ref_logs["evaluate"]["loss"], rtol=1e-5)
    assert logs1["evaluate"] == logs0["evaluate"]


def test_data_parallel_outside_mpi_is_one_device():
    import cgvm.keras as keras

    d = keras.distribution.DataParallel()
    assert d.devices == ["cpu:0"] and keras.distribution.list_devices() == ["cpu:0"]
    with d.scope():
        assert keras.distribution.distribution() is d
    assert keras.distribution.distribution() is None
    with pytest.raises(Exception, match="2 devices, but this run has 1 MPI rank"):
        keras.distribution.DataParallel(devices=["cpu:0", "cpu:1"])
