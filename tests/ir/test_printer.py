"""The text form of a graph: one readable line per node, stable, with names, attributes, types and sources."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import cgvm  # noqa: F401  (registers the ops)
from cgvm.ir import Graph, OpSchema, TensorType, apply, format_graph, input_value, param_value, source_scope
from cgvm.ir.attrs import Array, GraphAttr
from cgvm.ir.opschema import OPS
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R

HERE = __file__


def _line() -> int:
    return inspect.currentframe().f_back.f_lineno


def _small_net():
    """A graph with a named input, an unnamed input, a parameter, constants, attributes and sources."""
    x = input_value(TensorType([None, 3], "float32"), "x")
    extra = input_value(TensorType([2], "float32"))
    w = param_value("w", TensorType([3], "float32"))
    with source_scope("net.prototxt:4 (layer ip)"):
        y = E.add(E.mul(x, w, name="scale"), 2.0)
    s = R.sum(E.relu(y, negative_slope=0.5), axis=1, keepdims=True)
    outs = [s, E.cast(s, dtype="int32"), E.mul(y, np.arange(3, dtype=np.float32)),
            E.mul(y, np.ones((3, 3, 3), np.float32))]
    return Graph([x, extra], outs, name="net")


EXPECTED = """\
graph net(%x: float32[?,3], %1: float32[2]) {
  params %w: float32[3]
  %2 = mul(%x, %w) : float32[?,3]
  %3 = add(%2, 2.0) : float32[?,3]
  %4 = relu(%3) {negative_slope=0.5} : float32[?,3]
  %5 = sum(%4) {axis=(1,), keepdims=True} : float32[?,1]
  %6 = cast(%5) {dtype=int32} : int32[?,1]
  %7 = mul(%3, const<float32[3]>) : float32[?,3]
  %8 = mul(%3, const<float32[3,3,3]>) : float32[3,3,3]
  return %5, %6, %7, %8
}"""


def test_text_form_without_sources_is_exactly_this():
    assert format_graph(_small_net(), show_source=False) == EXPECTED


def test_text_is_stable_across_rebuilds():
    # Value ids grow with every value ever built; the text numbers values by position only
    a, b = _small_net(), _small_net()
    assert a.nodes[0].outputs[0].id != b.nodes[0].outputs[0].id
    assert str(a) == str(b)


def test_sources_and_node_names_are_shown():
    text = str(_small_net())
    lines = text.splitlines()
    assert lines[2].endswith("# 'scale' net.prototxt:4 (layer ip)")
    assert lines[3].endswith("# net.prototxt:4 (layer ip)")
    assert lines[4].endswith(f"# {HERE}:{_source_line_of_relu()}")


def _source_line_of_relu() -> int:
    src, start = inspect.getsourcelines(_small_net)
    return start + next(i for i, text in enumerate(src) if "E.relu(" in text)


def test_a_python_source_is_file_and_line():
    x = input_value(TensorType([2], "float32"), "x")
    line = _line(); y = E.exp(x)  # noqa: E702
    assert f"%1 = exp(%x) : float32[2]  # {HERE}:{line}" in str(Graph([x], [y]))


def test_scalar_constants_print_as_their_value_and_small_arrays_inline():
    x = input_value(TensorType([2], "int64"), "x")
    y = E.mul(E.add(x, 3), -1)
    g = Graph([x], [y])
    text = format_graph(g, show_source=False)
    assert "add(%x, 3)" in text and "mul(%1, -1)" in text


def test_graph_without_inputs_or_params():
    w = param_value("w", TensorType([2], "float32"))
    g = Graph([], [E.exp(w)], name="p")
    assert format_graph(g, show_source=False) == (
        "graph p() {\n  params %w: float32[2]\n  %0 = exp(%w) : float32[2]\n  return %0\n}")


@pytest.fixture
def with_graph_op():
    """An IR-only op that holds an array and a sub-graph (printing needs no kernel)."""
    op = OpSchema("_test_printer_apply", attrs={"body": GraphAttr(), "table": Array()},
                  infer=lambda types, body, table: types[0])
    yield op
    del OPS[op.name]


def test_sub_graphs_are_printed_indented_under_their_node(with_graph_op):
    a = input_value(TensorType([2], "float32"), "a")
    body = Graph([a], [E.tanh(a)], name="body")
    x = input_value(TensorType([2], "float32"), "x")
    y = apply(with_graph_op, [x], {"body": body, "table": np.array([1, 2], np.int32)})
    text = format_graph(Graph([x], [y], name="outer"), show_source=False)
    assert text == (
        "graph outer(%x: float32[2]) {\n"
        "  %1 = _test_printer_apply(%x) {table=[1,2]} : float32[2]\n"
        "    body =\n"
        "      graph body(%a: float32[2]) {\n"
        "        %1 = tanh(%a) : float32[2]\n"
        "        return %1\n"
        "      }\n"
        "  return %1\n"
        "}")


def test_large_array_attributes_are_summarized(with_graph_op):
    a = input_value(TensorType([2], "float32"), "a")
    body = Graph([a], [a], name="identity")
    x = input_value(TensorType([2], "float32"), "x")
    y = apply(with_graph_op, [x], {"body": body, "table": np.zeros((3, 4), np.float64)})
    assert "{table=<float64[3, 4]>}" in format_graph(Graph([x], [y]), show_source=False)
