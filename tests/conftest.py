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
    from cgvm.compiled_function import Function

    build = Function.__init__

    def build_and_roundtrip(self, *args, **kwargs):
        build(self, *args, **kwargs)
        _check_roundtrip(self.source_graph)
        _check_first_call_against_reference(self)

    monkeypatch.setattr(Function, "__init__", build_and_roundtrip)
    yield


def _check_first_call_against_reference(function):
    """The first call of every compiled function in the suite is also run by eval_graph, the IR
    interpreter, on the graph as written (no passes, no planning): outputs and updates must agree.
    Off with ``CGVM_TEST_REFERENCE=0``."""
    if os.environ.get("CGVM_TEST_REFERENCE") == "0" or function.workspace.backend.name != "numpy":
        return
    if any(n.op.name.startswith("caffe_python_layer") for n in function.source_graph.nodes):
        return  # user Python code may keep state between calls: running it twice changes its results
    import numpy as np

    from cgvm import eval_graph

    fast_cls = type(function)
    fast = fast_cls.__call__

    def first_call(self, *args):
        fast_cls.__call__ = fast  # only the first call is checked
        graph = self.source_graph
        try:
            inputs = [np.asarray(a, dtype=v.dtype.np) for a, v in zip(args, graph.inputs)]
        except (TypeError, ValueError):
            return fast(self, *args)  # bad arguments: the function itself reports them
        params = {p.name: np.array(self.workspace[p.name], copy=True)
                  for p in graph.params if p.name in self.workspace}
        result = fast(self, *args)
        expected = eval_graph(graph, inputs, params)
        got = [result] if self.single else list(result)
        got += [self.workspace[name] for name in self.update_names]
        for i, (g, e) in enumerate(zip(got, expected)):
            g, e = np.asarray(g), np.asarray(e)
            scale = max(1.0, float(np.max(np.abs(e)))) if e.size and e.dtype.kind == "f" else 1.0
            if g.shape != e.shape or not np.allclose(g, e, rtol=1e-4, atol=1e-5 * scale, equal_nan=True):
                pytest.fail(f"compiled function {graph.name!r}: result {i} differs from eval_graph on the "
                            f"graph as written (check in tests/conftest.py)\nVM: {g!r}\nreference: {e!r}")
        return result

    fast_cls.__call__ = first_call


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
