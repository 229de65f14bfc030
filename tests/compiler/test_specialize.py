"""Per-signature specialization: identity shape adapters go, and so does work kept only for a shape."""
import numpy as np

import cgvm
from cgvm.compiler.codegen import generate
from cgvm.compiler.specialize import specialize
from cgvm.compiler.memory import infer_slot_types
from cgvm.ir import Graph, TensorType, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import linalg as L
from cgvm.ops import reduce as R
from cgvm.vm.bytecode import CALL


def _program(graph, *shapes):
    program = generate(graph)
    types = infer_slot_types(program, {s: TensorType(shape) for s, shape in zip(program.input_slots, shapes)})
    return program, specialize(program, types)


def _ops(program):
    return [program.nodes[i.node].op.name for i in program.instrs if i.opcode == CALL]


def _unknown(name, n=2):
    return input_value(TensorType((None,) * n), name)


def test_an_output_that_is_an_identity_adapter_returns_its_source_and_the_shape_work_goes():
    """sum_to_like(g, x @ w) as an output: for equal shapes it is g itself, and x @ w is dead."""
    x, w, g = _unknown("x"), _unknown("w"), _unknown("g")
    h = E.tanh(g)
    out = R.sum_to_like(h, L.matmul(x, w))
    before, after = _program(Graph([x, w, g], [out]), (4, 3), (3, 5), (4, 5))
    assert "matmul" in _ops(before) and _ops(after) == ["tanh"]
    f = cgvm.compile([x, w, g], out)
    gv = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    np.testing.assert_allclose(f(np.ones((4, 3), np.float32), np.ones((3, 5), np.float32), gv), np.tanh(gv), rtol=1e-6)


def test_two_outputs_of_one_source_stay_distinct_arrays():
    """The second adapter of the same source is kept as a copy, reading no other operand for its shape."""
    x, w, g = _unknown("x"), _unknown("w"), _unknown("g")
    h = E.tanh(g)
    a, b = R.sum_to_like(h, L.matmul(x, w)), R.sum_to_like(h, E.exp(g))
    _, after = _program(Graph([x, w, g], [a, b]), (4, 3), (3, 5), (4, 5))
    assert sorted(_ops(after)) == ["sum_to_like", "tanh"]       # neither matmul nor exp runs
    f = cgvm.compile([x, w, g], [a, b])
    gv = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    ra, rb = f(np.ones((4, 3), np.float32), np.ones((3, 5), np.float32), gv)
    assert ra is not rb and not np.shares_memory(ra, rb)
    np.testing.assert_allclose(ra, np.tanh(gv), rtol=1e-6)
    np.testing.assert_allclose(rb, np.tanh(gv), rtol=1e-6)


def test_an_output_adapter_of_an_input_is_never_the_callers_array():
    x, w = _unknown("x"), _unknown("w")
    out = R.sum_to_like(x, L.matmul(x, w))
    f = cgvm.compile([x, w], out)
    xv = np.ones((3, 3), np.float32)
    r = f(xv, np.eye(3, dtype=np.float32))
    assert not np.shares_memory(r, xv)


def test_a_real_reduction_is_kept():
    g, x = _unknown("g"), input_value(TensorType((None,)), "x")
    out = R.sum_to_like(g, x)
    before, after = _program(Graph([g, x], [out]), (4, 5), (5,))
    assert _ops(after) == ["sum_to_like"]
