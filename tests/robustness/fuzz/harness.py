"""A seeded, time-bounded mutation fuzzer over every loader a ``targets_*.py`` module in this folder offers.

    python tests/robustness/fuzz/harness.py --seconds 120 --cases 10000 --seed 0 [--targets NAME ...]

Each case is one valid seed file of a target, mutated: bytes flipped, the file cut short,
bytes inserted or deleted, an interesting integer (0, -1, 2**31, 10**12, ...) spliced into a
number (a text number replaced; a varint or 4/8-byte word overwritten in binary files), or a
text token dropped, repeated, swapped or nested deeper. Cases run in a worker process, one at a
time, each under a deadline: a worker that does not answer in time is killed and restarted, and
the case counts as a hang. Workers cap their address space, so an allocation the operating
system refuses shows as MemoryError ("alloc") rather than taking the machine down.

The report gives counts per target and outcome (target.OUTCOMES); "other", "alloc", "partial"
and "hang" are bugs, and the first few of each are listed with their seed, mutation and error.
The run is deterministic for a seed (the mutations; the time bound decides how many run).
"""
from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing
import os
import random
import re
import resource
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:   # run as a script: make `fuzz.*` importable as the tests do
    sys.path.insert(0, str(HERE.parent))

from fuzz.target import OUTCOMES, Target, classify  # noqa: E402

BAD_OUTCOMES = ("other", "alloc", "partial", "hang")
INTERESTING = (0, 1, -1, 2, 7, 255, 256, 2 ** 15, 2 ** 16, 2 ** 31 - 1, 2 ** 31, 2 ** 32, -2 ** 31,
               10 ** 6, 10 ** 9, 10 ** 12, 2 ** 62, 2 ** 63 - 1, 2 ** 64 - 1)
INTERESTING_TEXT = [str(v) for v in INTERESTING] + ["1e308", "-1e308", "inf", "-inf", "nan", "0.0", "1e-45",
                                                     '""', "true", "{", "}"]


# --------------------------------------------------------------------------- mutations

def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _is_text(data: bytes) -> bool:
    try:
        data[:4096].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in data[:4096]


_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_TOKEN = re.compile(rb'"[^"\n]*"|[\w.+-]+|[{}:]')


def mutate(data: bytes, rng: random.Random) -> Tuple[bytes, str]:
    """One mutated copy of ``data`` and a short name for what was done."""
    text = _is_text(data)
    kinds = ["flip", "truncate", "insert", "delete", "splice_int"]
    if text:
        kinds += ["number", "number", "token_drop", "token_dup", "token_swap", "nest", "line_dup"]
    kind = rng.choice(kinds)
    buf = bytearray(data)
    n = len(buf)
    if kind == "flip" and n:
        for _ in range(rng.choice((1, 1, 2, 4, 8))):
            i = rng.randrange(n)
            buf[i] ^= 1 << rng.randrange(8)
    elif kind == "truncate" and n:
        del buf[rng.randrange(n):]
    elif kind == "insert":
        i = rng.randrange(n + 1)
        chunk = bytes(rng.randrange(256) for _ in range(rng.choice((1, 2, 4, 16))))
        if text and rng.random() < 0.5:
            chunk = rng.choice([b"{", b"}", b":", b" ", b"\n", b'"', b"#", b"\\", b"layer {", b"\xff"])
        buf[i:i] = chunk
    elif kind == "delete" and n:
        i = rng.randrange(n)
        del buf[i:i + rng.choice((1, 2, 4, 16, 64))]
    elif kind == "splice_int" and n:
        value = rng.choice(INTERESTING)
        i = rng.randrange(n)
        form = rng.choice(("varint", "le32", "le64"))
        raw = (_varint(value) if form == "varint" else
               (value & 0xFFFFFFFF).to_bytes(4, "little") if form == "le32" else
               (value & (2 ** 64 - 1)).to_bytes(8, "little"))
        buf[i:i + len(raw)] = raw
    elif kind == "number":
        numbers = list(_NUMBER.finditer(data))
        if numbers:
            m = rng.choice(numbers)
            buf[m.start():m.end()] = rng.choice(INTERESTING_TEXT).encode()
    elif kind in ("token_drop", "token_dup", "token_swap"):
        tokens = list(_TOKEN.finditer(data))
        if len(tokens) >= 2:
            a = rng.choice(tokens)
            if kind == "token_drop":
                del buf[a.start():a.end()]
            elif kind == "token_dup":
                buf[a.end():a.end()] = b" " + a.group()
            else:
                b = rng.choice(tokens)
                first, second = sorted((a, b), key=lambda m: m.start())
                if first.end() <= second.start():
                    buf[second.start():second.end()] = first.group()
                    buf[first.start():first.end()] = second.group()
    elif kind == "nest":
        depth = rng.choice((10, 100, 1000, 5000))
        opens = [m.end() for m in re.finditer(rb"\{", data)]
        i = rng.choice(opens) if opens else rng.randrange(n + 1)
        buf[i:i] = b" layer {" * depth + b" }" * depth * rng.choice((0, 1))
    elif kind == "line_dup":
        lines = data.split(b"\n")
        i = rng.randrange(len(lines))
        lines[i:i] = [lines[i]] * rng.choice((1, 2, 50))
        buf = bytearray(b"\n".join(lines))
    return bytes(buf), kind


# --------------------------------------------------------------------------- targets

def discover_targets(names: Optional[Sequence[str]] = None) -> List[Target]:
    """Every Target of every ``targets_*.py`` module here (filtered by substrings of their names)."""
    found: List[Target] = []
    for path in sorted(HERE.glob("targets_*.py")):
        module = importlib.import_module(f"fuzz.{path.stem}")
        found.extend(module.targets())
    if names:
        found = [t for t in found if any(n.lower() in t.name.lower() for n in names)]
    return found


# --------------------------------------------------------------------------- worker

def _limit_memory(address_space_bytes: int) -> None:
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = address_space_bytes if hard == resource.RLIM_INFINITY else min(address_space_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (ValueError, OSError):
        pass


def _worker(conn, targets: List[Target], workdir: str, address_space_bytes: int) -> None:
    """Run cases sent as (target index, bytes) until told to stop; answer (outcome, summary)."""
    _limit_memory(address_space_bytes)
    os.chdir(workdir)   # solvers write snapshots relative to the working directory
    import warnings

    warnings.simplefilter("ignore")
    counter = 0
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        index, data = message
        target = targets[index]
        counter += 1
        path = Path(workdir) / f"case{counter % 4}{target.suffix}"
        path.write_bytes(data)
        error: Optional[BaseException] = None
        try:
            target.load(path)
        except BaseException as exc:   # classified below; the worker keeps running
            error = exc
        outcome = classify(error)
        summary = ""
        if error is not None:
            summary = f"{type(error).__name__}: {str(error)[:300]}"
            if outcome in BAD_OUTCOMES:
                summary += "\n" + "".join(traceback.format_exception(type(error), error,
                                                                      error.__traceback__)[-6:])
        try:
            conn.send((outcome, summary))
        except Exception:
            return


class _WorkerHandle:
    live: List["_WorkerHandle"] = []

    def __init__(self, targets: List[Target], workdir: str, address_space_bytes: int):
        _WorkerHandle.live.append(self)
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        # not a daemon: the loaders fork guarded readers of their own (the harness kills it when done)
        self.process = context.Process(target=_worker, args=(child, targets, workdir, address_space_bytes))
        self.process.start()
        child.close()

    def run(self, index: int, data: bytes, deadline_s: float) -> Optional[Tuple[str, str]]:
        """The case's (outcome, summary), or None when the worker did not answer in time or died."""
        try:
            self.conn.send((index, data))
            if not self.conn.poll(deadline_s):
                return None
            return self.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            return ("other", f"the worker died (exit code {self.process.exitcode})")

    def stop(self, kill: bool = False) -> None:
        if not kill:
            try:
                self.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            self.process.join(2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self.conn.close()
        if self in _WorkerHandle.live:
            _WorkerHandle.live.remove(self)


# --------------------------------------------------------------------------- the run

def run(seconds: float, cases: int, seed: int, names: Optional[Sequence[str]] = None, *,
        deadline_s: float = 10.0, address_space_bytes: int = 6 << 30, max_examples: int = 3,
        log=None) -> Dict[str, object]:
    """Fuzz every target for at most ``seconds`` in all (an equal share each) and ``cases`` cases each.

    Returns {"targets": {name: {outcome: count}}, "examples": {name: [(outcome, mutation, summary)]},
    "seconds": elapsed}.
    """
    targets = discover_targets(names)
    if not targets:
        raise SystemExit(f"no targets match {names!r}")
    return run_targets(targets, seconds, cases, seed, deadline_s=deadline_s,
                       address_space_bytes=address_space_bytes, max_examples=max_examples, log=log)


def run_targets(targets: Sequence[Target], seconds: float, cases: int, seed: int, *, deadline_s: float = 10.0,
                address_space_bytes: int = 6 << 30, max_examples: int = 3, log=None) -> Dict[str, object]:
    """``run`` over the given targets."""
    os.environ.setdefault("CGVM_MAX_BYTES", "1G")      # a loader's own limit, well below the worker's cap
    os.environ.setdefault("CGVM_READ_TIMEOUT", str(max(1.0, deadline_s / 3)))
    targets = list(targets)
    workdir = tempfile.mkdtemp(prefix="cgvm-fuzz-")
    counts: Dict[str, Counter] = {t.name: Counter() for t in targets}
    examples: Dict[str, List[Tuple[str, str, str]]] = defaultdict(list)
    start = time.monotonic()
    try:
        seeds: List[List[bytes]] = []
        for i, target in enumerate(targets):
            folder = Path(workdir) / f"seeds{i}"
            folder.mkdir()
            seeds.append(target.seeds(folder))
        end = start + seconds
        for i, target in enumerate(targets):
            rng = random.Random(f"{seed}:{target.name}")
            worker = _WorkerHandle(targets, workdir, address_space_bytes)
            # an equal share of the time left: what a fast target does not use goes to the next ones
            stop_at = time.monotonic() + max(0.0, end - time.monotonic()) / (len(targets) - i)
            done = 0
            while done < cases and time.monotonic() < stop_at:
                if done < len(seeds[i]):   # first every seed as it is (each must load), then mutants
                    data, kind = seeds[i][done], "seed"
                else:
                    data, kinds = seeds[i][rng.randrange(len(seeds[i]))], []
                    for _ in range(rng.choice((1, 1, 1, 2, 3))):
                        data, k = mutate(data, rng)
                        kinds.append(k)
                    kind = "+".join(kinds)
                answer = worker.run(i, data, deadline_s)
                if answer is None:
                    worker.stop(kill=True)
                    worker = _WorkerHandle(targets, workdir, address_space_bytes)
                    answer = ("hang", f"no answer in {deadline_s:g} s")
                elif answer[0] == "other" and answer[1].startswith("the worker died"):
                    worker.stop(kill=True)
                    worker = _WorkerHandle(targets, workdir, address_space_bytes)
                outcome, summary = answer
                if kind == "seed" and outcome == "clean":   # a valid file must load
                    outcome, summary = "other", f"a valid seed failed to load: {summary}"
                counts[target.name][outcome] += 1
                if outcome in BAD_OUTCOMES and len(examples[target.name]) < max_examples:
                    examples[target.name].append((outcome, kind, summary))
                    _save_case(workdir, target, outcome, data)
                done += 1
            worker.stop()
            if log is not None:
                log(_format_line(target.name, counts[target.name]))
    finally:
        for worker in list(_WorkerHandle.live):
            worker.stop(kill=True)
        shutil.rmtree(workdir, ignore_errors=True)
    return {"targets": {k: dict(v) for k, v in counts.items()}, "examples": dict(examples),
            "seconds": time.monotonic() - start}


def _save_case(workdir: str, target: Target, outcome: str, data: bytes) -> None:
    """Keep a failing case where $CGVM_FUZZ_KEEP points (a folder), to turn it into a corpus test."""
    keep = os.environ.get("CGVM_FUZZ_KEEP")
    if keep:
        os.makedirs(keep, exist_ok=True)
        name = re.sub(r"\W+", "_", target.name).strip("_")
        Path(keep, f"{name}-{outcome}-{abs(hash(data)) % 10 ** 8}{target.suffix}").write_bytes(data)


def _format_line(name: str, counts: Counter) -> str:
    total = sum(counts.values())
    return f"{name:<45} {total:>7} " + " ".join(f"{o}={counts.get(o, 0)}" for o in OUTCOMES)


def format_report(result: Dict[str, object]) -> str:
    """A table: one row per target, one column per outcome, then examples of bad outcomes."""
    lines = [f"{'target':<45} {'cases':>7} " + " ".join(f"{o:>7}" for o in OUTCOMES)]
    for name, counts in result["targets"].items():
        lines.append(f"{name:<45} {sum(counts.values()):>7} " + " ".join(f"{counts.get(o, 0):>7}" for o in OUTCOMES))
    for name, items in result["examples"].items():
        for outcome, kind, summary in items:
            lines.append(f"\n[{outcome}] {name} ({kind}): {summary}")
    lines.append(f"\n{result['seconds']:.0f} s")
    return "\n".join(lines)


def bad_count(result: Dict[str, object]) -> int:
    return sum(c.get(o, 0) for c in result["targets"].values() for o in BAD_OUTCOMES)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="time for the whole run (shared by the targets)")
    parser.add_argument("--cases", type=int, default=10 ** 9, help="most cases per target")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--targets", nargs="*", default=None, help="substrings of target names")
    parser.add_argument("--deadline", type=float, default=10.0, help="seconds one case may take (else: a hang)")
    parser.add_argument("--json", default="", help="also write the counts as JSON here")
    args = parser.parse_args(argv)
    result = run(args.seconds, args.cases, args.seed, args.targets, deadline_s=args.deadline,
                 log=lambda line: print(line, flush=True))
    print(format_report(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))
    return 1 if bad_count(result) else 0


if __name__ == "__main__":
    sys.exit(main())
