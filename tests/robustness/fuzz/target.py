"""What the fuzzer needs to know about one loader: valid seed files, how to load one, what counts as clean.

A target's ``load`` builds whatever the loader writes into (a net, a model, a solver), takes a
fingerprint of it, runs the loader on the file, and, when the loader raises, compares the fingerprint
again and raises :class:`PartialLoad` (chaining the loader's error) if anything changed. The harness
then only has to classify exceptions.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List

from cgvm.errors import CgvmError

#: Outcomes of one case. "ok" and "clean" are good; every other outcome is a bug to report.
OUTCOMES = ("ok", "clean", "other", "alloc", "partial", "hang")


class PartialLoad(Exception):
    """The loader failed after it had already changed its target."""


@dataclass(frozen=True)
class Target:
    name: str                                   # shown in the report, e.g. "caffemodel -> Net.copy_from"
    suffix: str                                 # file name suffix for mutated files (".caffemodel")
    seeds: Callable[[Path], List[bytes]]        # valid files' bytes, made by the test itself in a tmp dir
    load: Callable[[Path], Any]                 # load one file; raise on failure (PartialLoad if changed)


def classify(exc: BaseException | None) -> str:
    """The outcome of a case that returned (``None``) or raised ``exc``."""
    if exc is None:
        return "ok"
    if isinstance(exc, PartialLoad):
        return "partial"
    if isinstance(exc, MemoryError) or (isinstance(exc, ValueError) and "array is too big" in str(exc)):
        return "alloc"
    if isinstance(exc, (CgvmError, FileNotFoundError)):
        return "clean"
    return "other"
