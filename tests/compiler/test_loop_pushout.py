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


def _elman(steps=None):
    """One sentence through an Elman RNN (vectors per step, as the rnnslu tutorial):
    h_t = sigmoid(x_t Wx + h_{t-1} Wh + bh), y_t = softmax(h_t W + b) as a (1, classes) row;
    cost = -sum_t log y_t[label_t]; its gradients wrt every parameter."""
    from cgvm.ops import nn as N
    from cgvm.ops import shape as S
    from cgvm.ops import indexing as IX
    n_in, n_h, n_c = 4, 5, 3
    xt, hp = input_value(TensorType((n_in,), "float64"), "xt"), input_value(TensorType((n_h,), "float64"), "h")
    wx, wh, bh, w, b = (input_value(TensorType(s, "float64"), k) for s, k in
                        (((n_in, n_h), "wx"), ((n_h, n_h), "wh"), ((n_h,), "bh"), ((n_h, n_c), "w"), ((n_c,), "b")))
    ht = E.sigmoid(E.add(E.add(L.matmul(xt, wx), L.matmul(hp, wh)), bh))
    yt = N.softmax(S.expand_dims(E.add(L.matmul(ht, w), b), axis=0), axis=1)
    body = Graph([xt, hp, wx, wh, bh, w, b], [ht, yt], name="elman")
    X = input_value(TensorType((steps, n_in), "float64"), "X")
    onehot = input_value(TensorType((steps, 1, n_c), "float64"), "onehot")
    H0, WX, WH, BH, W, Bv = (input_value(v.type, k.upper()) for v, k in
                             zip((hp, wx, wh, bh, w, b), ("h0", "wx", "wh", "bh", "w", "b")))
    params = [H0, WX, WH, BH, W, Bv]
    _, Hs, Ys = C.scan(X, *params, body=body, n_seqs=1, n_carry=1)
    cost = E.neg(R.sum(E.mul(onehot, E.log(Ys))))
    return [X, onehot] + params, [cost, Ys] + cgvm.grad(cost, [X] + params)


def _elman_data(rng, steps):
    n_in, n_h, n_c = 4, 5, 3
    onehot = np.zeros((steps, 1, n_c))
    onehot[np.arange(steps), 0, rng.integers(0, n_c, steps)] = 1
    return [rng.standard_normal((steps, n_in)), onehot, rng.standard_normal(n_h) * 0.5] + \
        [rng.standard_normal(s) * 0.5 for s in ((n_in, n_h), (n_h, n_h), (n_h,), (n_h, n_c), (n_c,))]


def _numpy_elman(X, onehot, h0, wx, wh, bh, w, b):
    h, hs, ys = h0, [], []
    for x in X:
        h = 1 / (1 + np.exp(-(x @ wx + h @ wh + bh)))
        z = h @ w + b
        e = np.exp(z - z.max())
        hs.append(h)
        ys.append((e / e.sum())[None])
    return -float(np.sum(onehot * np.log(np.stack(ys)))), np.stack(ys)


def test_an_elman_rnn_computes_its_outputs_and_their_gradients_outside_the_loops():
    """softmax(h_t W + b) over the stacked h_t after the forward loop; the backward loop keeps only
    dh_t's recurrence (one product), with softmax_grad(gy_t, y_t) Wᵀ before it and dz_t Wxᵀ after it."""
    inputs, outputs = _elman()
    pushed = cgvm.compile(inputs, outputs)
    plain = cgvm.compile(inputs, outputs, passes=WITHOUT)
    fwd, bwd = _scans(pushed)
    fwd_ops = [n.op.name for n in fwd.attrs["body"].nodes]
    bwd_ops = [n.op.name for n in bwd.attrs["body"].nodes]
    assert "softmax" not in fwd_ops and fwd_ops.count("matmul") == 1             # h_{t-1} Wh only
    assert "softmax" not in bwd_ops and "softmax_grad" not in bwd_ops           # the forward's y_t is read
    assert bwd_ops.count("matmul") - sum(1 for n in bwd.attrs["body"].nodes    # (others only give shapes)
                                         if n.op.name == "matmul" and _only_shapes(bwd.attrs["body"], n)) == 1
    assert bwd.attrs["n_carry"] == 1
    # every input the loops take, their bodies read
    for s in (fwd, bwd):
        body = s.attrs["body"]
        read = {id(v) for n in body.nodes for v in n.inputs} | {id(v) for v in body.outputs}
        assert all(id(v) in read for v in body.inputs[s.attrs["n_seqs"]:])
    rng = np.random.default_rng(5)
    for steps in (6, 1, 3):   # lengths vary from call to call, as sentences do
        data = _elman_data(rng, steps)
        got, ref = pushed(*data), plain(*data)
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)
        cost, ys = _numpy_elman(*data)
        np.testing.assert_allclose(got[0], cost, rtol=1e-10)
        np.testing.assert_allclose(got[1], ys, rtol=1e-10)


def _only_shapes(body, node):
    """Whether the node's result is read for its shape alone (by sum_to_like: specialization drops it)."""
    out = node.outputs[0]
    return all(n.op.reads_only_shape(k) for n in body.nodes for k, v in enumerate(n.inputs) if v is out) and \
        all(v is not out for v in body.outputs)


def test_per_step_outputs_of_a_backwards_loop_read_its_stacks_in_its_order():
    """go_backwards stacks in iteration order: y_t = h_t * w goes after the loop over the stack,
    and a y_t that needs the sequence (iteration order differs from sequence order) stays."""
    xt, hp, w = input_value(TensorType((B, H)), "xt"), input_value(TensorType((B, H)), "h"), \
        input_value(TensorType((H,)), "w")
    ht = E.tanh(E.add(xt, hp))
    body = Graph([xt, hp, w], [ht, E.mul(ht, w), E.mul(ht, xt)], name="step")
    X, H0, W = input_value(TensorType((None, B, H)), "X"), input_value(TensorType((B, H)), "H0"), \
        input_value(TensorType((H,)), "W")
    outs = C.scan(X, H0, W, body=body, n_seqs=1, n_carry=1, go_backwards=True)
    pushed = cgvm.compile([X, H0, W], list(outs))
    plain = cgvm.compile([X, H0, W], list(outs), passes=WITHOUT)
    body_ops = [n.op.name for n in _scans(pushed)[0].attrs["body"].nodes]
    assert body_ops.count("mul") == 1
    rng = np.random.default_rng(6)
    data = [rng.standard_normal((5, B, H)).astype(np.float32), rng.standard_normal((B, H)).astype(np.float32),
            rng.standard_normal(H).astype(np.float32)]
    for g, r in zip(pushed(*data), plain(*data)):
        np.testing.assert_allclose(g, r, rtol=1e-6)
