"""Graph construction: topological order, closedness (MissingInputError), parameters, leaves, replace."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import cgvm  # noqa: F401  (registers the ops)
from cgvm.errors import MissingInputError
from cgvm.ir import (CONST, INPUT, NODE, PARAM, Graph, TensorType, const_value, input_value, param_value,
                     source_scope, toposort)
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R

HERE = __file__


def _line() -> int:
    """The caller's line number: sources recorded in nodes say file:line of the building call."""
    return inspect.currentframe().f_back.f_lineno


def f32(*shape):
    return TensorType(shape, "float32")


def _assert_topological(graph: Graph) -> None:
    produced_at = {id(o): i for i, n in enumerate(graph.nodes) for o in n.outputs}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            if id(v) in produced_at:
                assert produced_at[id(v)] < i, f"{node} reads {v} before it is computed"


def test_nodes_are_in_topological_order_for_a_diamond_and_shared_subexpressions():
    x = input_value(f32(3), "x")
    a = E.exp(x)
    b = E.tanh(a)
    c = E.neg(a)
    d = E.add(b, c)
    e = E.mul(d, a)           # `a` is read by three nodes, computed once
    g = Graph([x], [e, b])
    _assert_topological(g)
    assert len(g.nodes) == 5
    assert [n.op.name for n in g.nodes][0] == "exp"
    assert g.nodes[-1] is e.node
    # the same outputs give the same order every time
    assert [n.id for n in Graph([x], [e, b]).nodes] == [n.id for n in g.nodes]


def test_deep_chain_does_not_recurse():
    x = input_value(f32(2), "x")
    y = x
    for _ in range(3000):  # deeper than Python's recursion limit
        y = E.neg(y)
    g = Graph([x], [y])
    assert len(g.nodes) == 3000
    _assert_topological(g)


def test_only_what_the_outputs_need_is_collected():
    x = input_value(f32(2), "x")
    used = E.exp(x)
    E.tanh(x)  # built, but not an output's ancestor
    g = Graph([x], [used])
    assert [n.op.name for n in g.nodes] == ["exp"]


def test_inputs_cut_the_graph():
    x = input_value(f32(2), "x")
    h = E.exp(x)
    y = E.tanh(h)
    g = Graph([h], [y])  # h is fed from outside: exp is not part of this graph
    assert [n.op.name for n in g.nodes] == ["tanh"]
    assert g.inputs[0].kind == NODE


def test_missing_input_names_the_value_and_the_node_that_reads_it():
    x = input_value(f32(2, 3), "x")
    line = _line(); h = E.relu(x)  # noqa: E702  (the source is this line)
    y = E.exp(h)
    with pytest.raises(MissingInputError) as info:
        Graph([], [y], name="net")
    msg = str(info.value)
    assert "graph 'net'" in msg
    assert x.label() in msg and "float32[2,3]" in msg
    assert "relu" in msg and f"{HERE}:{line}" in msg


def test_missing_input_reports_a_frontend_source():
    x = input_value(f32(4), "data")
    with source_scope("lenet.prototxt:7 (layer relu1)"):
        y = E.relu(x)
    with pytest.raises(MissingInputError, match=r"lenet\.prototxt:7 \(layer relu1\)"):
        Graph([], [y])


def test_params_and_constants_are_leaves_not_inputs():
    x = input_value(f32(2), "x")
    w = param_value("w", f32(2))
    c = const_value(np.ones(2, np.float32))
    y = E.add(E.mul(x, w), c)
    g = Graph([x], [y])
    assert g.inputs == (x,)
    assert g.params == (w,)
    kinds = {v.kind for v in g.leaves()}
    assert kinds == {INPUT, PARAM, CONST}


def test_params_are_collected_by_name_in_order_of_first_use():
    x = input_value(f32(2), "x")
    b = param_value("b", f32(2))
    w1 = param_value("w", f32(2))
    w2 = param_value("w", f32(2))  # another Value for the same Workspace entry
    y = E.add(E.mul(E.mul(x, w1), w2), b)
    g = Graph([x], [y])
    assert [p.name for p in g.params] == ["w", "b"]
    assert g.params[0] is w1


def test_a_param_that_is_only_an_output_is_a_param():
    w = param_value("w", f32(3))
    g = Graph([], [w])
    assert g.nodes == () and g.params == (w,)


def test_values_lists_inputs_params_and_node_outputs():
    x = input_value(f32(2), "x")
    w = param_value("w", f32(2))
    y = E.mul(x, w)
    g = Graph([x], [y])
    assert list(g.values()) == [x, w, y]


def test_consumers_maps_each_value_to_the_nodes_that_read_it():
    x = input_value(f32(2), "x")
    a = E.exp(x)
    b = E.add(a, a)
    c = E.neg(a)
    g = Graph([x], [b, c])
    users = g.consumers()
    assert users[id(a)] == [b.node, b.node, c.node]  # once per read, in node order
    assert users[id(x)] == [a.node]


def test_replace_returns_a_new_graph_and_leaves_the_old_one_alone():
    x = input_value(f32(2), "x")
    y = E.exp(x)
    g = Graph([x], [y], name="g")
    z = E.neg(x)
    g2 = g.replace([z.node], outputs=[z])
    assert g2 is not g and g2.name == "g"
    assert [n.op.name for n in g.nodes] == ["exp"]
    assert [n.op.name for n in g2.nodes] == ["neg"]


def test_toposort_stops_at_given_values():
    x = input_value(f32(2), "x")
    a = E.exp(x)
    b = E.tanh(a)
    assert [n.op.name for n in toposort([b])] == ["exp", "tanh"]
    assert [n.op.name for n in toposort([b], stop=[a])] == ["tanh"]


def test_multi_output_graph_reports_sizes():
    x = input_value(f32(2, 3), "x")
    g = Graph([x], [R.sum(x, axis=0), E.exp(x)], name="two")
    assert repr(g) == "<Graph two: 1 inputs, 2 nodes, 2 outputs>"


def test_source_scope_overrides_the_python_source_and_nests():
    x = input_value(f32(2), "x")
    with source_scope("net.prototxt:3 (layer a)"):
        a = E.exp(x)
        with source_scope("net.prototxt:9 (layer b)"):
            b = E.tanh(a)
        c = E.neg(b)
    line = _line(); d = E.relu(c)  # noqa: E702
    assert a.node.source == "net.prototxt:3 (layer a)"
    assert b.node.source == "net.prototxt:9 (layer b)"
    assert c.node.source == "net.prototxt:3 (layer a)"
    assert d.node.source == f"{HERE}:{line}"
    assert a.source == a.node.source  # a value's source is its node's
