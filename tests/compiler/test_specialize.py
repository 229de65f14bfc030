"""Per-signature specialization: identity shape adapters go, and so does work kept only for a shape."""
import numpy as np

import cgvm
from cgvm.compiler.codegen import generate
from cgvm.compiler.specialize import specialize
from cgvm.compiler.memory import infer_slot_types
from cgvm.ir import Graph, TensorType, input_value
from cgvm.ir.builder import as_value
from cgvm.ops import elementwise as E
from cgvm.ops import linalg as L
from cgvm.ops import reduce as R
from cgvm.ops import shape as S
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


def test_outputs_the_caller_copies_may_share_their_source():
    """A loop's stacked per-step outputs are copied into their stacks at once: there, both adapters
    of one source become that source (BPTT's dz_t for two weights), and nothing is copied per step.
    The same graph as a function's outputs keeps a copy (previous test)."""
    x, w, g = _unknown("x"), _unknown("w"), _unknown("g")
    h = E.tanh(g)
    a, b = R.sum_to_like(h, L.matmul(x, w)), R.sum_to_like(h, E.exp(g))
    program = generate(Graph([x, w, g], [a, b]))
    types = infer_slot_types(program, {s: TensorType(shape) for s, shape in
                                       zip(program.input_slots, [(4, 3), (3, 5), (4, 5)])})
    shared = specialize(program, types, copied_outputs=(0, 1))
    assert _ops(shared) == ["tanh"] and shared.output_slots[0] == shared.output_slots[1]
    # output 1 is not copied: it must not be the array output 0 already is, so it keeps a copy
    only_first = specialize(program, types, copied_outputs=(0,))
    assert sorted(_ops(only_first)) == ["sum_to_like", "tanh"]


def test_a_loop_whose_stacked_outputs_share_a_source_stacks_each_correctly():
    """Two per-step outputs that specialize to one array still fill two stacks with its values."""
    from cgvm.ops import control as C

    xt, hp = _unknown("xt", 1), _unknown("hp", 1)
    ht = E.tanh(E.add(xt, hp))
    body = Graph([xt, hp], [ht, R.sum_to_like(ht, E.exp(xt)), R.sum_to_like(ht, E.neg(hp))], name="step")
    X, H0 = _unknown("X"), _unknown("H0", 1)
    final, stack_h, ys_a, ys_b = C.scan(X, H0, body=body, n_seqs=1, n_carry=1)
    f = cgvm.compile([X, H0], [final, stack_h, ys_a, ys_b])
    xv = np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32)
    fin, hs, ya, yb = f(xv, np.zeros(3, np.float32))
    want, h = [], np.zeros(3, np.float32)
    for row in xv:
        h = np.tanh(row + h)
        want.append(h)
    np.testing.assert_allclose(hs, np.stack(want), rtol=1e-6)
    np.testing.assert_allclose(ya, np.stack(want), rtol=1e-6)
    np.testing.assert_allclose(yb, np.stack(want), rtol=1e-6)
    assert not np.shares_memory(ya, yb)
    step = next(exe for _, exe in f.runtime._cache.values())
    assert "sum_to_like" not in _ops(next(iter(step.frames.values())).program)


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


def test_dead_code_elimination_keeps_what_the_outputs_need_in_order():
    from cgvm.compiler.liveness import live_calls
    from cgvm.vm.bytecode import Instr

    calls = [Instr(CALL, 0, (0,), (1,)), Instr(CALL, 1, (0,), (2,)), Instr(CALL, 2, (1,), (3,)),
             Instr(CALL, 3, (2,), (4,))]
    assert live_calls(calls, [3]) == [calls[0], calls[2]]
    assert live_calls(calls, [4, 1]) == [calls[0], calls[1], calls[3]]
    assert live_calls(calls, [0]) == []


def test_values_made_of_shapes_and_constants_become_constants_of_the_signature():
    """A gradient's seed ones_like(loss) and its broadcast depend only on shapes: computed once, and
    the forward work read only for its shape (the loss) is not run at all."""
    x = _unknown("x")
    loss = R.sum(E.mul(E.tanh(x), 0.5), axis=(1,))                       # (n,)
    seed = S.broadcast_like(S.expand_dims(E.mul(S.ones_like(loss), 0.5), axis=(1,)), x)
    out = E.mul(seed, E.exp(x))
    before, after = _program(Graph([x], [out]), (3, 5))
    assert {"ones_like", "broadcast_like", "tanh", "sum"} <= set(_ops(before))
    assert _ops(after) == ["exp", "mul"]
    seeds = [a for s, a in after.const_slots if a.shape == (3, 5)]
    assert len(seeds) == 1 and seeds[0].flags.c_contiguous and np.all(seeds[0] == 0.5)
    f = cgvm.compile([x], out)
    xv = np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)
    for _ in range(2):   # the second call reuses the signature's constant: it must be unchanged
        np.testing.assert_array_equal(f(xv), np.float32(0.5) * np.exp(xv))


def test_a_folded_value_a_view_or_output_passes_on_stays_computed():
    """Folded constants are shared by every call: one returned (or viewed by what is returned) would be
    the caller's to write into, so those stay instructions and each call returns a fresh array."""
    x = _unknown("x")
    ones = S.ones_like(x)
    f = cgvm.compile([x], [ones, S.expand_dims(E.mul(S.ones_like(x), 2.0), axis=(0,))])
    xv = np.zeros((2, 3), np.float32)
    a, b = f(xv)
    a[...] = 7
    b[...] = 7
    a2, b2 = f(xv)
    np.testing.assert_array_equal(a2, np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(b2, np.full((1, 2, 3), 2.0, np.float32))


def test_a_reshape_target_made_of_shapes_is_a_constant_of_the_signature():
    """x.reshape((x.shape[0], 6)): the target vector is computed once per signature; the reshape, a
    view, reads it only for its values, so it may read one shared array."""
    from cgvm.ops import indexing as I
    from cgvm.ops import join as J
    x = input_value(TensorType((None, 2, 3)), "x")
    rows = S.squeeze(I.slice(S.shape_of(x), starts=(0,), stops=(1,)), axis=(0,))
    target = J.stack(rows, as_value(np.array(6, np.int64)), axis=0)
    out = E.exp(S.reshape_dyn(x, target))
    before, after = _program(Graph([x], [out]), (4, 2, 3))
    assert "stack" in _ops(before) and _ops(after) == ["reshape_dyn", "exp"]
    f = cgvm.compile([x], out)
    for n in (4, 4, 7):
        xv = np.random.default_rng(n).standard_normal((n, 2, 3)).astype(np.float32)
        np.testing.assert_allclose(f(xv), np.exp(xv.reshape(n, 6)), rtol=1e-6)


def test_small_constants_are_broadcast_once_to_the_shape_their_readers_want():
    """x - mu with mu a row: per signature mu becomes an array of x's shape (the ufunc's fast path);
    a constant read at two different shapes is left as it is."""
    x, y = _unknown("x"), _unknown("y")
    mu = np.arange(5, dtype=np.float32)
    out = E.tanh(E.sub(x, mu))
    _, after = _program(Graph([x], [out]), (3, 5))
    assert [a.shape for _, a in after.const_slots] == [(3, 5)]
    shared = as_value(mu)   # one constant, read at two shapes
    _, mixed = _program(Graph([x, y], [E.sub(x, shared), E.add(y, shared)]), (3, 5), (4, 5))
    assert [a.shape for _, a in mixed.const_slots] == [(5,)]
    f = cgvm.compile([x], out)
    xv = np.random.default_rng(3).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_array_equal(f(xv), np.tanh(xv - mu))


def test_a_large_folded_broadcast_stays_a_view():
    """A seed broadcast to a large shape is folded as the zero-stride view it is, not materialized."""
    x = _unknown("x")
    seed = S.broadcast_like(E.mul(S.ones_like(R.sum(x)), 0.5), x)
    _, after = _program(Graph([x], [E.mul(seed, x)]), (300, 300))
    big = [a for _, a in after.const_slots if a.shape == (300, 300)]
    assert len(big) == 1 and big[0].strides == (0, 0)
