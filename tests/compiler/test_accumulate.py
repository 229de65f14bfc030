"""Accumulating products: ``beta * c + alpha * (a @ b)`` as one gemm_accumulate adding into ``c``.

The rewrite is checked on the IR (before/after) and on results against the unoptimized program
or plain NumPy (weight decay, momentum, learning rates and decay factors as values, unknown
shapes, the Theano tutorial MLP with an L2 penalty in float32 and float64);
the BLAS binding against float64 NumPy products; the in-place weight update on the identity of
the parameter's array and on the values of a plain NumPy SGD loop.
"""
import numpy as np
import pytest

import cgvm
from cgvm.compiler.accumulate import fuse_accumulations
from cgvm.ir import Graph, TensorType, input_value, param_value
from cgvm.backend import blas
from cgvm.ops import elementwise as E
from cgvm.ops import linalg as L
from cgvm.ops import loss as LS
from cgvm.ops import reduce as R
from cgvm.ops import shape as S

RNG = np.random.default_rng(0)


def _names(graph):
    return [n.op.name for n in graph.nodes]


def _gemm(graph):
    (node,) = [n for n in graph.nodes if n.op.name == "gemm_accumulate"]
    return node


def _matrices(*shapes, dtype="float32"):
    return [input_value(TensorType(s, dtype), f"m{k}") for k, s in enumerate(shapes)]


@pytest.mark.parametrize("build, alpha, beta", [
    (lambda c, a, b: E.sub(c, E.mul(L.matmul(a, b), 0.25)), -0.25, 1.0),      # SGD: w - lr * g
    (lambda c, a, b: E.add(E.mul(0.5, L.matmul(a, b)), c), 0.5, 1.0),         # product first
    (lambda c, a, b: E.add(E.mul(c, 0.9), E.mul(L.matmul(a, b), 0.5)), 0.5, 0.9),  # momentum
    (lambda c, a, b: E.sub(L.matmul(a, b), c), 1.0, -1.0),
    (lambda c, a, b: E.sub(c, E.mul(0.1, E.add(L.matmul(a, b), E.mul(c, 0.01)))), -0.1, 0.999),   # weight decay
    (lambda c, a, b: E.add(E.neg(E.div(L.matmul(a, b), 4.0)), c), -0.25, 1.0),
    (lambda c, a, b: E.sub(E.mul(E.sub(c, L.matmul(a, b)), 0.5), E.mul(c, 0.25)), -0.5, 0.25),  # c twice
])
def test_products_added_to_a_matrix_become_one_op(build, alpha, beta):
    c, a, b = _matrices((6, 5), (6, 7), (7, 5))
    graph = Graph([c, a, b], [build(c, a, b)])
    fused = fuse_accumulations(graph)
    assert _names(fused) == ["gemm_accumulate"]
    node = _gemm(fused)
    assert node.attrs["alpha"] == pytest.approx(alpha) and node.attrs["beta"] == pytest.approx(beta)
    assert [v.name for v in node.inputs] == ["m1", "m2", "m0"]
    args = [RNG.standard_normal(v.shape).astype(np.float32) for v in (c, a, b)]
    want = cgvm.compile([c, a, b], build(c, a, b), passes=[])(*args)
    got = cgvm.compile([c, a, b], build(c, a, b))(*args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_what_is_not_rewritten():
    c, a, b, bias = _matrices((6, 5), (6, 7), (7, 5), (5,))
    p = L.matmul(a, b)
    shared = Graph([c, a, b], [E.sub(c, p), E.mul(p, 2.0)])     # the product has a second reader
    assert "gemm_accumulate" not in _names(fuse_accumulations(shared))
    broadcast = Graph([a, b, bias], [E.add(L.matmul(a, b), bias)])   # a bias: gemm_bias_act's business
    assert "gemm_accumulate" not in _names(fuse_accumulations(broadcast))
    plain = Graph([c, a, b], [E.tanh(E.add(c, L.matmul(a, b)))])      # an RNN step: gemm_bias_act's, with its tanh
    assert "gemm_accumulate" not in _names(fuse_accumulations(plain))
    two = Graph([c, a, b], [E.add(E.sub(c, L.matmul(a, b)), E.mul(L.matmul(a, b), 0.5))])   # two products:
    assert sorted(_names(fuse_accumulations(two))) == ["add", "gemm_accumulate", "matmul", "mul"]   # c - p alone
    d = _matrices((6, 5))[0]
    three = Graph([c, a, b, d], [E.sub(E.add(c, d), E.mul(L.matmul(a, b), 0.5))])   # c and d: a third base
    assert "gemm_accumulate" not in _names(fuse_accumulations(three))
    cancels = Graph([c, a, b], [E.sub(E.add(c, E.mul(L.matmul(a, b), 0.5)), c)])   # beta 0: BLAS would skip c
    assert _names(fuse_accumulations(cancels)) == ["gemm_accumulate", "sub"]    # (c + p / 2) as one, then - c
    batched = _matrices((2, 6, 5), (2, 6, 7), (2, 7, 5))
    stacked = Graph(batched, [E.add(batched[0], L.matmul(batched[1], batched[2]))])
    assert "gemm_accumulate" not in _names(fuse_accumulations(stacked))


def test_a_learning_rate_value_scales_the_product():
    c, a, b = _matrices((6, 5), (6, 7), (7, 5))
    lr = input_value(TensorType((), "float32"), "lr")
    update = E.sub(E.mul(c, 0.9), E.mul(lr, L.matmul(a, b)))        # Keras momentum: mu * m - lr * g
    fused = fuse_accumulations(Graph([c, a, b, lr], [update]))
    node = _gemm(fused)
    assert node.attrs["alpha"] == -1.0 and node.attrs["beta"] == pytest.approx(0.9)
    assert [v.name for v in node.inputs] == ["m1", "m2", "m0", "lr"]
    args = [RNG.standard_normal(v.shape).astype(np.float32) for v in (c, a, b)] + [np.float32(0.05)]
    want = cgvm.compile([c, a, b, lr], update, passes=[])(*args)
    np.testing.assert_allclose(cgvm.compile([c, a, b, lr], update)(*args), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows_c, rows_a", [(6, 6), (1, 6), (6, 1)])
def test_unknown_shapes_broadcast_at_run_time_as_the_add_did(rows_c, rows_a):
    c, a, b = _matrices((None, None), (None, 7), (7, None))     # Theano's shared variables: no static shape
    update = E.sub(c, E.mul(L.matmul(a, b), 0.5))
    f = cgvm.compile([c, a, b], update)
    assert "gemm_accumulate" in [n.op.name for n in f.graph.nodes]
    cv, av, bv = (RNG.standard_normal(s).astype(np.float32) for s in ((rows_c, 5), (rows_a, 7), (7, 5)))
    np.testing.assert_allclose(f(cv, av, bv), cv - 0.5 * (av @ bv), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_blas_accumulation_matches_numpy(dtype, trans_a, trans_b):
    if not blas.available():
        pytest.skip("NumPy's BLAS could not be bound here (threadpoolctl missing or an unknown BLAS)")
    m, k, n = 70, 90, 60
    a = RNG.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = RNG.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    a, b = (a.T if trans_a else a), (b.T if trans_b else b)
    c = RNG.standard_normal((m, n)).astype(dtype)
    want = -0.3 * (a.astype(np.float64) @ b.astype(np.float64)) + 0.7 * c
    assert blas.accumulate_product(-0.3, a, b, 0.7, c)
    np.testing.assert_allclose(c, want, rtol=1e-4 if dtype == "float32" else 1e-12, atol=1e-4 if dtype == "float32" else 1e-12)


def test_blas_accumulation_copies_strided_operands_and_declines_what_it_cannot_do():
    if not blas.available():
        pytest.skip("NumPy's BLAS could not be bound here")
    a = RNG.standard_normal((80, 200)).astype(np.float32)[:, ::2]    # neither C- nor F-contiguous
    b = RNG.standard_normal((100, 90)).astype(np.float32)
    c = np.zeros((80, 90), np.float32)
    assert blas.accumulate_product(1.0, a, b, 0.0, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
    small = np.ones((2, 2), np.float32)
    assert not blas.accumulate_product(1.0, small, small, 1.0, small.copy())             # below the size floor
    ints = np.ones((300, 300), np.int64)
    assert not blas.accumulate_product(1.0, ints, ints, 1.0, ints.copy())                # no integer gemm
    strided_c = np.zeros((90, 180), np.float32)[:, ::2]
    assert not blas.accumulate_product(1.0, b.T.copy(), b, 1.0, strided_c)               # c must be C-contiguous


@pytest.mark.parametrize("use_blas", [True, False])
def test_product_plus_accumulates_into_c_or_a_copy(monkeypatch, use_blas):
    if not use_blas:
        monkeypatch.setattr(blas, "accumulate_product", lambda *args: False)
    a = RNG.standard_normal((120, 100)).astype(np.float32).T    # Fortran-ordered, as a transposed operand
    b = RNG.standard_normal((120, 110)).astype(np.float32)
    c = RNG.standard_normal((100, 110)).astype(np.float32)
    want = -0.5 * (a.astype(np.float64) @ b) + 2.0 * c
    kept = c.copy()
    out = np.empty_like(c)
    assert L.product_plus(np, a, b, c, -0.5, 2.0, out) is out
    np.testing.assert_array_equal(c, kept)                       # c untouched when the result goes elsewhere
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(L.product_plus(np, a, b, c, -0.5, 2.0), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(c, kept)
    assert L.product_plus(np, a, b, c, -0.5, 2.0, c) is c        # planned in place: c dies here
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-4)


def test_gemm_keeps_broadcasting_its_bias():
    kernel = L.gemm.bind(np, {"trans_a": False, "trans_b": True, "alpha": 2.0, "beta": 0.5})
    a, b, bias = (RNG.standard_normal(s).astype(np.float32) for s in ((30, 20), (40, 20), (40,)))
    np.testing.assert_allclose(kernel(a, b, bias), 2.0 * a @ b.T + 0.5 * bias, rtol=1e-5, atol=1e-5)
    full = RNG.standard_normal((30, 40)).astype(np.float32)
    np.testing.assert_allclose(kernel(a, b, full), 2.0 * a @ b.T + 0.5 * full, rtol=1e-5, atol=1e-5)


def _mlp_step(ws, lr=0.05):
    x = input_value(TensorType((None, 40), "float32"), "x")
    y = input_value(TensorType((None,), "int64"), "y")
    w1, w2 = param_value("w1", TensorType((40, 30))), param_value("w2", TensorType((30, 5)))
    h = E.relu(L.matmul(x, w1))
    loss = LS.softmax_cross_entropy(L.matmul(h, w2), y)
    g1, g2 = cgvm.grad(loss, [w1, w2])
    return cgvm.compile([x, y], loss, workspace=ws,
                        updates={w1: E.sub(w1, E.mul(g1, lr)), w2: E.sub(w2, E.mul(g2, lr))})


def _mlp_workspace():
    """A workspace holding the MLP's two weights, and copies of their initial values."""
    ws = cgvm.Workspace()
    w1, w2 = (RNG.standard_normal((40, 30)) * 0.2).astype(np.float32), (RNG.standard_normal((30, 5)) * 0.2).astype(np.float32)
    ws["w1"], ws["w2"] = w1.copy(), w2.copy()
    return ws, w1, w2


def _numpy_sgd(w1, w2, x, y, lr=0.05, steps=1):
    """The same MLP step in float64 NumPy: softmax cross-entropy, backprop by hand."""
    w1, w2 = w1.astype(np.float64), w2.astype(np.float64)
    for _ in range(steps):
        z = x @ w1
        h = np.maximum(z, 0)
        logits = h @ w2
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        d = p.copy()
        d[np.arange(len(y)), y] -= 1
        d /= len(y)
        g2 = h.T @ d
        g1 = x.T @ ((d @ w2.T) * (z > 0))
        w1, w2 = w1 - lr * g1, w2 - lr * g2
    return w1, w2


def _data(n=64):
    return RNG.standard_normal((n, 40)).astype(np.float32), RNG.integers(0, 5, n)


def test_sgd_updates_write_into_the_parameters_own_arrays():
    ws, w1, w2 = _mlp_workspace()
    step = _mlp_step(ws)
    assert sum(n.op.name == "gemm_accumulate" for n in step.graph.nodes) == 2
    x, y = _data()
    step(x, y)                     # the first call binds fresh arrays; from then on they are updated in place
    a1, a2 = id(ws["w1"]), id(ws["w2"])
    for _ in range(4):
        step(x, y)
    assert (id(ws["w1"]), id(ws["w2"])) == (a1, a2)
    want1, want2 = _numpy_sgd(w1, w2, x, y, steps=5)
    np.testing.assert_allclose(ws["w1"], want1, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ws["w2"], want2, rtol=1e-4, atol=1e-5)


def test_an_update_never_writes_into_an_array_someone_holds():
    ws, w1, w2 = _mlp_workspace()
    step = _mlp_step(ws)
    x, y = _data()
    step(x, y)
    history = []
    for _ in range(3):
        history.append((ws["w1"], ws["w1"].copy()))    # the user keeps the array and its values
        step(x, y)
    for held, values in history:
        np.testing.assert_array_equal(held, values)
    memory = np.zeros((2, 40, 30), np.float32)
    memory[1] = ws["w1"]
    kept = memory.copy()
    ws["w1"] = memory[1]                                 # a parameter that is a view of user memory
    for _ in range(3):
        step(x, y)
    np.testing.assert_array_equal(memory, kept)
    assert not np.shares_memory(ws["w1"], memory)


def test_a_parameter_that_is_also_an_output_is_not_overwritten():
    ws = cgvm.Workspace()
    ws["w"] = RNG.standard_normal((30, 20)).astype(np.float32)
    a = input_value(TensorType((50, 30), "float32"), "a")
    b = input_value(TensorType((50, 20), "float32"), "b")
    w = param_value("w", TensorType((30, 20)))
    f = cgvm.compile([a, b], w, workspace=ws, updates={w: E.sub(w, E.mul(L.matmul(S.transpose(a), b), 0.1))})
    av, bv = RNG.standard_normal((50, 30)).astype(np.float32), RNG.standard_normal((50, 20)).astype(np.float32)
    f(av, bv)
    before = ws["w"].copy()
    returned = f(av, bv)
    np.testing.assert_array_equal(returned, before)     # the output is the old value, untouched
    np.testing.assert_allclose(ws["w"], before - 0.1 * av.T @ bv, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("order", ["w_first", "v_first"])
def test_a_parameter_read_after_its_update_keeps_its_old_value_there(order):
    ws = cgvm.Workspace()
    ws["w"] = RNG.standard_normal((30, 20)).astype(np.float32)
    ws["v"] = RNG.standard_normal((30, 20)).astype(np.float32)
    a = input_value(TensorType((50, 30), "float32"), "a")
    b = input_value(TensorType((50, 20), "float32"), "b")
    w, v = param_value("w", TensorType((30, 20))), param_value("v", TensorType((30, 20)))
    new_w = E.sub(w, E.mul(L.matmul(S.transpose(a), b), 0.1))
    new_v = E.add(v, E.mul(w, 2.0))                     # reads the old w
    updates = {w: new_w, v: new_v} if order == "w_first" else {v: new_v, w: new_w}
    f = cgvm.compile([a, b], [], workspace=ws, updates=updates)
    av, bv = RNG.standard_normal((50, 30)).astype(np.float32), RNG.standard_normal((50, 20)).astype(np.float32)
    for _ in range(3):
        w0, v0 = ws["w"].copy(), ws["v"].copy()
        f(av, bv)
        np.testing.assert_allclose(ws["v"], v0 + 2.0 * w0, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(ws["w"], w0 - 0.1 * av.T @ bv, rtol=1e-4, atol=1e-5)


def test_an_update_reading_a_view_of_its_parameter_is_not_done_in_place():
    ws = cgvm.Workspace()
    ws["w"] = RNG.standard_normal((40, 40)).astype(np.float32)
    b = input_value(TensorType((40, 40), "float32"), "b")
    w = param_value("w", TensorType((40, 40)))
    f = cgvm.compile([b], [], workspace=ws, updates={w: E.sub(w, E.mul(L.matmul(S.transpose(w), b), 0.1))})
    assert [n.op.name for n in f.graph.nodes if n.op.name == "gemm_accumulate"] == ["gemm_accumulate"]
    bv = RNG.standard_normal((40, 40)).astype(np.float32)
    for _ in range(3):
        w0 = ws["w"].copy()
        f(bv)
        np.testing.assert_allclose(ws["w"], w0 - 0.1 * w0.T @ bv, rtol=1e-4, atol=1e-5)


def test_a_read_only_parameter_array_is_replaced_not_written():
    ws, w1, w2 = _mlp_workspace()
    step = _mlp_step(ws)
    x, y = _data()
    step(x, y)
    frozen = ws["w1"].copy()
    frozen.flags.writeable = False
    ws["w1"] = frozen
    del frozen                                           # only the workspace holds it, but it is read-only
    import weakref

    before = weakref.ref(ws["w1"])                       # a weak reference does not count as a holder
    step(x, y)
    assert ws["w1"] is not before()                      # a new array: the read-only one was not written


# --------------------------------------------------------------------------- linear combinations

def _numpy_sgd_decay(w, x, d, lr, k):
    """One weight-decayed SGD step in float64: w - lr * (x.T @ d + 2 k w)."""
    w = w.astype(np.float64)
    return w - lr * (x.T.astype(np.float64) @ d + 2.0 * k * w)


def _decay_graph(dtype, lr=None, k=None, shape=(30, 20)):
    """``w - lr * (x.T @ d + 2 * w * k)``, lr and k constants or 0-d inputs, w of a static or unknown shape."""
    w = input_value(TensorType(shape, dtype), "w")
    x = input_value(TensorType((50, None if shape[0] is None else shape[0]), dtype), "x")
    d = input_value(TensorType((50, shape[1]), dtype), "d")
    ins = [w, x, d]
    if lr is None:
        lr = input_value(TensorType((), dtype), "lr")
        ins.append(lr)
    if k is None:
        k = input_value(TensorType((), dtype), "k")
        ins.append(k)
    update = E.sub(w, E.mul(lr, E.add(L.matmul(S.transpose(x), d), E.mul(E.mul(w, 2.0), k))))
    return ins, update


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("lr, k", [(0.05, 1e-3), (None, 1e-3), (0.05, None), (None, None)],
                         ids=["constants", "lr_value", "decay_value", "both_values"])
def test_weight_decay_sgd_is_one_gemm(dtype, lr, k):
    ins, update = _decay_graph(dtype, lr, k)
    f = cgvm.compile(ins, update)
    assert _names(f.graph).count("gemm_accumulate") == 1 and "matmul" not in _names(f.graph)
    node = _gemm(f.graph)
    symbolic = lr is None or k is None
    assert len(node.inputs) == (5 if symbolic else 3)     # beta = 1 - 2 lr k: a scalar value beside the op
    if not symbolic:
        assert node.attrs["alpha"] == pytest.approx(-0.05) and node.attrs["beta"] == pytest.approx(1 - 0.05 * 2e-3)
    wv, xv, dv = (RNG.standard_normal(s).astype(dtype) for s in ((30, 20), (50, 30), (50, 20)))
    lrv, kv = 0.05 if lr is not None else 0.07, 1e-3 if k is not None else 0.3
    args = [wv, xv, dv] + ([np.asarray(lrv, dtype)] if lr is None else []) + ([np.asarray(kv, dtype)] if k is None else [])
    tol = 1e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(f(*args), _numpy_sgd_decay(wv, xv, dv, lrv, kv), rtol=tol, atol=tol)


def test_momentum_with_decay_and_a_runtime_learning_rate():
    """Keras-style: v' = mu v - lr (x.T @ d + k v) with mu, k constants and lr a value."""
    v, x, d = _matrices((30, 20), (50, 30), (50, 20), dtype="float64")
    lr = input_value(TensorType((), "float64"), "lr")
    update = E.sub(E.mul(v, 0.9), E.mul(lr, E.add(L.matmul(S.transpose(x), d), E.mul(0.01, v))))
    f = cgvm.compile([v, x, d, lr], update)
    node = _gemm(f.graph)
    assert node.attrs["alpha"] == -1.0 and len(node.inputs) == 5     # beta = 0.9 - 0.01 lr: a scalar value
    vv, xv, dv = (RNG.standard_normal(s) for s in ((30, 20), (50, 30), (50, 20)))
    want = 0.9 * vv - 0.3 * (xv.T @ dv + 0.01 * vv)
    np.testing.assert_allclose(f(vv, xv, dv, np.float64(0.3)), want, rtol=1e-12, atol=1e-12)


def test_autodiffs_penalty_gradient_is_read_through_its_broadcast_and_sum_to_like():
    """The gradient of ``k * sum(w ** 2)`` as autodiff writes it for shapes it cannot know: the seed
    broadcast_like'd to square(w), summed back to w's shape."""
    w = input_value(TensorType((None, None), "float64"), "w")
    x, d = input_value(TensorType((None, None), "float64"), "x"), input_value(TensorType((None, None), "float64"), "d")
    k = input_value(TensorType((), "float64"), "k")
    seed = S.broadcast_like(S.expand_dims(k, axis=(0, 1)), E.square(w))
    penalty_grad = R.sum_to_like(E.mul(E.mul(2.0, w), seed), w)
    update = E.sub(w, E.mul(0.01, E.add(penalty_grad, L.matmul(S.transpose(x), d))))
    f = cgvm.compile([w, x, d, k], update)
    assert _names(f.graph).count("gemm_accumulate") == 1 and "square" not in _names(f.graph)
    wv, xv, dv = (RNG.standard_normal(s) for s in ((30, 20), (50, 30), (50, 20)))
    np.testing.assert_allclose(f(wv, xv, dv, np.float64(0.2)), wv - 0.01 * (2 * 0.2 * wv + xv.T @ dv),
                               rtol=1e-12, atol=1e-12)


def test_a_broadcast_or_a_sum_that_may_change_the_shape_is_not_read_through():
    w, x, d, big = (input_value(TensorType((None, None), "float64"), n) for n in ("w", "x", "d", "big"))
    k = input_value(TensorType((), "float64"), "k")
    p = L.matmul(S.transpose(x), d)
    widening = E.sub(w, E.mul(0.01, E.add(p, E.mul(w, S.broadcast_like(k, big)))))   # big may be wider than w
    g = fuse_accumulations(Graph([w, x, d, big, k], [widening]))
    assert "gemm_accumulate" not in _names(g)
    summing = E.sub(w, E.mul(0.01, E.add(p, R.sum_to_like(E.mul(big, 2.0), w))))   # a real sum over big's axes
    g = fuse_accumulations(Graph([w, x, d, big], [summing]))
    assert "gemm_accumulate" not in _names(g)
    wv, xv, dv = (RNG.standard_normal(s) for s in ((1, 20), (50, 30), (50, 20)))
    bigv = RNG.standard_normal((30, 20))
    f = cgvm.compile([w, x, d, big, k], widening)
    np.testing.assert_allclose(f(wv, xv, dv, bigv, np.float64(0.5)),
                               wv - 0.01 * (xv.T @ dv + wv * np.broadcast_to(0.5, bigv.shape)), rtol=1e-12)
    f = cgvm.compile([w, x, d, big], summing)
    np.testing.assert_allclose(f(np.zeros((1, 20)), xv, dv, bigv),
                               -0.01 * (xv.T @ dv + 2 * bigv.sum(0, keepdims=True)), rtol=1e-12)


@pytest.mark.parametrize("rows_w, rows_x", [(30, 30), (1, 30)])
def test_a_decayed_update_of_unknown_shapes_broadcasts_as_the_adds_did(rows_w, rows_x):
    ins, update = _decay_graph("float64", 0.05, None, shape=(None, None))
    f = cgvm.compile(ins, update)
    assert "gemm_accumulate" in _names(f.graph)
    wv, xv, dv = (RNG.standard_normal(s) for s in ((rows_w, 20), (50, rows_x), (50, 20)))
    np.testing.assert_allclose(f(wv, xv, dv, np.float64(0.1)), _numpy_sgd_decay(wv, xv, dv, 0.05, 0.1),
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(Exception):
        f(RNG.standard_normal((7, 20)), xv, dv, np.float64(0.1))     # 7 rows against 30: the adds' error too


def _theano_decay_step(dtype, n_in=60, n_hid=40, n_out=5, batch=20, momentum=False):
    """The Theano tutorial's MLP step with L2 weight decay (the benchmark's form), in cgvm.theano."""
    import cgvm.theano as theano
    import cgvm.theano.tensor as T
    rng = np.random.default_rng(5)
    data, labels = rng.random((4 * batch, n_in)).astype(dtype), rng.integers(0, n_out, 4 * batch)
    X, Y = theano.shared(data, name="X"), theano.shared(labels, name="Y")
    W1 = theano.shared(rng.uniform(-0.3, 0.3, (n_in, n_hid)).astype(dtype), name="W1")
    W2 = theano.shared(rng.uniform(-0.3, 0.3, (n_hid, n_out)).astype(dtype), name="W2")
    x, y, i = T.matrix("x", dtype=dtype), T.vector("y", dtype="int64"), T.lscalar("i")
    h = T.tanh(T.dot(x, W1))
    z = T.dot(h, W2)
    logp = z - T.log(T.sum(T.exp(z - T.max(z, axis=1, keepdims=True)), axis=1, keepdims=True)) \
        - T.max(z, axis=1, keepdims=True)
    cost = -T.mean(logp[T.arange(y.shape[0]), y]) + 0.01 * ((W1 ** 2).sum() + (W2 ** 2).sum())
    params = [W1, W2]
    grads = T.grad(cost, params)
    lr = np.asarray(0.1, dtype)
    if momentum:
        vs = [theano.shared(np.zeros(p.get_value().shape, dtype), name=f"v{k}") for k, p in enumerate(params)]
        updates = [(v, np.asarray(0.9, dtype) * v - lr * g) for v, g in zip(vs, grads)] + \
                  [(p, p + np.asarray(0.9, dtype) * v - lr * g) for p, v, g in zip(params, vs, grads)]
    else:
        updates = [(p, p - lr * g) for p, g in zip(params, grads)]
    f = theano.function([i], cost, updates=updates,
                        givens={x: X[i * batch:(i + 1) * batch], y: Y[i * batch:(i + 1) * batch]})
    return f, W1, W2, data, labels


def _numpy_decay_step(w1, w2, x, y, k=0.01, lr=0.1):
    """The same step by hand in float64: tanh layer, softmax NLL, penalty k * sum of squares."""
    h = np.tanh(x @ w1)
    z = h @ w2
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    cost = -np.mean(np.log(p[np.arange(len(y)), y])) + k * ((w1 ** 2).sum() + (w2 ** 2).sum())
    dz = p.copy()
    dz[np.arange(len(y)), y] -= 1
    dz /= len(y)
    g2 = h.T @ dz + 2 * k * w2
    g1 = x.T @ ((dz @ w2.T) * (1 - h ** 2)) + 2 * k * w1
    return cost, g1, g2


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_tutorial_mlp_with_weight_decay_updates_in_place_by_one_gemm_each(dtype):
    f, W1, W2, data, labels = _theano_decay_step(dtype)
    names = [n.op.name for n in f.graph.nodes]
    assert names.count("gemm_accumulate") == 2 and names.count("sum_squares") == 2 and "square" not in names
    w1, w2 = W1.get_value().astype(np.float64), W2.get_value().astype(np.float64)
    f(0)                                  # the first call binds fresh arrays; from then on they are updated in place
    cost, g1, g2 = _numpy_decay_step(w1, w2, data[:20].astype(np.float64), labels[:20])
    w1, w2 = w1 - 0.1 * g1, w2 - 0.1 * g2
    held = (id(W1.get_value(borrow=True)), id(W2.get_value(borrow=True)))
    tol = 1e-4 if dtype == "float32" else 1e-10
    for i in (1, 2, 3):
        got = f(i)
        cost, g1, g2 = _numpy_decay_step(w1, w2, data[20 * i:20 * (i + 1)].astype(np.float64), labels[20 * i:20 * (i + 1)])
        np.testing.assert_allclose(got, cost, rtol=tol)
        w1, w2 = w1 - 0.1 * g1, w2 - 0.1 * g2
        np.testing.assert_allclose(W1.get_value(), w1, rtol=tol, atol=tol)
        np.testing.assert_allclose(W2.get_value(), w2, rtol=tol, atol=tol)
    assert (id(W1.get_value(borrow=True)), id(W2.get_value(borrow=True))) == held


def test_momentum_with_decay_in_theano_matches_numpy():
    f, W1, W2, data, labels = _theano_decay_step("float64", momentum=True)
    assert [n.op.name for n in f.graph.nodes].count("gemm_accumulate") >= 2
    w1, w2 = W1.get_value(), W2.get_value()
    v1, v2 = np.zeros_like(w1), np.zeros_like(w2)
    for i in range(3):
        f(i)
        _, g1, g2 = _numpy_decay_step(w1, w2, data[20 * i:20 * (i + 1)], labels[20 * i:20 * (i + 1)])
        w1, w2 = w1 + 0.9 * v1 - 0.1 * g1, w2 + 0.9 * v2 - 0.1 * g2
        v1, v2 = 0.9 * v1 - 0.1 * g1, 0.9 * v2 - 0.1 * g2
        np.testing.assert_allclose(W1.get_value(), w1, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(W2.get_value(), w2, rtol=1e-10, atol=1e-12)


def test_a_long_sum_of_products_is_walked_without_recursion_and_quickly():
    """A weight read in 3000 places: its gradient is a chain of 3000 adds of products (an unrolled
    network). No root of it is this pattern; each is given up on after its first three bases."""
    import time
    c, a, b = _matrices((6, 5), (6, 7), (7, 5))
    total = c
    for _ in range(3000):
        total = E.add(total, L.matmul(a, b))
    graph = Graph([c, a, b], [total])
    start = time.perf_counter()
    fused = fuse_accumulations(graph)
    assert time.perf_counter() - start < 5.0
    assert "gemm_accumulate" not in _names(fused)          # the innermost c + p is a plain sum: the epilogues'
    total = E.sub(E.mul(c, 0.5), L.matmul(a, b))
    for _ in range(3000):
        total = E.add(total, L.matmul(a, b))
    assert _names(fuse_accumulations(Graph([c, a, b], [total]))).count("gemm_accumulate") == 1   # the innermost
