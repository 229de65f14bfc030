"""The fuzz targets of the Keras loaders and graph files are sound: every seed loads, and a failing
load that changed its target is reported as a PartialLoad (so the fuzzer's 'partial' outcome can fire)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("h5py")

from fuzz import targets_graph, targets_keras  # noqa: E402
from fuzz.target import PartialLoad, Target, classify  # noqa: E402

TARGETS = {t.name: t for m in (targets_graph, targets_keras) for t in m.targets()}


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_seed_loads(tmp_path, name):
    target: Target = TARGETS[name]
    seeds = target.seeds(tmp_path)
    assert len(seeds) >= 1
    for i, data in enumerate(seeds):
        path = tmp_path / f"seed{i}{target.suffix}"
        path.write_bytes(data)
        assert target.load(path) is not None
        path.write_bytes(data[: len(data) // 2])
        with pytest.raises(Exception) as info:
            target.load(path)
        assert classify(info.value) == "clean", info.value


def test_a_partial_load_is_reported(tmp_path, monkeypatch):
    """If load_weights assigned one weight and then failed, the weights target says so."""
    import cgvm.frontends.keras.h5_weights as h5w

    target = TARGETS[".weights.h5 -> Model.load_weights"]
    data = target.seeds(tmp_path)[0]
    path = tmp_path / f"w{target.suffix}"
    path.write_bytes(data)

    def assign_then_fail(pairs):
        var, arr = pairs[0]
        var.assign(np.asarray(arr) + 1)
        raise h5w.KerasConfigError("failed after assigning")

    monkeypatch.setattr("cgvm.frontends.keras.saving.assign_all", assign_then_fail)
    with pytest.raises(PartialLoad):
        target.load(path)
