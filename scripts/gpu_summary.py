"""The GPU check's summary (Markdown on stdout) from what scripts/gpu_check.sh left in its folder.

    python scripts/gpu_summary.py OUTDIR [--rc step=CODE ...]

Reads environment.json, junit_gpu.xml, junit_suite.xml and benchmarks.md; for each test run gives
passed/failed/errors/skipped, whether it finished or ran out of time, and the most common failure
messages. Standard library only.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import xml.etree.ElementTree as ET
from typing import Dict, List, Optional

#: exit codes of a step stopped by its time limit (timeout's own, and 137 when it had to kill)
TIMED_OUT = {124, 137}


def junit_counts(path: str) -> Optional[Dict[str, object]]:
    """Counts and failure messages of a junit xml file (None: no file, or not parseable)."""
    if not os.path.exists(path):
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return None
    counts = collections.Counter()
    reasons: collections.Counter = collections.Counter()
    for case in root.iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "errors"
                message = (child.get("message") or child.text or "").strip().splitlines()
                reasons[(message[0] if message else child.tag)[:160]] += 1
            elif child.tag == "skipped":
                outcome = "skipped"
        counts[outcome] += 1
    return {"counts": dict(counts), "total": sum(counts.values()), "reasons": reasons.most_common(12)}


def section(title: str, path: str, rc: Optional[int]) -> List[str]:
    lines = [f"## {title}", ""]
    info = junit_counts(path)
    if info is None:
        lines.append(f"no results ({os.path.basename(path)} missing: the run did not start or was killed); exit {rc}")
        return lines + [""]
    c = info["counts"]
    state = "stopped by its time limit (partial)" if rc in TIMED_OUT else f"finished (exit {rc})"
    lines.append(f"{info['total']} tests: {c.get('passed', 0)} passed, {c.get('failed', 0)} failed, "
                 f"{c.get('errors', 0)} errors, {c.get('skipped', 0)} skipped; {state}")
    if info["reasons"]:
        lines += ["", "Most common failure messages:", ""]
        lines += [f"- {n} x `{msg}`" for msg, n in info["reasons"]]
    return lines + [""]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--rc", action="append", default=[], help="step=exit code")
    args = ap.parse_args(argv)
    rcs = {}
    for item in args.rc:
        step, _, code = item.partition("=")
        rcs[step] = int(code) if code.lstrip("-").isdigit() else None
    out = ["# GPU check", ""]
    env_path = os.path.join(args.outdir, "environment.json")
    if os.path.exists(env_path):
        with open(env_path) as f:
            env = json.load(f)
        for row in env.get("rows", []):
            if row["name"] in ("python", "nvidia-smi", "cupy", "cudnn", "torch", "cgvm"):
                out.append(f"- {row['name']}: {row['detail']}")
        if env.get("tests_will_skip_for"):
            out.append(f"- missing (their tests skip): {', '.join(env['tests_will_skip_for'])}")
        out.append("")
    out += section("GPU tests (tests/backend, tests/ops on both backends, DLPack, caffe CLI)",
                   os.path.join(args.outdir, "junit_gpu.xml"), rcs.get("gpu"))
    out += section("Whole suite with CGVM_BACKEND=cupy", os.path.join(args.outdir, "junit_suite.xml"), rcs.get("suite"))
    out += ["## Benchmarks (cgvm on CuPy against PyTorch CUDA eager, same GPU, one run)", ""]
    bench = os.path.join(args.outdir, "benchmarks.md")
    if os.path.exists(bench):
        with open(bench) as f:
            out.append(f.read().rstrip())
        if rcs.get("benchmarks") in TIMED_OUT:
            out += ["", "(stopped by its time limit: the rows above are those that finished)"]
    else:
        out.append(f"no benchmark table (exit {rcs.get('benchmarks')}; see benchmarks.txt)")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
