"""The memory planner: liveness, in-place, reuse by size (itemsize counted), outputs never reused."""
import numpy as np

import cgvm
from cgvm.compiler import generate, infer_slot_types, plan_memory
from cgvm.ir import Graph, TensorType, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R


def plan_for(graph, *shapes):
    prog = generate(graph)
    known = {s: TensorType(shape, graph.inputs[i].dtype) for i, (s, shape) in enumerate(zip(prog.input_slots, shapes))}
    types = infer_slot_types(prog, known)
    return prog, types, plan_memory(prog, types)


def chain(n, dtype="float32"):
    x = input_value(TensorType((None,), dtype), "x")
    y = x
    for i in range(n):
        y = E.tanh(y) if i % 2 else E.exp(y)
    return Graph([x], [R.sum(y)])


def test_chain_runs_in_place_in_one_buffer():
    prog, types, plan = plan_for(chain(10), (1000,))
    assert len(plan.storage_bytes) == 1
    assert plan.planned_bytes == 4000
    assert len(plan.inplace) == 9
    assert plan.unplanned_bytes == 10 * 4000


def test_itemsize_counts():
    _, _, p32 = plan_for(chain(3, "float32"), (100,))
    _, _, p64 = plan_for(chain(3, "float64"), (100,))
    assert p64.planned_bytes == 2 * p32.planned_bytes == 800


def test_no_inplace_when_input_still_needed_and_reuse_after_death():
    x = input_value(TensorType((None,), "float32"), "x")
    a = E.exp(x)          # a is read twice: b cannot overwrite it
    b = E.tanh(a)
    c = E.mul(a, b)       # a and b die here: c may take one of them
    d = E.neg(c)
    prog, types, plan = plan_for(Graph([x], [R.sum(d)]), (64,))
    slot = {id(v): s for s, v in enumerate(prog.slot_names)}
    del slot
    assert len(plan.storage_bytes) == 2
    assert plan.planned_bytes == 2 * 64 * 4


def test_outputs_are_never_planned_or_reused():
    x = input_value(TensorType((None,), "float32"), "x")
    a = E.exp(x)
    b = E.tanh(a)
    f = cgvm.compile([x], [a, b])
    v = np.ones(5, np.float32)
    a1, b1 = f(v)
    a2, b2 = f(v * 2)
    assert not np.shares_memory(a1, a2) and not np.shares_memory(b1, b2)
    np.testing.assert_allclose(a1, np.exp(v))  # the first results were not overwritten
    np.testing.assert_allclose(b2, np.tanh(np.exp(v * 2)))


def test_plans_are_cached_per_signature():
    x = input_value(TensorType((None,), "float32"), "x")
    f = cgvm.compile([x], R.sum(E.exp(E.tanh(x))))
    f(np.ones(3, np.float32))
    f(np.ones(3, np.float32))
    f(np.ones(7, np.float32))
    plans = f.memory_plans()
    assert len(plans) == 2
    sizes = sorted(p.planned_bytes for p in plans.values())
    assert sizes == [12, 28]


def test_kernels_write_into_planned_buffers():
    x = input_value(TensorType((None,), "float32"), "x")
    f = cgvm.compile([x], R.sum(E.tanh(E.exp(x))))
    f(np.ones(8, np.float32))
    frame = next(iter(f.executable.frames.values()))
    buf = frame.buffers[0]
    before = buf.copy()
    f(np.full(8, 0.5, np.float32))
    assert not np.array_equal(before, buf)  # the run really wrote into the planned memory


def test_views_extend_the_life_of_their_storage():
    from cgvm.ops import shape as S

    x = input_value(TensorType((None, 4), "float32"), "x")
    a = E.exp(x)
    v = S.expand_dims(a, axis=0)   # a view of a's buffer
    b = E.tanh(x)                  # must not reuse a's buffer while v is alive
    y = E.add(S.squeeze(v, axis=0), b)
    f = cgvm.compile([x], R.sum(y))
    xv = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(f(xv), np.sum(np.exp(xv) + np.tanh(xv)), rtol=1e-6)
