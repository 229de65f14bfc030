"""The loop push-out pass: products of sequences before scans, summing carries after them.

Each case compiles the same graph with and without the pass and checks that the results agree
(and, for the RNN, that both agree with a plain NumPy loop), and that the IR changed as claimed.
"""
import numpy as np
import pytest

import cgvm
from cgvm.compiler.passes import pass_names, run_passes
from cgvm.ir import Graph, TensorType, input_value
from cgvm.ops import control as C
from cgvm.ops import elementwise as E
from cgvm.ops import linalg as L
from cgvm.ops import reduce as R

B, I, H = 4, 3, 5
WITHOUT = [p for p in pass_names() if p != "pushout"]


def _rnn(go_backwards=False, bias=False, truncate_gradient=-1):
    """h_t = tanh(x_t W + h_{t-1} U [+ b]); cost = sum of all h_t; grads wrt W, U [, b]."""
    xt, hp = input_value(TensorType((B, I)), "xt"), input_value(TensorType((B, H)), "h")
    w, u, b = input_value(TensorType((I, H)), "w"), input_value(TensorType((H, H)), "u"), \
        input_value(TensorType((H,)), "b")
    pre = E.add(L.matmul(xt, w), L.matmul(hp, u))
    body_inputs = [xt, hp, w, u] + ([b] if bias else [])
    body = Graph(body_inputs, [E.tanh(E.add(pre, b) if bias else pre)], name="step")
    X = input_value(TensorType((None, B, I)), "X")
    H0, W, U, Bv = (input_value(TensorType(s), n) for s, n in
                    (((B, H), "H0"), ((I, H), "W"), ((H, H), "U"), ((H,), "b")))
    params = [W, U] + ([Bv] if bias else [])
    _, Hs = C.scan(X, H0, *params, body=body, n_seqs=1, n_carry=1, go_backwards=go_backwards,
                   truncate_gradient=truncate_gradient)
    cost = R.sum(Hs)
    return [X, H0] + params, [cost] + cgvm.grad(cost, params)


def _data(rng, steps=6, bias=False):
    arrays = [rng.standard_normal((steps, B, I)), rng.standard_normal((B, H)) * 0.5,
              rng.standard_normal((I, H)) * 0.5, rng.standard_normal((H, H)) * 0.5]
    if bias:
        arrays.append(rng.standard_normal(H) * 0.5)
    return [a.astype(np.float32) for a in arrays]


def _numpy_rnn(X, H0, W, U, b=None, go_backwards=False):
    order = range(X.shape[0] - 1, -1, -1) if go_backwards else range(X.shape[0])
    h, hs, prev = H0, [], []
    for t in order:
        prev.append(h)
        h = np.tanh(X[t] @ W + h @ U + (0 if b is None else b))
        hs.append(h)
    gW, gU, gb, gh = np.zeros_like(W), np.zeros_like(U), np.zeros(H, np.float32), np.zeros_like(H0)
    for k, t in reversed(list(enumerate(order))):
        gz = (gh + 1.0) * (1 - hs[k] ** 2)
        gW += X[t].T @ gz
        gU += prev[k].T @ gz
        gb += gz.sum(0)
        gh = gz @ U.T
    return [sum(float(h.sum()) for h in hs), gW, gU] + ([gb] if b is not None else [])


def _scans(fn):
    return [n for n in fn.graph.nodes if n.op.name == "scan"]


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_rnn_gradients_match_a_numpy_loop_and_the_unrewritten_graph(go_backwards, bias):
    rng = np.random.default_rng(0)
    inputs, outputs = _rnn(go_backwards, bias)
    pushed = cgvm.compile(inputs, outputs)
    plain = cgvm.compile(inputs, outputs, passes=WITHOUT)
    data = _data(rng, bias=bias)
    got, ref = pushed(*data), plain(*data)
    want = _numpy_rnn(*data, go_backwards=go_backwards)
    for g, r, w in zip(got, ref, want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    # and again with another length: nothing was specialized to the first call's steps
    data = _data(rng, steps=9, bias=bias)
    for g, w in zip(pushed(*data), _numpy_rnn(*data, go_backwards=go_backwards)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_the_ir_changes_as_documented():
    inputs, outputs = _rnn(bias=True)
    pushed = cgvm.compile(inputs, outputs)
    plain = cgvm.compile(inputs, outputs, passes=WITHOUT)
    fwd, bwd = _scans(pushed)
    fwd0, bwd0 = _scans(plain)
    # forward: x_t @ W left the body, one matmul over all steps feeds it as a sequence
    body_ops = [n.op.name for n in fwd.attrs["body"].nodes]
    assert body_ops.count("matmul") + body_ops.count("gemm_bias_act") == 1
    assert fwd.attrs["n_seqs"] == fwd0.attrs["n_seqs"] + 1
    assert any(n.op.name == "matmul" and n.outputs[0] in fwd.inputs for n in pushed.graph.nodes)
    # backward: the gradients of W, U and b are no longer carries; only dh_t is carried
    assert bwd0.attrs["n_carry"] == 4 and bwd.attrs["n_carry"] == 1
    bwd_ops = [n.op.name for n in bwd.attrs["body"].nodes]
    assert bwd_ops.count("matmul") + bwd_ops.count("gemm_bias_act") == 1   # dh_t U^T only
    # tanh' = 1 - h_t² reads only the stacked forward outputs: computed for all steps before the loop
    assert "sub" not in bwd_ops and "sub" in [n.op.name for n in _scans(plain)[1].attrs["body"].nodes]
    # the backward loop stacks in sequence order: dz_t lines up with x_t without a reversing copy
    assert bwd.attrs["seq_order"] and "reverse" not in [n.op.name for n in pushed.graph.nodes]


def test_truncated_backpropagation_keeps_only_the_last_steps():
    rng = np.random.default_rng(1)
    inputs, outputs = _rnn(truncate_gradient=3)
    pushed = cgvm.compile(inputs, outputs)
    plain = cgvm.compile(inputs, outputs, passes=WITHOUT)
    assert _scans(pushed)[1].attrs["n_carry"] == 1
    data = _data(rng, steps=7)
    for g, r in zip(pushed(*data), plain(*data)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


def test_an_early_stop_leaves_the_unrun_steps_out_of_the_sum():
    """until: the accumulated product covers only the steps the loop ran."""
    at, bt = input_value(TensorType((B, I)), "a"), input_value(TensorType((B, H)), "b")
    acc = input_value(TensorType((I, H)), "acc")
    new_acc = E.add(acc, L.matmul(cgvm.ops.shape.transpose(at, perm=(1, 0)), bt))
    stop = E.gt(R.sum(bt), 100.0)
    body = Graph([at, bt, acc], [new_acc, stop], name="gram")
    A, Bs = input_value(TensorType((None, B, I)), "A"), input_value(TensorType((None, B, H)), "Bs")
    acc0 = input_value(TensorType((I, H)), "acc0")
    final = C.scan(A, Bs, acc0, body=body, n_seqs=2, n_carry=1, has_until=True, stacked=())
    pushed = cgvm.compile([A, Bs, acc0], final)
    assert _scans(pushed)[0].attrs["n_carry"] == 0
    rng = np.random.default_rng(2)
    a = rng.standard_normal((8, B, I)).astype(np.float32)
    b = rng.uniform(0, 1, (8, B, H)).astype(np.float32)
    b[4] += 10.0   # the loop stops after step 4
    acc_init = rng.standard_normal((I, H)).astype(np.float32)
    want = acc_init + sum(a[t].T @ b[t] for t in range(5))
    np.testing.assert_allclose(pushed(a, b, acc_init), want, rtol=1e-5, atol=1e-5)


def test_a_carry_read_elsewhere_in_the_body_stays_a_carry():
    at, acc = input_value(TensorType((B, I)), "a"), input_value(TensorType((I, I)), "acc")
    new_acc = E.add(acc, L.matmul(cgvm.ops.shape.transpose(at, perm=(1, 0)), at))
    y = R.sum(acc)   # the running value itself is a per-step output: no push-out
    body = Graph([at, acc], [new_acc, y], name="body")
    A, acc0 = input_value(TensorType((None, B, I)), "A"), input_value(TensorType((I, I)), "acc0")
    outs = C.scan(A, acc0, body=body, n_seqs=1, n_carry=1, stacked=())
    g = run_passes(Graph([A, acc0], list(outs)))
    assert [n for n in g.nodes if n.op.name == "scan"][0].attrs["n_carry"] == 1


def test_stacks_reused_across_calls_never_overwrite_what_a_caller_holds():
    rng = np.random.default_rng(3)
    xt, hp = input_value(TensorType((B, H)), "xt"), input_value(TensorType((B, H)), "h")
    body = Graph([xt, hp], [E.tanh(E.add(xt, hp))], name="step")
    X, H0 = input_value(TensorType((None, B, H)), "X"), input_value(TensorType((B, H)), "H0")
    _, Hs = C.scan(X, H0, body=body, n_seqs=1, n_carry=1)
    f = cgvm.compile([X, H0], Hs)
    x1, x2 = (rng.standard_normal((5, B, H)).astype(np.float32) for _ in range(2))
    h0 = np.zeros((B, H), np.float32)
    first = f(x1, h0)
    kept = first.copy()
    second = f(x2, h0)
    np.testing.assert_array_equal(first, kept)
    assert not np.array_equal(first, second)


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("limit", [{"n_steps": 4}, {"truncate": 3}])
def test_products_of_two_sequences_cover_only_the_steps_that_ran(go_backwards, limit):
    """acc += x_tᵀ y_t over sequences longer than the loop runs: unrun rows must not count."""
    xt, yt = input_value(TensorType((B, I)), "x"), input_value(TensorType((B, H)), "y")
    acc = input_value(TensorType((I, H)), "acc")
    body = Graph([xt, yt, acc], [E.add(acc, L.matmul(cgvm.ops.shape.transpose(xt, perm=(1, 0)), yt))],
                 name="gram")
    X, Y = input_value(TensorType((6, B, I)), "X"), input_value(TensorType((6, B, H)), "Y")
    acc0 = input_value(TensorType((I, H)), "acc0")
    final = C.scan(X, Y, acc0, body=body, n_seqs=2, n_carry=1, stacked=(), go_backwards=go_backwards, **limit)
    final = final[0] if isinstance(final, tuple) else final
    pushed = cgvm.compile([X, Y, acc0], final)
    assert _scans(pushed)[0].attrs["n_carry"] == 0
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((6, B, I)), rng.standard_normal((6, B, H))
    x, y = x.astype(np.float32), y.astype(np.float32)
    steps = limit.get("n_steps", 6)
    ran = min(steps, limit.get("truncate", steps))
    order = [steps - 1 - t for t in range(ran)] if go_backwards else list(range(ran))
    want = sum(x[i].T @ y[i] for i in order)
    np.testing.assert_allclose(pushed(x, y, np.zeros((I, H), np.float32)), want, rtol=1e-5, atol=1e-5)
