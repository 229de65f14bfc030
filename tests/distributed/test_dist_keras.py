"""Keras-style fit/evaluate/predict under keras.distribution.DataParallel on 2 MPI ranks: the same
weights as one process with the same (global) batch size, over a last batch that splits 3 + 2;
identical weights on the ranks; callbacks on rank 0 only; every logged metric (accuracy, MSE,
Precision, Recall, AUC, with uneven sample weights and a last batch of 6 + 5) equal to one process's."""
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


def test_metrics_on_two_ranks_equal_one_process(tmp_path):
    args = ["16", "3", "203"]   # 13 steps an epoch, the last of 11 rows: 6 + 5
    one = run_ranks(None, [program("keras_metrics.py"), str(tmp_path / "one")] + args, cwd=tmp_path)
    assert one.returncode == 0, one.output
    two = run_ranks(2, [program("keras_metrics.py"), str(tmp_path / "two")] + args, cwd=tmp_path)
    assert two.returncode == 0, two.output
    (ref_w, ref), (w0, logs0), (w1, logs1) = _load(tmp_path / "one", 0), _load(tmp_path / "two", 0), \
        _load(tmp_path / "two", 1)
    for k in ref_w:
        assert np.array_equal(w0[k], w1[k]), f"{k} differs between the ranks"
    assert logs0 == logs1   # every rank reports the global figures
    assert set(ref["history"]) == {f"{p}{m}" for p in ("", "val_") for m in
                                   ("loss", "accuracy", "precision", "recall", "auc", "mse")}
    for part in ("history", "evaluate", "test_on_batch", "train_on_batch"):
        assert logs0[part].keys() == ref[part].keys()
        for k, want in ref[part].items():
            np.testing.assert_allclose(logs0[part][k], want, rtol=1e-5, atol=1e-7, err_msg=f"{part} {k}")
    assert np.asarray(ref["history"]["recall"]).shape == (3, 2)   # two thresholds: one value each


def test_data_parallel_outside_mpi_is_one_device():
    import cgvm.keras as keras

    d = keras.distribution.DataParallel()
    assert d.devices == ["cpu:0"] and keras.distribution.list_devices() == ["cpu:0"]
    with d.scope():
        assert keras.distribution.distribution() is d
    assert keras.distribution.distribution() is None
    with pytest.raises(Exception, match="2 devices, but this run has 1 MPI rank"):
        keras.distribution.DataParallel(devices=["cpu:0", "cpu:1"])


def test_a_mean_metric_split_in_two_sums_to_the_whole_batch():
    """What each rank contributes for a mean metric: [weighted sum, weight]; the halves' totals give the
    whole batch's weighted mean (a mean of the halves' means would not, with uneven weights)."""
    import cgvm
    import cgvm.keras as keras
    from cgvm.ir import TensorType, input_value

    rng = np.random.default_rng(3)
    t = (rng.random((9, 1)) > 0.5).astype(np.float32)
    p = rng.random((9, 1)).astype(np.float32)
    w = np.concatenate([rng.uniform(0.1, 0.5, 5), rng.uniform(2.0, 3.0, 4)]).astype(np.float32)
    metric = keras.metrics.BinaryAccuracy()
    tv, pv = input_value(TensorType((None, 1)), "t"), input_value(TensorType((None, 1)), "p")
    wv = input_value(TensorType((None,)), "w")
    whole = cgvm.compile([tv, pv, wv], metric.batch_value(tv, pv, wv))
    sums = cgvm.compile([tv, pv, wv], metric.batch_sums(tv, pv, wv))
    halves = [np.asarray(sums(t[s], p[s], w[s]), np.float64) for s in (slice(0, 5), slice(5, 9))]
    hit = ((p > 0.5) == (t > 0.5)).ravel()
    want = float((hit * w).sum() / w.sum())
    assert abs(metric.result_from_sums(halves[0] + halves[1]) - want) < 1e-6
    assert abs(float(whole(t, p, w)) - want) < 1e-6
    means = [metric.result_from_sums(h) for h in halves]
    assert abs((means[0] + means[1]) / 2 - want) > 1e-3   # what averaging the ranks' values reported
    unweighted = cgvm.compile([tv, pv], metric.batch_sums(tv, pv))
    assert np.asarray(unweighted(t, p)).tolist() == [float(hit.sum()), 9.0]
