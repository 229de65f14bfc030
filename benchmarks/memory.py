"""Memory rows (issue 6): peak memory of AlexNet- and ResNet-18-shaped inference and training, with and
without planning, with recomputation, and the recomputation trade-off on a 100-block chain.

Figures come from ``cgvm.compiler.memory_report`` (the program's live bytes simulated instruction
by instruction: weights, inputs, planned buffers, dynamic allocations). Unless ``quick``, each
program also runs once under tracemalloc: the *measured* peak adds what kernels allocate inside
(im2col columns, padded copies), which no plan sees. Targets (lower is better):

* inference: peak <= 1.1 x (weights + the two largest activations alive at one time);
* training: activation memory <= 0.5 x the unplanned total (every intermediate in its own buffer);
* 100-block dense+tanh chain trained with recomputation: activation memory <= 0.25 x the planned
  activation memory without it, at <= 1.35 x the time.
"""
from __future__ import annotations

import tracemalloc
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from cgvm.compiler.memory_report import memory_report

from . import nets
from .harness import Row, measure

MIB = 2 ** 20


@dataclass
class MemoryRow:
    """One figure with its target (None: reported only)."""

    name: str
    measured: float
    target: Optional[float]
    unit: str                # "MiB" or "x"
    detail: str = ""

    @property
    def verdict(self) -> str:
        if self.target is None:
            return "-"
        return "ok" if self.measured <= self.target else "MISSED"


def _fmt(value: float, unit: str) -> str:
    return f"{value:.2f}x" if unit == "x" else f"{value:.1f} MiB"


def table(rows: List[MemoryRow]) -> str:
    lines = ["| memory benchmark | measured | target | | detail |", "|---|---|---|---|---|"]
    for r in rows:
        target = "-" if r.target is None else f"<= {_fmt(r.target, r.unit)}"
        lines.append(f"| {r.name} | {_fmt(r.measured, r.unit)} | {target} | {r.verdict} | {r.detail} |")
    return "\n".join(lines)


def measured_peak(fn: Callable[..., Any], args: tuple, report: Dict[str, Any]) -> int:
    """Weights + constants + inputs + planned buffers + the most bytes a call allocates (tracemalloc)."""
    fn(*args)                      # planned buffers are allocated once, before the traced call
    tracemalloc.start()
    try:
        fn(*args)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return report["weights"] + report["constants"] + report["inputs"] + report["planned"] + peak


def net_rows(label: str, make: Callable[..., nets.Net], batch: int, quick: bool) -> List[MemoryRow]:
    rows: List[MemoryRow] = []
    net = make(batch)
    fn = nets.inference(net)
    rep = memory_report(fn)
    keep_all = rep["weights"] + rep["inputs"] + rep["unplanned"] + rep["outputs"]
    freed = rep["weights"] + rep["inputs"] + rep["liveness_peak"] + rep["outputs"]
    floor = rep["weights"] + rep["two_largest_live"]
    detail = (f"weights {rep['weights'] / MIB:.1f} + two largest live {rep['two_largest_live'] / MIB:.1f} MiB; "
              f"unplanned {keep_all / MIB:.1f} MiB kept, {freed / MIB:.1f} MiB freed after last use")
    if not quick:
        x, _ = nets.batch(net)
        detail += f"; measured with kernel scratch {measured_peak(fn, (x,), rep) / MIB:.1f} MiB"
    rows.append(MemoryRow(f"{label} inference peak, batch {batch}", rep["peak"] / MIB, 1.1 * floor / MIB, "MiB",
                          detail))

    for recompute in (None, "sqrt"):
        net = make(batch, train=True)
        fn = nets.train_step(net, recompute=recompute)
        rep = memory_report(fn)
        keep_all = rep["weights"] + rep["inputs"] + rep["unplanned"] + rep["outputs"]
        detail = (f"peak {rep['peak'] / MIB:.1f} MiB (unplanned: {keep_all / MIB:.1f} MiB); activations "
                  f"{rep['activation_peak'] / MIB:.1f} MiB vs {rep['unplanned'] / MIB:.1f} MiB unplanned")
        if not quick:
            detail += f"; measured with kernel scratch {measured_peak(fn, nets.batch(net), rep) / MIB:.1f} MiB"
        if recompute is None:
            rows.append(MemoryRow(f"{label} training step, batch {batch}: activations / unplanned",
                                  rep["activation_peak"] / max(rep["unplanned"], 1), 0.5, "x", detail))
        else:
            detail += (f"; {rep['recompute_checkpoints']} checkpoints, {rep['recomputed_nodes']} nodes recomputed, "
                       f"activations {rep['recompute_saving']:.2f}x of planned")
            rows.append(MemoryRow(f"{label} training step, batch {batch}, recomputation: peak", rep["peak"] / MIB,
                                  None, "MiB", detail))
    return rows


def chain_rows(quick: bool, blocks: int = 100) -> List[MemoryRow]:
    plain_net, recompute_net = nets.dense_chain(blocks), nets.dense_chain(blocks)
    plain = nets.train_step(plain_net)
    recomputed = nets.train_step(recompute_net, recompute="sqrt")
    base, rec = memory_report(plain), memory_report(recomputed)
    ratio = rec["activation_peak"] / base["activation_peak"]
    shape = tuple(plain_net.x.shape)
    args, args2 = nets.batch(plain_net), nets.batch(recompute_net)
    detail = (f"batch {shape[0]}, width {shape[1]}: {rec['activation_peak'] / MIB:.2f} vs "
              f"{base['activation_peak'] / MIB:.2f} MiB; {rec['recompute_checkpoints']} checkpoints, "
              f"{rec['recomputed_nodes']} nodes recomputed")
    if not quick:
        detail += (f"; measured peaks {measured_peak(recomputed, args2, rec) / MIB:.1f} vs "
                   f"{measured_peak(plain, args, base) / MIB:.1f} MiB")
    rows = [MemoryRow(f"{blocks}-block dense+tanh chain training: activations with / without recomputation",
                      ratio, 0.25, "x", detail)]
    timing = Row("recompute time", number=3 if quick else 5, rounds=3 if quick else 7)
    timing.add("recompute", lambda: recomputed(*args2))
    timing.add("plain", lambda: plain(*args))
    measure(timing)
    t_rec, t_plain = timing.results["recompute"], timing.results["plain"]
    rows.append(MemoryRow(f"{blocks}-block dense+tanh chain training: time with / without recomputation",
                          t_rec / t_plain, 1.35, "x", f"{t_rec * 1e3:.1f} vs {t_plain * 1e3:.1f} ms per step "
                          "(medians, interleaved)"))
    return rows


def rows(quick: bool = False, only: Optional[str] = None) -> List[MemoryRow]:
    """All memory rows, or those whose name contains ``only`` ("memory" selects them all)."""
    groups = [("100-block dense+tanh chain training", lambda: chain_rows(quick)),
              ("AlexNet", lambda: net_rows("AlexNet", nets.alexnet, 16, quick)),
              ("ResNet-18", lambda: net_rows("ResNet-18", nets.resnet18, 16, quick))]
    out: List[MemoryRow] = []
    for label, make in groups:
        if only is None or only == "memory" or only in label:
            out += make()
    return [r for r in out if only is None or only == "memory" or only in r.name]


def report(quick: bool = False, only: Optional[str] = None) -> str:
    """The memory table, or "" when ``only`` selects no memory row."""
    selected = rows(quick, only)
    return table(selected) if selected else ""


if __name__ == "__main__":
    print(report())
