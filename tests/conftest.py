"""Shared fixtures: the backends that can run here."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from cgvm.backend import available_backends  # noqa: E402

BACKENDS = available_backends()


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


# ----------------------------------------------------------------------------- save/load of compiled graphs

def pytest_configure(config):
    config.addinivalue_line("markers", "no_roundtrip: skip the save/load check of graphs this test compiles")


@pytest.fixture(autouse=True)
def _roundtrip_compiled_graphs(request, monkeypatch):
    """Every graph given to cgvm.compile is also saved and loaded, and must come back the same.

    Cheap (protobuf in memory, the copy is not compiled). Off for one test with
    ``@pytest.mark.no_roundtrip``, for a run with ``CGVM_TEST_ROUNDTRIP=0``.
    """
    if os.environ.get("CGVM_TEST_ROUNDTRIP") == "0" or request.node.get_closest_marker("no_roundtrip"):
        yield
        return
    from cgvm.compiled import Function

    build = Function.__init__

    def build_and_roundtrip(self, *args, **kwargs):
        build(self, *args, **kwargs)
        _check_roundtrip(self.source_graph)

    monkeypatch.setattr(Function, "__init__", build_and_roundtrip)
    yield


def _check_roundtrip(graph):
    from cgvm.errors import CgvmError
    from cgvm.ir import serialize

    try:
        data = serialize.graph_to_proto(graph).SerializeToString()
        copy = serialize.graph_from_proto(serialize.pb.GraphProto.FromString(data))
        problem = serialize.graph_difference(graph, copy)
    except CgvmError as exc:
        problem = f"{type(exc).__name__}: {exc}"
    if problem:
        text = "\n".join(str(graph).splitlines()[:80])
        pytest.fail(f"graph {graph.name!r} given to cgvm.compile does not survive save/load "
                    f"(check in tests/conftest.py; mark the test no_roundtrip to skip it):\n{problem}\n{text}")
