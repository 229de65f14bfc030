"""ONNX's own backend test suite (onnx.backend.test.BackendTest) run against cgvm.onnx.backend.

The node cases are built in memory by the installed onnx package (1,884 in onnx 1.23); the
pytorch-converted, pytorch-operator and simple model cases ship as files in the onnx wheel. Only
the import differs from running ONNX Runtime's backend: ``BackendTest(cgvm.onnx.backend, ...)``.
Every case still failing is listed in onnx_backend_expected_failures.txt with its reason and runs
as an expected failure (an unexpected pass fails the run, so the list stays true). The ``light``
and ``real`` model-zoo cases need downloads and are left out.

Run it alone with ``python -m pytest -q tests/interop/test_onnx_backend.py``.
"""
from __future__ import annotations

import os
import re
import unittest
import warnings

import pytest

onnx = pytest.importorskip("onnx")
import onnx.backend.test  # noqa: E402

import cgvm.onnx.backend as cgvm_backend  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FAILURES_FILE = os.path.join(HERE, "onnx_backend_expected_failures.txt")


def expected_failures(path: str = FAILURES_FILE) -> dict:
    """``{test name: reason}`` from the list (``name  # reason`` a line; a name may be a regex)."""
    found = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, reason = line.partition("#")
            found[name.strip()] = reason.strip()
    return found


# graphs of every case are round-tripped through cgvm's serializer by tests/conftest.py as well
pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

backend_test = onnx.backend.test.BackendTest(cgvm_backend, __name__)
# the model-zoo kinds need downloads (light needs no download but loads Map/Sparse protos and big models)
backend_test.exclude(r"^test_(bvlc_alexnet|densenet121|inception_v1|inception_v2|resnet50|shufflenet|squeezenet|"
                     r"vgg19|zfnet512)_")
backend_test.exclude(r"_cuda$")
for _name, _reason in expected_failures().items():
    backend_test.xfail(rf"^{_name}_cpu$")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    globals().update(backend_test.test_cases)


def test_every_expected_failure_names_a_case_and_a_reason():
    names = set()
    for case in backend_test.test_cases.values():
        names.update(n[:-4] for n in dir(case) if n.startswith("test_") and n.endswith("_cpu"))
    for name, reason in expected_failures().items():
        assert reason, f"{name}: no reason given"
        assert any(re.fullmatch(name, n) for n in names), f"{name} names no case of the suite"
