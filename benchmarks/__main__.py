"""``python -m benchmarks [--quick] [--only NAME]``: run the suite and print the table of ratios."""
from __future__ import annotations

import argparse
import sys

from .harness import machine, measure, steady_allocator, table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--only", default=None, help="run rows whose name contains this text")
    args = ap.parse_args(argv)
    steady = steady_allocator()
    from . import caffe_nets, core, keras_rows, onnx_rows, resnet_row, theano_rows

    rows = (core.rows(quick=args.quick) + theano_rows.rows(quick=args.quick) + caffe_nets.rows(quick=args.quick)
            + resnet_row.rows(quick=args.quick) + keras_rows.rows(quick=args.quick) + onnx_rows.rows(quick=args.quick))
    if args.only:
        rows = [r for r in rows if args.only in r.name]
    done = []
    for r in rows:
        measure(r)
        done.append(r)
        print(f"done: {r.name}", file=sys.stderr)
    print(f"Machine: {machine()}" + (", glibc mmap threshold 64 MiB (benchmarks.harness.steady_allocator)"
                                      if steady else "") + "\n")
    print(table(done))
    from . import memory

    memory_table = memory.report(quick=args.quick, only=args.only)
    if memory_table:
        print("\n" + memory_table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
