"""Before/after comparison of two checkouts: ``python -m benchmarks.ab BEFORE AFTER [--rounds N]``.

A change should make no row slower. Times from different runs do not compare on a shared machine
(its phase moves every implementation by 1.2-1.9x within minutes), so this runs the whole suite
alternately in the two checkouts (after, before, after, ...), each in its own process, and compares
each row two ways:

- ``after/before``: the medians over rounds of cgvm's own time;
- ``normalized``: the same ratio with each run's cgvm time first divided by the peers' times of that
  run (PyTorch, PyTensor, NumPy, Keras: whichever the row has), which cancels most of the machine's
  phase, since both runs time the peers with the same code.

``--tables FILE...`` compares tables already written by ``python -m benchmarks`` (named
``*before*``/``*after*``) instead of running anything.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
Table = Dict[str, Dict[str, float]]  # row name -> implementation -> seconds


def parse_time(text: str) -> Optional[float]:
    m = re.fullmatch(r"([0-9.]+) (us|ms|s)", text.strip())
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def parse_table(text: str) -> Table:
    """The timing table of one ``python -m benchmarks`` run (the memory table is skipped)."""
    rows: Table = {}
    header: List[str] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            header = [] if not line.strip() else header
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "benchmark":
            header = cells
        elif header and not set(cells[0]) <= set("-"):
            times = {h: parse_time(c) for h, c in zip(header[1:], cells[1:]) if "/" not in h}
            rows[cells[0]] = {h: t for h, t in times.items() if t is not None}
    return rows


def compare(before: List[Table], after: List[Table]) -> List[Tuple[str, float, float]]:
    """(row, after/before of cgvm's median time, after/before normalized by the row's peers)."""
    out = []
    for name in before[0]:
        b = [t[name] for t in before if name in t and "cgvm" in t[name]]
        a = [t[name] for t in after if name in t and "cgvm" in t[name]]
        if not a or not b:
            continue
        raw = statistics.median(r["cgvm"] for r in a) / statistics.median(r["cgvm"] for r in b)
        peers = [p for p in a[0] if p != "cgvm" and all(p in r for r in a + b)]

        def relative(runs):
            return statistics.median(r["cgvm"] / statistics.geometric_mean([r[p] for p in peers]) for r in runs)

        norm = relative(a) / relative(b) if peers else float("nan")
        out.append((name, raw, norm))
    return out


def run_suite(checkout: Path, extra: List[str]) -> str:
    env = dict(os.environ, PYTHONPATH=str(checkout), CGVM_NUM_THREADS=os.environ.get("CGVM_NUM_THREADS", "1"))
    env.setdefault("KERAS_BACKEND", "torch")
    return subprocess.run([sys.executable, "-m", "benchmarks", *extra], cwd=checkout, env=env,
                          capture_output=True, text=True, check=True).stdout


def report(rows: List[Tuple[str, float, float]]) -> str:
    lines = ["| benchmark | after/before | normalized by peers |", "|---|---|---|"]
    for name, raw, norm in rows:
        lines.append(f"| {name} | {raw:.2f}x | {'-' if norm != norm else f'{norm:.2f}x'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=__doc__.splitlines()[0])
    ap.add_argument("before", nargs="?", type=Path)
    ap.add_argument("after", nargs="?", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=None)
    ap.add_argument("--tables", nargs="+", type=Path, help="compare saved tables instead of running")
    args = ap.parse_args(argv)
    if args.tables:
        before = [parse_table(p.read_text()) for p in args.tables if "before" in p.name]
        after = [parse_table(p.read_text()) for p in args.tables if "after" in p.name]
    else:
        if not (args.before and args.after):
            ap.error("give BEFORE and AFTER checkouts, or --tables")
        extra = (["--quick"] if args.quick else []) + (["--only", args.only] if args.only else [])
        before, after = [], []
        for i in range(args.rounds):
            after.append(parse_table(run_suite(args.after.resolve(), extra)))
            before.append(parse_table(run_suite(args.before.resolve(), extra)))
            print(f"round {i + 1} of {args.rounds} done", file=sys.stderr)
    if not before or not after:
        ap.error("need at least one 'before' and one 'after' table")
    print(f"{len(before)} before and {len(after)} after runs, alternated\n")
    print(report(compare(before, after)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
