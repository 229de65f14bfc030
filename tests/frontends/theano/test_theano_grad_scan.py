"""grad / jacobian / hessian / Rop / Lop / zero_grad, scan (taps, until, updates, BPTT), ifelse, random, nnet, printing."""
import os

import numpy as np
import pytest

import cgvm.theano as theano
import cgvm.theano.tensor as T
from cgvm.theano.ifelse import ifelse
from cgvm.theano.gradient import DisconnectedInputError, Lop, Rop, disconnected_grad, hessian, jacobian, zero_grad

rng = np.random.RandomState(1)


def test_grad_basic_and_second_order():
    x = T.dvector("x")
    c = (x ** 3).sum()
    g = T.grad(c, x)
    gg = T.grad(g.sum(), x)
    v = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(theano.function([x], g)(v), 3 * v ** 2)
    np.testing.assert_allclose(theano.function([x], gg)(v), 6 * v)
    with pytest.raises(TypeError):
        T.grad(x * 2, x)
    y = T.dvector("y")
    with pytest.raises(DisconnectedInputError):
        T.grad(c, y)
    np.testing.assert_allclose(theano.function([y], T.grad(c, y, disconnected_inputs="ignore"))(v), 0 * v)
    assert T.grad(c, y, disconnected_inputs="ignore", return_disconnected="none") is None


def test_consider_constant_known_grads_zero_grad():
    x = T.dvector("x")
    y = x * 2
    c = (y * x).sum()
    v = np.array([1.0, 2.0])
    np.testing.assert_allclose(theano.function([x], T.grad(c, x, consider_constant=[y]))(v), 2 * v)
    np.testing.assert_allclose(theano.function([x], T.grad((zero_grad(x) * x).sum(), x))(v), v)
    np.testing.assert_allclose(theano.function([x], T.grad((disconnected_grad(x) * x).sum(), x))(v), v)
    g = T.grad(None, x, known_grads={y: T.ones_like(y)})
    np.testing.assert_allclose(theano.function([x], g)(v), [2, 2])


def test_jacobian_hessian_rop_lop():
    x = T.dvector("x")
    A = rng.randn(3, 3)
    y = T.dot(A, x) ** 2
    v = rng.randn(3)
    J = theano.function([x], jacobian(y, x))(v)
    np.testing.assert_allclose(J, 2 * (A @ v)[:, None] * A, rtol=1e-10)
    H = theano.function([x], hessian((x ** 3).sum(), x))(v)
    np.testing.assert_allclose(H, np.diag(6 * v), rtol=1e-10)
    u = T.dvector("u")
    np.testing.assert_allclose(theano.function([x, u], Rop(y, x, u))(v, v), J @ v, rtol=1e-10)
    np.testing.assert_allclose(theano.function([x, u], Lop(y, x, u))(v, v), v @ J, rtol=1e-10)


def test_scan_rnn_and_bptt():
    W = theano.shared(rng.randn(3, 3) * 0.5, name="W")
    xs = T.dmatrix("xs")
    h0 = T.dvector("h0")
    hs, upd = theano.scan(lambda x_t, h: T.tanh(x_t + T.dot(h, W)), sequences=xs, outputs_info=h0)
    cost = (hs ** 2).sum()
    gW, gh0 = T.grad(cost, [W, h0])
    f = theano.function([xs, h0], [hs, gW, gh0])
    X, H0 = rng.randn(5, 3), rng.randn(3)
    out, gw, gh = f(X, H0)
    Wv = W.get_value()
    ref, h = [], H0
    for t in range(5):
        h = np.tanh(X[t] + h @ Wv)
        ref.append(h)
    np.testing.assert_allclose(out, ref, rtol=1e-12)

    def cost_of(Wm, h0v):
        h, c = h0v, 0.0
        for t in range(5):
            h = np.tanh(X[t] + h @ Wm)
            c += (h ** 2).sum()
        return c
    eps = 1e-6
    num = np.zeros_like(Wv)
    for idx in np.ndindex(*Wv.shape):
        d = np.zeros_like(Wv)
        d[idx] = eps
        num[idx] = (cost_of(Wv + d, H0) - cost_of(Wv - d, H0)) / (2 * eps)
    np.testing.assert_allclose(gw, num, rtol=1e-5, atol=1e-8)


def test_scan_taps_nsteps_backwards_map_reduce():
    x = T.dvector("x")
    seq = np.arange(1.0, 7.0)
    out, _ = theano.scan(lambda a, b, c: a + 10 * b + 100 * c, sequences=dict(input=x, taps=[-2, 0, 1]))
    np.testing.assert_allclose(theano.function([x], out)(seq), seq[:-3] + 10 * seq[2:-1] + 100 * seq[3:])
    fib0 = T.dvector("f0")
    fib, _ = theano.scan(lambda a, b: a + b, outputs_info=dict(initial=fib0, taps=[-2, -1]), n_steps=6)
    np.testing.assert_allclose(theano.function([fib0], fib)([0.0, 1.0]), [1, 2, 3, 5, 8, 13])
    back, _ = theano.scan(lambda a: a * 2, sequences=x, go_backwards=True)
    np.testing.assert_allclose(theano.function([x], back)(seq), seq[::-1] * 2)
    sq, _ = theano.map(lambda a: a ** 2, x)
    np.testing.assert_allclose(theano.function([x], sq)(seq), seq ** 2)
    tot, _ = theano.reduce(lambda a, acc: acc + a, x, T.constant(0.0, dtype="float64"))
    assert float(theano.function([x], tot)(seq)) == seq.sum()
    n = T.lscalar("n")
    pw, _ = theano.scan(lambda p: p * 2, outputs_info=T.constant(1.0, dtype="float64"), n_steps=n)
    np.testing.assert_allclose(theano.function([n], pw)(4), [2, 4, 8, 16])
    assert theano.function([n], pw)(0).shape == (0,)


def test_scan_until_and_updates():
    x = T.dscalar("x")
    vals, _ = theano.scan(lambda p: (p * 2, theano.scan_module.until(p * 2 > 40)), outputs_info=x, n_steps=100)
    np.testing.assert_allclose(theano.function([x], vals)(3.0), [6, 12, 24, 48])
    counter = theano.shared(0.0)
    out, upd = theano.scan(lambda a: (a + counter, {counter: counter + 1}), sequences=T.dvector("s"))
    f = theano.function([out.owner.inputs[0] if False else T.dvector("unused")], [], on_unused_input="ignore")
    del f
    s = out.owner  # the scan node exists
    assert s is not None and counter in upd


def test_scan_nested():
    m = T.dmatrix("m")
    rows, _ = theano.scan(lambda r: theano.scan(lambda v: v * 3, sequences=r)[0], sequences=m)
    M = rng.randn(2, 3)
    np.testing.assert_allclose(theano.function([m], rows)(M), 3 * M)


def test_ifelse_lazy_and_grad():
    a, b = T.dscalars("a", "b")
    W = T.dvector("W")
    z = ifelse(T.lt(a, b), (W * a).sum(), (W * b).sum() * 2)
    f = theano.function([a, b, W], [z, T.grad(z, W)])
    v = np.array([1.0, 2.0])
    out, g = f(1.0, 2.0, v)
    assert out == 3.0 and list(g) == [1.0, 1.0]
    out, g = f(3.0, 2.0, v)
    assert out == 12.0 and list(g) == [4.0, 4.0]
    # lazy: the untaken branch would fail (shape mismatch) if it ran
    m, n = T.dvectors("m", "n")
    lazy = theano.function([a, m, n], ifelse(T.gt(a, 0), m.sum(), (m * n).sum()))
    assert float(lazy(1.0, np.ones(2), np.ones(3))) == 2.0
    with pytest.raises(TypeError):
        ifelse(W, a, b)


def test_random_streams_seeded():
    srng = T.shared_randomstreams.RandomStreams(seed=234)
    u = srng.uniform((2, 3))
    nrm = srng.normal((1000,), avg=1.0, std=2.0, dtype="float64")
    bi = srng.binomial(size=(4,), p=0.5)
    f = theano.function([], [u, nrm, bi])
    u1, n1, b1 = f()
    u2, _, _ = f()
    assert u1.shape == (2, 3) and u1.dtype == np.float64 and not np.allclose(u1, u2)
    assert abs(n1.mean() - 1.0) < 0.3 and abs(n1.std() - 2.0) < 0.3
    assert set(np.unique(b1)) <= {0, 1}
    frozen = theano.function([], u, no_default_updates=True)
    np.testing.assert_allclose(frozen(), frozen())
    srng2 = T.shared_randomstreams.RandomStreams(seed=234)
    np.testing.assert_allclose(theano.function([], srng2.uniform((2, 3)))(), u1)
    x = T.dmatrix()
    mask = srng.binomial(size=x.shape, p=0.5, dtype="float64")
    assert theano.function([x], x * mask)(np.ones((2, 5))).shape == (2, 5)
    c = srng.choice(size=(5,), a=3, p=[0.0, 0.0, 1.0])
    np.testing.assert_array_equal(theano.function([], c)(), [2] * 5)


def test_nnet():
    x = T.dmatrix("x")
    X = rng.randn(4, 3)
    e = np.exp(X - X.max(1, keepdims=True))
    sm = e / e.sum(1, keepdims=True)
    np.testing.assert_allclose(theano.function([x], T.nnet.softmax(x))(X), sm, rtol=1e-12)
    ls = T.log(T.nnet.softmax(x))
    assert ls.owner.op.name == "log_softmax"
    np.testing.assert_allclose(theano.function([x], ls)(X), np.log(sm), rtol=1e-10)
    y = T.lvector("y")
    Y = np.array([0, 2, 1, 1])
    ce = T.nnet.categorical_crossentropy(T.nnet.softmax(x), y)
    np.testing.assert_allclose(theano.function([x, y], ce)(X, Y), -np.log(sm[np.arange(4), Y]), rtol=1e-10)
    np.testing.assert_allclose(theano.function([x], T.nnet.relu(x))(X), np.maximum(X, 0))
    t = T.dmatrix("t")
    o = T.nnet.sigmoid(x)
    bce = T.nnet.binary_crossentropy(o, t)
    s = 1 / (1 + np.exp(-X))
    Tv = (X > 0).astype(float)
    np.testing.assert_allclose(theano.function([x, t], bce)(X, Tv), -(Tv * np.log(s) + (1 - Tv) * np.log(1 - s)),
                               rtol=1e-9)
    img = T.dtensor4("img")
    flt = T.dtensor4("flt")
    I, F = rng.randn(1, 1, 5, 5), rng.randn(1, 1, 3, 3)
    conv = theano.function([img, flt], T.nnet.conv2d(img, flt))(I, F)
    ref = np.array([[np.sum(I[0, 0, i:i + 3, j:j + 3] * F[0, 0, ::-1, ::-1]) for j in range(3)] for i in range(3)])
    np.testing.assert_allclose(conv[0, 0], ref, rtol=1e-10)
    from cgvm.theano.tensor.signal.pool import pool_2d
    P = theano.function([img], pool_2d(img, (2, 2), ignore_border=True))(I)
    np.testing.assert_allclose(P[0, 0], I[0, 0, :4, :4].reshape(2, 2, 2, 2).max(axis=(1, 3)))
    P2 = theano.function([img], pool_2d(img, (2, 2), ignore_border=False, mode="average_exc_pad"))(I)
    assert P2.shape == (1, 1, 3, 3) and np.isclose(P2[0, 0, 2, 2], I[0, 0, 4, 4])
    bn = T.nnet.bn.batch_normalization(x, 2.0, 1.0, x.mean(0), x.std(0))
    np.testing.assert_allclose(theano.function([x], bn)(X), (X - X.mean(0)) * 2 / X.std(0) + 1, rtol=1e-10)


def test_printing(tmp_path):
    x = T.dvector("x")
    w = theano.shared(np.ones(2), name="w")
    y = (x * w + 1).sum()
    assert "x" in theano.printing.pprint(y) and "w" in theano.printing.pprint(y)
    text = theano.printing.debugprint(y, file="str")
    assert "[id A]" in text and "sum" in text
    f = theano.function([x], y)
    assert "[id" in theano.printing.debugprint(f, file="str")
    out = theano.printing.pydotprint(f, outfile=str(tmp_path / "g.svg"))
    assert "<svg" in open(out).read()[:400]  # Graphviz's output starts with an XML prolog
    dot = theano.printing.pydotprint(f, outfile=str(tmp_path / "g.dot"))
    assert "digraph" in open(dot).read()
    assert os.path.getsize(out) > 100


def test_scan_last_row_is_the_final_carry_without_a_history():
    """all_pos[-1] of an HMC-style leapfrog: read from the final carry, so the loop stacks nothing;
    the numbers are a NumPy loop's. A step that hands a state back unchanged keeps the stack
    (the final carry would be the caller's own array)."""
    rng = np.random.default_rng(5)
    cov_inv = np.linalg.inv(np.eye(4) + 0.2)
    pos0, v0 = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    p, v = T.matrix("p"), T.matrix("v")

    def leapfrog(q, w):
        grad = T.grad((0.5 * (T.dot(q, cov_inv) * q).sum(axis=1)).sum(), q)
        new_w = w - 0.1 * grad
        return [q + 0.1 * new_w, new_w]

    (qs, ws), _ = theano.scan(leapfrog, outputs_info=[p, v], n_steps=6)
    f = theano.function([p, v], [qs[-1], ws[-1]])
    scans = [n for n in f.core.graph.nodes if n.op.name == "scan"]
    assert len(scans) == 1 and tuple(scans[0].attrs["stacked"]) == ()
    q, w = pos0.copy(), v0.copy()
    for _ in range(6):
        w = w - 0.1 * (0.5 * (q @ cov_inv) + 0.5 * (q @ cov_inv.T))
        q = q + 0.1 * w
    got_q, got_w = f(pos0, v0)
    np.testing.assert_allclose(got_q, q, rtol=1e-12)
    np.testing.assert_allclose(got_w, w, rtol=1e-12)

    (same, _), _ = theano.scan(lambda q, w: [q, w + 1.0], outputs_info=[p, v], n_steps=3)
    g = theano.function([p, v], same[-1])
    assert tuple(next(n for n in g.core.graph.nodes if n.op.name == "scan").attrs["stacked"]) == (0,)
    out = g(pos0, v0)
    assert not np.shares_memory(out, pos0)
    np.testing.assert_array_equal(out, pos0)
