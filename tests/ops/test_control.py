"""scan and cond: values against plain NumPy loops, BPTT gradients against numeric ones, laziness."""
import numpy as np
import pytest

import cgvm
from cgvm.errors import ShapeError
from cgvm.ir import Graph, TensorType, input_value
from cgvm.ops import control as C
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R
from harness import numeric_grad

F64 = "float64"


def vec(name, n=3, dtype=F64):
    return input_value(TensorType((n,), dtype), name)


def rnn_body():
    xt, hp, w, u = vec("xt"), vec("hp"), vec("w"), vec("u")
    ht = E.tanh(E.add(E.mul(xt, w), E.mul(hp, u)))
    return Graph([xt, hp, w, u], [ht, E.mul(ht, ht)], name="rnn")


def rnn_reference(X, H0, W, U, backwards=False):
    h, hs, ys = H0, [], []
    order = range(X.shape[0] - 1, -1, -1) if backwards else range(X.shape[0])
    for t in order:
        h = np.tanh(X[t] * W + h * U)
        hs.append(h)
        ys.append(h * h)
    return h, np.stack(hs), np.stack(ys)


def rnn_inputs(steps=5, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((steps, 3)), rng.standard_normal(3), rng.standard_normal(3), rng.standard_normal(3)]


def symbolic():
    return [input_value(TensorType((None, 3), F64), "X"), vec("H0"), vec("W"), vec("U")]


@pytest.mark.parametrize("backwards", [False, True])
def test_scan_values(backend, backwards):
    syms = symbolic()
    outs = C.scan(*syms, body=rnn_body(), n_seqs=1, n_carry=1, go_backwards=backwards)
    f = cgvm.compile(syms, list(outs), workspace=cgvm.Workspace(backend))
    vals = rnn_inputs()
    got = f(*vals)
    for g, w in zip(got, rnn_reference(*vals, backwards=backwards)):
        np.testing.assert_allclose(cgvm.get_backend(backend).to_numpy(g), w, rtol=1e-12)
    # one loop, not unrolled; x_t * w reads no carry, so the push-out pass does it before the loop,
    # and the per-step output h_t * h_t after it, over the stacked h_t
    assert [n.op.name for n in f.graph.nodes] == ["mul", "scan", "mul"]


@pytest.mark.parametrize("backwards", [False, True])
def test_scan_bptt_gradient(backwards):
    syms = symbolic()
    hT, Hs, Ys = C.scan(*syms, body=rnn_body(), n_seqs=1, n_carry=1, go_backwards=backwards)
    cost = E.add(R.sum(Ys), R.sum(E.mul(hT, hT)))
    f = cgvm.compile(syms, [cost] + cgvm.grad(cost, syms))
    vals = rnn_inputs()

    def ref(v):
        h, _, ys = rnn_reference(*v, backwards=backwards)
        return float(ys.sum() + (h * h).sum())

    got = f(*vals)
    assert abs(float(got[0]) - ref(vals)) < 1e-12
    for k in range(4):
        np.testing.assert_allclose(got[k + 1], numeric_grad(ref, vals, k, 1e-6), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("backwards", [False, True])
def test_seq_order_stacks_row_i_beside_sequence_row_i(backend, backwards):
    """seq_order: a loop that walks backwards stacks its steps from the last row up, so each
    stacked row sits beside the sequence row its step read; the final carry is unchanged."""
    syms = symbolic()
    outs = C.scan(*syms, body=rnn_body(), n_seqs=1, n_carry=1, go_backwards=backwards, seq_order=True)
    f = cgvm.compile(syms, list(outs), workspace=cgvm.Workspace(backend))
    vals = rnn_inputs()
    h, hs, ys = rnn_reference(*vals, backwards=backwards)
    flip = (lambda a: a[::-1]) if backwards else (lambda a: a)
    for g, w in zip(f(*vals), (h, flip(hs), flip(ys))):
        np.testing.assert_allclose(cgvm.get_backend(backend).to_numpy(g), w, rtol=1e-12)


@pytest.mark.parametrize("backwards", [False, True])
def test_gradient_of_a_seq_order_scan(backwards):
    """The scan gradient rule reads the stacks of a seq_order loop in the right order (checked
    with a cost that weighs each row differently)."""
    syms = symbolic()
    hT, Hs, Ys = C.scan(*syms, body=rnn_body(), n_seqs=1, n_carry=1, go_backwards=backwards, seq_order=True)
    weights = np.arange(1.0, 16.0).reshape(5, 3)
    cost = E.add(R.sum(E.mul(Ys, weights)), R.sum(E.mul(Hs, weights[::-1].copy())))
    f = cgvm.compile(syms, [cost] + cgvm.grad(cost, syms))
    vals = rnn_inputs()

    def ref(v):
        _, hs, ys = rnn_reference(*v, backwards=backwards)
        if backwards:
            hs, ys = hs[::-1], ys[::-1]
        return float((ys * weights).sum() + (hs * weights[::-1]).sum())

    got = f(*vals)
    assert abs(float(got[0]) - ref(vals)) < 1e-10
    for k in range(4):
        np.testing.assert_allclose(got[k + 1], numeric_grad(ref, vals, k, 1e-6), rtol=1e-6, atol=1e-8)


def test_seq_order_early_stop_keeps_the_rows_of_the_steps_that_ran():
    x, acc = input_value(TensorType((), F64), "x"), input_value(TensorType((), F64), "acc")
    new = E.add(acc, x)
    body = Graph([x, acc], [new, E.gt(new, 3.0)], name="acc")
    X, A0 = input_value(TensorType((None,), F64), "X"), input_value(TensorType((), F64), "A0")
    final, stack = C.scan(X, A0, body=body, n_seqs=1, n_carry=1, has_until=True, go_backwards=True,
                          seq_order=True)
    fin, st = cgvm.compile([X, A0], [final, stack])(np.array([1.0, 1.5, 2.0, 5.0, 1.0]), np.array(0.0))
    # steps read rows 4 (acc 1) and 3 (acc 6, stop): their rows, in sequence order
    np.testing.assert_allclose(st, [6.0, 1.0])
    assert float(fin) == 6.0


@pytest.mark.parametrize("backwards", [False, True])
def test_scan_truncated_gradient(backwards):
    syms = symbolic()
    _, _, Ys = C.scan(*syms, body=rnn_body(), n_seqs=1, n_carry=1, truncate_gradient=2, go_backwards=backwards)
    cost = R.sum(Ys)
    f = cgvm.compile(syms, cgvm.grad(cost, syms))
    gX, gH0, gW, gU = f(*rnn_inputs(steps=6))
    reached = gX[:2] if backwards else gX[4:]      # the rows the last two iterations read
    untouched = gX[2:] if backwards else gX[:4]
    assert np.all(untouched == 0) and np.all(reached != 0)
    assert np.all(gH0 == 0)
    forward = cgvm.compile(syms, cost)  # the forward loop is not cut
    vals = rnn_inputs(steps=6)
    assert abs(float(forward(*vals)) - float(rnn_reference(*vals, backwards=backwards)[2].sum())) < 1e-12


def test_scan_second_derivative():
    syms = symbolic()
    hT, _, _ = C.scan(*syms, body=rnn_body(), n_seqs=1, n_carry=1)
    cost = R.sum(E.mul(hT, hT))
    gW = cgvm.grad(cost, syms[2])
    f1 = cgvm.compile(syms, R.sum(gW))
    f2 = cgvm.compile(syms, cgvm.grad(R.sum(gW), syms[2]))
    vals = rnn_inputs(steps=4)
    num = numeric_grad(lambda v: float(f1(*v)), vals, 2, 1e-5)
    np.testing.assert_allclose(f2(*vals), num, rtol=1e-5, atol=1e-7)


def test_scan_until_stops_early_and_gradient_pads():
    x, acc = input_value(TensorType((), F64), "x"), input_value(TensorType((), F64), "acc")
    new = E.add(acc, x)
    body = Graph([x, acc], [new, R.sum(E.mul(new, 1.0)), E.gt(new, 3.0)], name="acc")
    X, A0 = input_value(TensorType((None,), F64), "X"), input_value(TensorType((), F64), "A0")
    final, stack, ys = C.scan(X, A0, body=body, n_seqs=1, n_carry=1, has_until=True)
    f = cgvm.compile([X, A0], [final, stack, R.sum(ys)] + cgvm.grad(R.sum(ys), [X]))
    fin, st, total, gX = f(np.array([1.0, 1.5, 2.0, 5.0, 1.0]), np.array(0.0))
    np.testing.assert_allclose(st, [1.0, 2.5, 4.5])  # stopped after the step where acc > 3
    assert float(fin) == 4.5 and float(total) == 8.0
    np.testing.assert_allclose(gX, [3.0, 2.0, 1.0, 0.0, 0.0])


def test_scan_n_steps_without_sequences():
    h = input_value(TensorType((2,), F64), "h")
    body = Graph([h], [E.mul(h, 2.0)], name="double")
    H0 = input_value(TensorType((2,), F64), "H0")
    final, stack = C.scan(H0, body=body, n_carry=1, n_steps=3)
    f = cgvm.compile([H0], [final, stack])
    fin, st = f(np.array([1.0, -1.0]))
    np.testing.assert_allclose(fin, [8.0, -8.0])
    np.testing.assert_allclose(st, [[2, -2], [4, -4], [8, -8]])


@pytest.mark.parametrize("backwards", [False, True])
def test_a_sequence_the_body_never_reads_still_counts_the_steps(backwards):
    xt, unread, h = vec("xt"), vec("unread"), vec("h")
    body = Graph([xt, unread, h], [E.add(h, xt)], name="sum")
    X, Z = input_value(TensorType((None, 3), F64), "X"), input_value(TensorType((None, 3), F64), "Z")
    H0 = vec("H0")
    final, stack = C.scan(X, Z, H0, body=body, n_seqs=2, n_carry=1, go_backwards=backwards)
    f = cgvm.compile([X, Z, H0], [final, stack])
    xv = np.arange(18.0).reshape(6, 3)
    fin, st = f(xv, np.zeros((4, 3)), np.zeros(3))           # the unread sequence is the shorter: 4 steps
    rows = xv[:4][::-1] if backwards else xv[:4]
    np.testing.assert_allclose(st, np.cumsum(rows, axis=0))
    np.testing.assert_allclose(fin, rows.sum(0))


def test_a_stack_nobody_holds_is_reused_by_the_next_call_and_a_held_one_never():
    import weakref

    X, H0, W, U = symbolic()
    _, stack, _ = C.scan(X, H0, W, U, body=rnn_body(), n_seqs=1, n_carry=1)
    kernel = stack.node.op.bind(np, stack.node.attrs, runtime=cgvm.compiled_function.SubgraphRuntime(cgvm.Workspace()))
    args = rnn_inputs(steps=50)
    first = kernel(*args)[1]
    kept = first.copy()
    second = kernel(*args)[1]                   # the first stack is still held: a new one
    assert second is not first
    np.testing.assert_array_equal(first, kept)
    view = second.transpose(1, 0)               # a view's base is the memory's owner, not the stack
    kept = view.copy()
    del second
    other = rnn_inputs(steps=50, seed=1)
    assert kernel(*other)[1] is not None and np.array_equal(view, kept)   # the view still sees its values
    gone = weakref.ref(kernel(*args)[1])
    del view
    third = kernel(*args)[1]                    # nobody held the last one: its memory comes back
    assert third is gone()
    np.testing.assert_allclose(third, rnn_reference(*args)[1])


def test_scan_rejects_mismatched_body():
    X = input_value(TensorType((None, 3), F64), "X")
    with pytest.raises(ShapeError, match="test_control.py"):
        C.scan(X, vec("H0", 4), vec("W"), vec("U"), body=rnn_body(), n_seqs=1, n_carry=1)


def test_cond_is_lazy_and_differentiable(backend):
    a = input_value(TensorType((), F64), "a")
    calls = []

    then_g = Graph([a], [E.mul(a, a)], name="square")
    else_g = Graph([a], [E.neg(a)], name="negate")
    p = input_value(TensorType((), "bool"), "p")
    z = C.cond(p, a, then_graph=then_g, else_graph=else_g)
    f = cgvm.compile([p, a], [z, cgvm.grad(z, a)], workspace=cgvm.Workspace(backend))
    to_np = cgvm.get_backend(backend).to_numpy
    assert [float(to_np(v)) for v in f(np.array(True), np.array(3.0))] == [9.0, 6.0]
    assert [float(to_np(v)) for v in f(np.array(False), np.array(3.0))] == [-3.0, -1.0]
    del calls


def test_cond_runs_only_the_taken_branch():
    # the untaken branch would fail at run time (shape mismatch in a reshape-like op), so it must not run
    a = input_value(TensorType((None,), F64), "a")
    bad = input_value(TensorType((None,), F64), "b")
    then_g = Graph([a, bad], [E.add(a, 1.0)], name="ok")
    else_g = Graph([a, bad], [E.add(a, bad)], name="fails_if_run")
    p = input_value(TensorType((), "bool"), "p")
    f = cgvm.compile([p, a, bad], C.cond(p, a, bad, then_graph=then_g, else_graph=else_g))
    np.testing.assert_allclose(f(np.array(True), np.ones(3), np.ones(2)), [2, 2, 2])
    with pytest.raises(cgvm.errors.ShapeError, match="fails_if_run|test_control.py"):
        f(np.array(False), np.ones(3), np.ones(2))


def test_a_hoisted_transpose_read_by_a_gemm_enters_the_loop_contiguous():
    """g @ U^T in a loop body: U^T is computed once outside, as a contiguous copy (a GEMM on a
    transposed view ran 2x slower), and the loop computes what a NumPy loop does."""
    from cgvm.ops import linalg as L
    from cgvm.ops import shape as S

    f64 = "float64"
    xt, h = input_value(TensorType((4, 5), f64), "xt"), input_value(TensorType((4, 5), f64), "h")
    u = input_value(TensorType((5, 5), f64), "u")
    body = Graph([xt, h, u], [E.tanh(E.add(xt, L.matmul(h, S.transpose(u))))], name="rnn_t")
    X = input_value(TensorType((6, 4, 5), f64), "X")
    H0, U = input_value(TensorType((4, 5), f64), "H0"), input_value(TensorType((5, 5), f64), "U")
    final, _ = C.scan(X, H0, U, body=body, n_seqs=1, n_carry=1)
    f = cgvm.compile([X, H0, U], final)
    scan_node = next(n for n in f.graph.nodes if n.op.name == "scan")
    assert not any(n.op.name == "transpose" for n in scan_node.attrs["body"].nodes)
    entering = scan_node.inputs[-1].node
    assert entering.op.name == "contiguous" and entering.inputs[0].node.op.name == "transpose"
    rng = np.random.default_rng(2)
    x, h0, uu = (rng.standard_normal(s) for s in ((6, 4, 5), (4, 5), (5, 5)))
    want = h0
    for t in range(6):
        want = np.tanh(x[t] + want @ uu.T)
    np.testing.assert_allclose(f(x, h0, uu), want, rtol=1e-12)


def test_a_hoisted_transpose_times_one_vector_enters_the_loop_as_a_view():
    """h_t @ U^T for one sequence (h_t a vector): no contiguous copy, which would cost more than the
    strided matrix-vector products it saves."""
    from cgvm.ops import linalg as L
    from cgvm.ops import shape as S

    f64 = "float64"
    xt, h, u = (input_value(TensorType(s, f64), n) for s, n in (((5,), "xt"), ((5,), "h"), ((5, 5), "u")))
    body = Graph([xt, h, u], [E.tanh(E.add(xt, L.matmul(h, S.transpose(u))))], name="rnn_v")
    X, H0, U = (input_value(TensorType(s, f64), n) for s, n in (((6, 5), "X"), ((5,), "H0"), ((5, 5), "U")))
    final, _ = C.scan(X, H0, U, body=body, n_seqs=1, n_carry=1)
    f = cgvm.compile([X, H0, U], final)
    scan_node = next(n for n in f.graph.nodes if n.op.name == "scan")
    assert not any(n.op.name == "transpose" for n in scan_node.attrs["body"].nodes)
    assert scan_node.inputs[-1].node.op.name == "transpose"
    rng = np.random.default_rng(3)
    x, h0, uu = (rng.standard_normal(s) for s in ((6, 5), (5,), (5, 5)))
    want = h0
    for t in range(6):
        want = np.tanh(x[t] + want @ uu.T)
    np.testing.assert_allclose(f(x, h0, uu), want, rtol=1e-12)


def test_loop_invariant_work_is_hoisted():
    xt, hp, w, u = vec("xt"), vec("hp"), vec("w"), vec("u")
    w2 = E.exp(E.mul(w, 2.0))  # reads only a non-sequence: should run once, outside the loop
    body = Graph([xt, hp, w, u], [E.tanh(E.add(E.mul(xt, w2), E.mul(hp, u)))], name="rnn")
    syms = symbolic()
    final, stack = C.scan(*syms, body=body, n_seqs=1, n_carry=1)
    f = cgvm.compile(syms, final, passes=[p for p in cgvm.compiler.pass_names() if p != "fuse"])
    scan_node = next(n for n in f.graph.nodes if n.op.name == "scan")
    assert [n.op.name for n in scan_node.attrs["body"].nodes].count("exp") == 0
    assert any(n.op.name == "exp" for n in f.graph.nodes)
    X, H0, W, U = rnn_inputs()
    h = H0
    for t in range(X.shape[0]):
        h = np.tanh(X[t] * np.exp(2 * W) + h * U)
    np.testing.assert_allclose(f(X, H0, W, U), h, rtol=1e-12)


def _while_doubling():
    """h <- 2 h until h > limit: a while loop (until, no sequences) with a run-time step bound."""
    h, limit = input_value(TensorType((2,), F64), "h"), input_value(TensorType((), F64), "limit")
    new = E.mul(h, 2.0)
    body = Graph([h, limit], [new, R.sum(E.mul(new, new)), E.gt(R.sum(new), limit)], name="double")
    H0, L0 = input_value(TensorType((2,), F64), "H0"), input_value(TensorType((), F64), "L0")
    bound = input_value(TensorType((), "int64"), "bound")
    final, stack, ys = C.scan(H0, L0, bound, body=body, n_carry=1, has_until=True, dyn_steps=True)
    return [H0, L0, bound], final, stack, ys


def _while_reference(h0, limit, bound):
    h, hs = h0, []
    for _ in range(bound):
        h = h * 2.0
        hs.append(h)
        if h.sum() > limit:
            break
    return h, np.array(hs).reshape(-1, 2)


@pytest.mark.parametrize("limit,bound", [(1e6, 2 ** 62), (50.0, 2 ** 62), (1e6, 3), (1e30, 40), (-1.0, 0)])
def test_while_loop_rows_grow_with_the_steps_taken(limit, bound):
    # a bound of 2**62 would be ~73 exabytes if the stacks were sized by it: they grow as the loop runs
    ins, final, stack, ys = _while_doubling()
    f = cgvm.compile(ins, [final, stack, ys])
    h0 = np.array([0.5, 1.0])
    fin, st, y = f(h0, np.array(limit), np.array(bound, np.int64))
    want_h, want_stack = _while_reference(h0, limit, bound)
    np.testing.assert_allclose(fin, want_h)
    np.testing.assert_allclose(st, want_stack)
    np.testing.assert_allclose(y, (want_stack ** 2).sum(axis=1))


def test_while_loop_that_stops_early_has_a_gradient():
    ins, final, stack, ys = _while_doubling()
    loss = E.add(R.sum(E.mul(final, final)), R.sum(ys))
    f = cgvm.compile(ins, loss)
    g = cgvm.compile(ins, cgvm.grad(loss, [ins[0]]))
    h0, limit, bound = np.array([0.3, 0.7]), np.array(20.0), np.array(2 ** 62, np.int64)
    num = numeric_grad(lambda v: float(f(v[0], limit, bound)), [h0.copy()], 0, 1e-6)
    np.testing.assert_allclose(g(h0, limit, bound)[0], num, rtol=1e-6)


def test_gradient_of_a_value_that_is_both_a_carry_and_a_per_step_output():
    # body outputs (h_t, y_t) are one Value: both its gradients reach the step (they used to overwrite)
    h, w = vec("h"), vec("w")
    new = E.tanh(E.mul(h, w))
    body = Graph([h, w], [new, new], name="same")
    H0, W = vec("H0"), vec("W")
    final, stack, ys = C.scan(H0, W, body=body, n_carry=1, n_steps=4)
    loss = E.add(R.sum(E.mul(ys, ys)), R.sum(final))
    f = cgvm.compile([H0, W], loss)
    g = cgvm.compile([H0, W], cgvm.grad(loss, [W]))
    h0, w0 = np.array([0.3, -0.2, 0.9]), np.array([0.7, 1.2, -0.4])
    num = numeric_grad(lambda v: float(f(h0, v[0])), [w0.copy()], 0, 1e-6)
    np.testing.assert_allclose(g(h0, w0)[0], num, rtol=1e-6)


def test_a_weight_a_loop_reads_is_updated_in_its_own_array():
    """The loop's stacks are its own arrays (scan's may_alias): an SGD step on a weight the loop
    read, after the loop, may overwrite the weight's array -- and computes what NumPy does."""
    from cgvm.ir import param_value
    from cgvm.ops import linalg as L

    ws = cgvm.Workspace()
    rng = np.random.default_rng(7)
    ws["u"] = rng.standard_normal((3, 3)) * 0.5
    u = param_value("u", TensorType((3, 3), F64))
    xt, hp, uu = vec("xt"), vec("hp"), input_value(TensorType((3, 3), F64), "uu")
    body = Graph([xt, hp, uu], [E.tanh(E.add(xt, L.matmul(hp, uu)))], name="rnn_u")
    X, H0 = input_value(TensorType((None, 3), F64), "X"), vec("H0")
    _, hs = C.scan(X, H0, u, body=body, n_seqs=1, n_carry=1)
    cost = R.sum(hs)
    step = cgvm.compile([X, H0], cost, workspace=ws, updates={u: E.sub(u, E.mul(cgvm.grad(cost, u), 0.1))})
    x, h0 = rng.standard_normal((5, 3)), rng.standard_normal(3)
    want = ws["u"].copy()
    ids = set()
    for _ in range(4):
        # the NumPy reference: forward, then BPTT for du
        h, hs_, prev = h0, [], []
        for t in range(5):
            prev.append(h)
            h = np.tanh(x[t] + h @ want)
            hs_.append(h)
        gu, gh = np.zeros((3, 3)), np.zeros(3)
        for t in reversed(range(5)):
            gz = (gh + 1.0) * (1 - hs_[t] ** 2)
            gu += np.outer(prev[t], gz)
            gh = gz @ want.T
        want = want - 0.1 * gu
        step(x, h0)
        ids.add(id(ws["u"]))
    np.testing.assert_allclose(ws["u"], want, rtol=1e-12)
    assert len(ids) == 1   # one array throughout: every update overwrote it
