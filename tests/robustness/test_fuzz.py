"""The mutation fuzzer: its watchdog and classification on made-up targets, then a time-bounded run over
every loader (every targets_*.py in fuzz/) that must end with no bad outcome.

CI gives the run CGVM_FUZZ_SECONDS (default 150) in all; the report lists counts per target.
"""
import os
import random
import time

import pytest

from fuzz import harness
from fuzz.target import PartialLoad, Target


def _seeds(folder):
    return [b"layer { name: 'x' num_output: 10 }", b"\x08\x96\x01"]


def _hang(path):
    time.sleep(3600)


def _partial(path):
    raise PartialLoad("changed, then failed")


def _other(path):
    raise KeyError("raw")


def _alloc(path):
    raise MemoryError()


def _ok(path):
    path.read_bytes()


def test_mutations_are_seeded_and_change_the_file():
    data = b'layer { name: "ip" inner_product_param { num_output: 10 } }'
    first = [harness.mutate(data, random.Random(5)) for _ in range(1)]
    again = [harness.mutate(data, random.Random(5)) for _ in range(1)]
    assert first == again
    rng = random.Random(1)
    kinds = {harness.mutate(data, rng)[1] for _ in range(300)}
    assert {"flip", "truncate", "number", "nest", "splice_int", "token_swap"} <= kinds
    rng = random.Random(2)
    assert sum(harness.mutate(data, rng)[0] != data for _ in range(100)) > 80


def test_watchdog_and_outcomes_on_made_up_targets():
    targets = [Target(name, ".bin", _seeds, load) for name, load in
               [("hangs", _hang), ("partial", _partial), ("other", _other), ("alloc", _alloc), ("ok", _ok)]]
    start = time.monotonic()
    result = harness.run_targets(targets, seconds=60, cases=4, seed=0, deadline_s=1.0)
    assert time.monotonic() - start < 40   # the hanging worker was killed and restarted, not waited for
    counts = result["targets"]
    assert counts["hangs"] == {"hang": 4}
    assert counts["partial"] == {"partial": 4}
    assert counts["other"] == {"other": 4}
    assert counts["alloc"] == {"alloc": 4}
    assert counts["ok"] == {"ok": 4}
    assert harness.bad_count(result) == 16
    assert "no answer in 1 s" in harness.format_report(result)


@pytest.mark.no_roundtrip
def test_fuzz_every_loader_without_a_bad_outcome():
    seconds = float(os.environ.get("CGVM_FUZZ_SECONDS", "150"))
    lines = []
    result = harness.run(seconds, 10 ** 9, seed=int(os.environ.get("CGVM_FUZZ_SEED", "0")), log=lines.append)
    report = harness.format_report(result)
    print(report)
    assert harness.bad_count(result) == 0, report
    for name, counts in result["targets"].items():
        assert counts.get("ok", 0) > 0 and sum(counts.values()) >= 5, (name, counts)   # every seed loaded
