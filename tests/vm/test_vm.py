"""The VM: bytecode and disassembly, agreement with the reference interpreter, errors carry pc and source, workspace and DLPack."""
import numpy as np
import pytest

import cgvm
from cgvm.errors import ExecutionError, InputError, WorkspaceError
from cgvm.ir import Graph, TensorType, input_value, param_value
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R
from cgvm.vm import CALL, FREE, RET, dis


def small_graph():
    x = input_value(TensorType((None, 3), "float32"), "x")
    w = param_value("w", TensorType((3,), "float32"))
    return x, w, R.sum(E.tanh(E.mul(E.add(x, 1.0), w)), axis=1)


def test_program_has_call_free_ret_and_disassembles():
    x, w, y = small_graph()
    ws = cgvm.Workspace()
    ws["w"] = np.ones(3, np.float32)
    f = cgvm.compile([x], y, workspace=ws, passes=[p for p in cgvm.compiler.pass_names() if p != "fuse"])
    ops = [i.opcode for i in f.program.instrs]
    assert ops[-1] == RET and CALL in ops and FREE in ops
    f(np.ones((2, 3), np.float32))
    text = f.dis()
    assert "CALL tanh" in text and "param r" in text and "RET" in text and "buf #" in text
    assert dis(f.program).count("\n") >= len(f.program.instrs)


def test_the_vm_agrees_with_eval_graph(backend):
    x, w, y = small_graph()
    ws = cgvm.Workspace(backend)
    wv = np.array([0.5, -1.0, 2.0], np.float32)
    ws["w"] = wv
    f = cgvm.compile([x], y, workspace=ws)
    xv = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    got = ws.backend.to_numpy(f(xv))
    ref = cgvm.eval_graph(Graph([x], [y]), [xv], {"w": wv})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    np.testing.assert_allclose(got, np.tanh((xv + 1) * wv).sum(1), rtol=1e-6)


def test_shape_error_at_run_time_names_node_and_source():
    a = input_value(TensorType((None,), "float32"), "a")
    b = input_value(TensorType((None,), "float32"), "b")
    f = cgvm.compile([a, b], E.mul(E.exp(a), b),
                     passes=[p for p in cgvm.compiler.pass_names() if p != "fuse"])
    # shapes are known once the inputs arrive: the mismatch is found before any kernel runs
    with pytest.raises(cgvm.errors.ShapeError) as info:
        f(np.ones(3, np.float32), np.ones(4, np.float32))
    msg = str(info.value)
    assert "op mul" in msg and "test_vm.py:" in msg and "do not broadcast" in msg


def test_kernel_failure_is_execution_error_with_pc():
    from cgvm.ops.registry import defop

    if "test_always_fails" not in cgvm.ops.all_ops():
        op = defop("test_always_fails", infer=lambda t: t[0])

        @op.kernel
        def _(xp, x, out=None):
            raise RuntimeError("boom")
    op = cgvm.ops.lookup("test_always_fails")
    x = input_value(TensorType((2,), "float32"), "x")
    f = cgvm.compile([x], op(E.exp(x)))
    with pytest.raises(ExecutionError) as info:
        f(np.ones(2, np.float32))
    assert info.value.pc == 0 or info.value.pc == 1
    assert "boom" in str(info.value) and "test_vm.py" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_wrong_inputs_are_rejected_before_running():
    x = input_value(TensorType((None, 3), "float32"), "x")
    f = cgvm.compile([x], E.exp(x))
    with pytest.raises(InputError, match="takes 1 inputs"):
        f(np.ones((2, 3), np.float32), np.ones(1))
    with pytest.raises(InputError, match=r"float32\[\?,3\]"):
        f(np.ones((2, 4), np.float32))
    with pytest.raises(InputError, match="dtype"):
        f(np.ones((2, 3), np.complex64))


def test_missing_parameter_is_a_clear_error():
    x, w, y = small_graph()
    f = cgvm.compile([x], y, workspace=cgvm.Workspace())
    with pytest.raises(InputError, match="'w'"):
        f(np.ones((1, 3), np.float32))


def test_updates_are_applied_after_outputs_from_old_values():
    ws = cgvm.Workspace()
    ws["c"] = np.array(1.0)
    c = param_value("c", TensorType((), "float64"))
    f = cgvm.compile([], [E.mul(c, 10.0)], workspace=ws, updates={c: E.add(c, 1.0)})
    assert float(f()[0]) == 10.0 and float(ws["c"]) == 2.0
    assert float(f()[0]) == 20.0 and float(ws["c"]) == 3.0


def test_duplicate_update_target_is_an_error():
    c = param_value("c", TensorType((), "float64"))
    with pytest.raises(InputError, match="twice"):
        cgvm.compile([], [c], updates=[(c, c), (c, c)] and {c: c, "c": c})


def test_workspace_reshape_replans():
    ws = cgvm.Workspace()
    ws["w"] = np.ones(3)
    w = param_value("w", TensorType((None,), "float64"))
    f = cgvm.compile([], R.sum(E.exp(E.tanh(w))), workspace=ws)
    a = float(f())
    ws["w"] = np.ones(5)
    b = float(f())
    assert abs(b / a - 5 / 3) < 1e-12 and len(f.memory_plans()) == 2


def test_workspace_errors_and_dlpack_zero_copy():
    ws = cgvm.Workspace()
    with pytest.raises(WorkspaceError, match="did you mean"):
        ws["weight"] = np.ones(1)
        ws["weigth"]
    torch = pytest.importorskip("torch")
    t = torch.arange(4, dtype=torch.float32)
    arr = ws.set("t", t)
    t[0] = 42.0                     # written through the torch side
    assert ws["t"][0] == 42.0      # seen on ours: no copy
    assert np.shares_memory(arr, ws["t"])


def test_two_values_of_one_parameter_share_its_slot():
    ws = cgvm.Workspace()
    ws["w"] = np.array([2.0, 3.0])
    x = input_value(TensorType((2,), "float64"), "x")
    t = TensorType((2,), "float64")
    f = cgvm.compile([x], E.mul(E.mul(x, param_value("w", t)), param_value("w", t)), workspace=ws)
    np.testing.assert_allclose(f(np.ones(2)), [4.0, 9.0])


def test_a_parameter_given_as_input_is_fed_not_read():
    ws = cgvm.Workspace()
    ws["w"] = np.array([2.0, 3.0])
    w = param_value("w", TensorType((2,), "float64"))
    f = cgvm.compile([w], E.mul(w, 10.0), workspace=ws)
    np.testing.assert_allclose(f(np.array([1.0, 1.0])), [10.0, 10.0])


def _sgd(ws, x):
    w = param_value("w", TensorType((1000,), "float64"))
    loss = R.sum(E.mul(E.mul(w, w), x))
    return cgvm.compile([x], loss, workspace=ws, updates={w: E.sub(w, E.mul(cgvm.grad(loss, w), 0.1))})


def test_parameter_updates_recycle_the_old_array_when_nobody_holds_it():
    ws = cgvm.Workspace()
    ws["w"] = np.ones(1000)
    x = input_value(TensorType((1000,), "float64"), "x")
    step = _sgd(ws, x)
    xv = np.full(1000, 0.5)
    ids = set()
    expected = np.ones(1000)
    for _ in range(6):
        step(xv)
        expected = expected - 0.1 * 2 * expected * xv
        ids.add(id(ws["w"]))
    np.testing.assert_allclose(ws["w"], expected)
    assert len(ids) <= 3  # two buffers alternate once recycling starts


def test_a_held_parameter_array_is_never_overwritten():
    ws = cgvm.Workspace()
    ws["w"] = np.ones(1000)
    x = input_value(TensorType((1000,), "float64"), "x")
    step = _sgd(ws, x)
    xv = np.full(1000, 0.5)
    history = []
    for _ in range(5):
        history.append(ws["w"])           # the user keeps every old value
        step(xv)
    for k, old in enumerate(history):
        np.testing.assert_allclose(old, 0.9 ** k)  # each kept array still has its own step's value


def test_dis_shows_the_program_specialized_for_the_last_signature():
    x = input_value(TensorType((None, 3), "float32"), "x")
    like = input_value(TensorType((None, 3), "float32"), "like")
    f = cgvm.compile([x, like], E.tanh(R.sum_to_like(E.mul(x, 2.0), like)))
    assert "sum_to_like" in f.dis()                 # before any call: the generic program
    f(np.ones((4, 3), np.float32), np.ones((4, 3), np.float32))
    listing = f.dis()
    assert "sum_to_like" not in listing and "tanh" in listing   # the same shapes: the adapter is gone


def test_the_reference_interpreter_subclasses_and_keeps_intermediates():
    from cgvm.ops import control as C
    from cgvm.vm.reference import Interpreter

    x = input_value(TensorType((3,), "float64"), "x")
    h = E.exp(x)
    y = E.mul(h, 2.0)
    xv = np.array([0.0, 1.0, 2.0])
    outs, values = cgvm.eval_graph(Graph([x], [y]), [xv], intermediate=True)
    np.testing.assert_allclose(values[h], np.exp(xv))
    np.testing.assert_allclose(outs[0], 2 * np.exp(xv))
    assert values[x] is xv and len(values) == 3

    class Counting(Interpreter):
        seen: list = []

        def run_node(self, node, args):
            Counting.seen.append(node.op.name)
            return super().run_node(node, args)

    hp = input_value(TensorType((3,), "float64"), "hp")
    xt = input_value(TensorType((3,), "float64"), "xt")
    body = Graph([xt, hp], [E.add(hp, xt)], name="acc")
    xs = input_value(TensorType((4, 3), "float64"), "xs")
    last, _ = C.scan(xs, x, body=body, n_seqs=1, n_carry=1)
    seq = np.arange(12.0).reshape(4, 3)
    got = cgvm.eval_graph(Graph([xs, x], [last]), [seq, xv], interpreter=Counting)[0]
    np.testing.assert_allclose(got, xv + seq.sum(0))
    assert Counting.seen.count("add") == 4 and "scan" in Counting.seen   # the body ran with the subclass too


def _runs_dot(frame):
    return any(v is np.dot for v in frame.run.__globals__.values())


def test_tiny_float_products_run_through_numpy_dot_with_matmul_numbers():
    """Per signature a small 2-D float product takes numpy.dot (half of matmul's dispatch on tiny
    matrices); a large one, a batched one and an integer one keep matmul. Same numbers either way."""
    from cgvm.ops import linalg as L

    rng = np.random.default_rng(4)
    for dtype in (np.float32, np.float64):
        a, b = (input_value(TensorType((None, None), dtype.__name__), n) for n in "ab")
        f = cgvm.compile([a, b], E.tanh(L.matmul(a, b)))
        av, bv = rng.standard_normal((3, 5)).astype(dtype), rng.standard_normal((5, 4)).astype(dtype)
        np.testing.assert_array_equal(f(av, bv), np.tanh(np.matmul(av, bv)))
        frame = list(f.executable.frames.values())[0]
        assert _runs_dot(frame)
        big = rng.standard_normal((80, 80)).astype(dtype)
        np.testing.assert_array_equal(f(big, big), np.tanh(np.matmul(big, big)))
        assert not _runs_dot(list(f.executable.frames.values())[-1])
    i, j = (input_value(TensorType((None, None), "int64"), n) for n in "ij")
    g = cgvm.compile([i, j], L.matmul(i, j))
    iv = rng.integers(-3, 3, (3, 3))
    np.testing.assert_array_equal(g(iv, iv), iv @ iv)
    assert not _runs_dot(list(g.executable.frames.values())[0])


def test_a_fused_output_of_known_shape_gets_a_fresh_array_on_every_call():
    """The VM allocates the output of a fused chain (its kernel would broadcast every operand to find
    the shape): a new array per call, never one the caller already holds."""
    x, y = (input_value(TensorType((None, None)), n) for n in "xy")
    f = cgvm.compile([x, y], E.tanh(E.mul(E.add(x, y), 2.0)))
    xv, yv = np.ones((2, 3), np.float32), np.full((1, 3), 0.5, np.float32)
    first = f(xv, yv)
    source = list(f.executable.frames.values())[0].run.__cgvm_source__
    assert "out=_empty(" in source
    second = f(xv, yv)
    assert first is not second and not np.shares_memory(first, second)
    np.testing.assert_array_equal(second, np.tanh((xv + yv) * np.float32(2)))
    assert second.shape == (2, 3) and second.dtype == np.float32
