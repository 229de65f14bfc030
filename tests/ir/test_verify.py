"""The verifier: topological order, single assignment, back-links, and types that agree with the op's rule.

Broken graphs cannot come out of the builder, so each test assembles one by hand (``Graph(...,
nodes=...)`` skips the checks a normal construction does) the way a faulty pass might.
"""
from __future__ import annotations

import numpy as np
import pytest

import cgvm
from cgvm.errors import VerifyError
from cgvm.ir import Graph, Node, TensorType, Value, input_value, param_value, verify
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R


def f32(*shape):
    return TensorType(shape, "float32")


def _hand_node(op, inputs, out_types, attrs=None, source=None):
    """A node with the given output types, not checked by anyone (as a buggy pass would make it)."""
    node = Node(op, inputs, op.check_attrs(attrs or {}), source=source)
    node.outputs = tuple(Value(t, node=node, index=i) for i, t in enumerate(out_types))
    return node


def test_graphs_from_the_builder_and_from_grad_verify():
    x = input_value(TensorType([None, 4], "float32"), "x")
    w = param_value("w", f32(4))
    cost = R.sum(E.tanh(E.mul(x, w)))
    verify(Graph([x], [cost]))
    verify(Graph([x], [cgvm.grad(cost, w)]))


def test_output_type_that_disagrees_with_the_rule():
    x = input_value(f32(2, 3), "x")
    node = _hand_node(E.exp, [x], [f32(3, 2)], source="model.py:12")
    g = Graph([x], list(node.outputs), nodes=[node], name="bad")
    with pytest.raises(VerifyError) as info:
        verify(g)
    msg = str(info.value)
    assert "op exp (at model.py:12)" in msg
    assert "float32[3,2]" in msg and "rule says float32[2,3]" in msg


def test_output_dtype_that_disagrees_with_the_rule():
    x = input_value(f32(2), "x")
    node = _hand_node(E.cast, [x], [TensorType([2], "float32")], {"dtype": "int32"})
    with pytest.raises(VerifyError, match=r"rule says int32\[2\]"):
        verify(Graph([x], list(node.outputs), nodes=[node]))


def test_unknown_dims_agree_with_known_ones():
    x = input_value(TensorType([None, 3], "float32"), "x")
    node = _hand_node(E.exp, [x], [f32(5, 3)])  # more specific than the rule: allowed
    verify(Graph([x], list(node.outputs), nodes=[node]))


def test_wrong_number_of_outputs_in_a_rule_is_reported():
    x = input_value(f32(2), "x")
    node = _hand_node(R.sum, [x], [f32(2)])  # sum over everything gives a scalar
    with pytest.raises(VerifyError, match=r"rule says float32\[\]"):
        verify(Graph([x], list(node.outputs), nodes=[node]))


def test_use_before_def():
    x = input_value(f32(2), "x")
    a = E.exp(x)
    b = E.tanh(a)
    g = Graph([x], [b], nodes=[b.node, a.node], name="swapped")
    with pytest.raises(VerifyError, match=r"op tanh .*input %\d+ is used before it is defined"):
        verify(g)


def test_value_from_outside_the_graph():
    x = input_value(f32(2), "x")
    stray = input_value(f32(2), "stray")
    y = E.add(x, stray)
    with pytest.raises(VerifyError, match="used before it is defined"):
        verify(Graph([x], [y], nodes=[y.node]))


def test_a_value_assigned_twice():
    x = input_value(f32(2), "x")
    y = E.exp(x)
    twin = Node(E.exp, [x], {})
    twin.outputs = (y,)  # shares the first node's output
    with pytest.raises(VerifyError, match="assigned twice|does not point back"):
        verify(Graph([x], [y], nodes=[y.node, twin]))


def test_output_that_does_not_point_back_to_its_node():
    x = input_value(f32(2), "x")
    y = E.exp(x)
    other = Node(E.exp, [x], {})
    other.outputs = (Value(f32(2), node=y.node, index=0),)
    with pytest.raises(VerifyError, match="does not point back"):
        verify(Graph([x], list(other.outputs), nodes=[other]))


def test_graph_output_never_computed():
    x = input_value(f32(2), "x")
    y = E.exp(x)
    with pytest.raises(VerifyError, match="never computed"):
        verify(Graph([x], [y], nodes=[]))


def test_rule_that_fails_on_the_stored_inputs():
    x = input_value(f32(2, 3), "x")
    node = _hand_node(R.sum, [x], [f32(2)], {"axis": (1,)})
    node.attrs = {"axis": (7,), "keepdims": False}  # changed after the check, as a buggy pass might
    with pytest.raises(VerifyError, match="type rule fails"):
        verify(Graph([x], list(node.outputs), nodes=[node]))


def test_params_and_constants_need_no_definition():
    x = input_value(f32(2), "x")
    w = param_value("w", f32(2))
    y = E.add(E.mul(x, w), np.float32(1.0))
    verify(Graph([x], [y]))
    verify(Graph([], [w]))
