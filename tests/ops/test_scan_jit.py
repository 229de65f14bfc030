"""The compiled loop tier (cgvm.ops.kernels.scan_jit): a hot scan run as one Numba function.

With ``CGVM_JIT_HOT=0`` every scan compiles at its first call; each result is checked against
the Python step loop (``CGVM_JIT=0``) and a plain NumPy loop, gradients also against central
differences. Bodies the tier cannot write, or that Numba fails on, keep the Python loop.
"""
import numpy as np
import pytest

import cgvm
from cgvm.errors import ConfigError
from cgvm.ir import Graph, TensorType, input_value
from cgvm.ops import control as C
from cgvm.ops import elementwise as E
from cgvm.ops import indexing as I
from cgvm.ops import linalg as L
from cgvm.ops import loop_code as lc
from cgvm.ops import reduce as R
from cgvm.ops import shape as S
from cgvm.ops.kernels import scan_jit
from harness import numeric_grad

F64 = "float64"


@pytest.fixture
def jit_now(monkeypatch):
    """The tier on, compiling at a scan's first call (skipped without numba)."""
    pytest.importorskip("numba")
    monkeypatch.delenv("CGVM_JIT", raising=False)
    monkeypatch.setenv("CGVM_JIT_HOT", "0")


def tensor(name, *shape, dtype=F64):
    return input_value(TensorType(shape, dtype), name)


def scan_jits(f):
    """The tier of each scan kernel of compiled function ``f`` (None where it is off)."""
    return [k.jit for k in f.executable.kernels if hasattr(k, "jit")]


def compiled_both(monkeypatch, build):
    """``build()`` compiled with the tier (as the environment says) and without it."""
    with_jit = build()
    monkeypatch.setenv("CGVM_JIT", "0")
    python = build()
    monkeypatch.delenv("CGVM_JIT")
    assert all(j is None for j in scan_jits(python))
    return with_jit, python


# --------------------------------------------------------------------------- the HMC leapfrog

MU = np.array([0.1, -0.3, 0.2, 0.05, 0.4])
COV_INV = np.linalg.inv(np.eye(5) + 0.1)


def leapfrog_body():
    """p, v, eps -> p + eps v', v' with v' = v - eps dE/dp, E(p) = 0.5 sum((p - mu) A (p - mu))."""
    p, v, a, eps = tensor("p", 3, 5), tensor("v", 3, 5), tensor("A", 5, 5), tensor("eps")
    d = E.sub(p, MU)
    energy = E.mul(0.5, R.sum(E.mul(L.matmul(d, a), d), axis=(1,)))
    (g,) = cgvm.grad(R.sum(energy), [p])
    new_v = E.sub(v, E.mul(eps, g))
    return Graph([p, v, a, eps], [E.add(p, E.mul(eps, new_v)), new_v], name="leapfrog")


def leapfrog_numpy(p, v, a, eps, steps):
    ps = []
    for _ in range(steps):
        d = p - MU
        v = v - eps * 0.5 * (d @ a + d @ a.T)
        p = p + eps * v
        ps.append(p)
    return p, v, np.stack(ps)


def test_leapfrog_runs_compiled_and_agrees_with_the_python_loop_and_numpy(jit_now, monkeypatch):
    def build():
        syms = [tensor("P", 3, 5), tensor("V", 3, 5), tensor("A", 5, 5), tensor("eps")]
        outs = C.scan(*syms, body=leapfrog_body(), n_carry=2, n_steps=20, stacked=(0,))
        return cgvm.compile(syms, list(outs))

    f, python = compiled_both(monkeypatch, build)
    rng = np.random.default_rng(0)
    for call in range(3):   # the compiled loop again, with new values
        args = [rng.standard_normal((3, 5)), rng.standard_normal((3, 5)), COV_INV, np.float64(0.01 * (call + 1))]
        got, ref = f(*args), python(*args)
        want = leapfrog_numpy(*args, steps=20)
        for g, r, w in zip(got, ref, want):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(g, w, rtol=1e-10)
    (jit,) = scan_jits(f)
    assert jit.last is not None and not jit.dead, jit.why
    assert "for t in range(active)" in jit.last.source


def test_theano_leapfrog_row_compiles_its_scan(jit_now):
    """The benchmark's script (benchmarks/theano_rows.small_scan) through cgvm.theano."""
    import cgvm.theano as theano
    import cgvm.theano.tensor as T

    rng = np.random.default_rng(0)
    pos = theano.shared(rng.standard_normal((3, 5)), name="pos")
    step = theano.shared(np.float64(0.01), name="step")

    def energy(x):
        return 0.5 * (T.dot(x - MU, COV_INV) * (x - MU)).sum(axis=1)

    def leapfrog(p, v, eps):
        new_v = v - eps * T.grad(energy(p).sum(), p)
        return [p + eps * new_v, new_v]

    vel = T.matrix("v0", dtype="float64")
    (ps, _), _ = theano.scan(leapfrog, outputs_info=[pos, vel], non_sequences=[step], n_steps=20)
    f = theano.function([vel], ps[-1])
    v0 = rng.standard_normal((3, 5))
    got = f(v0)
    want = leapfrog_numpy(pos.get_value(), v0, COV_INV, 0.01, 20)[0]
    np.testing.assert_allclose(got, want, rtol=1e-10)
    jits = [k.jit for k in f._core.executable.kernels if getattr(k, "jit", None) is not None]
    assert jits and all(j.last is not None for j in jits), [j.why for j in jits]


# --------------------------------------------------------------------------- an RNN: sequences, stacks, BPTT

def rnn_body(n=4):
    xt, hp, w, u, b = tensor("xt", 2, n), tensor("hp", 2, n), tensor("w", n, n), tensor("u", n, n), tensor("b", n)
    ht = E.tanh(E.add(E.add(L.matmul(xt, w), L.matmul(hp, u)), b))
    return Graph([xt, hp, w, u, b], [ht, R.sum(E.mul(ht, ht), axis=(1,))], name="rnn")


def rnn_numpy(X, H0, W, U, B, backwards=False):
    h, hs, ys = H0, [], []
    for t in (range(len(X) - 1, -1, -1) if backwards else range(len(X))):
        h = np.tanh(X[t] @ W + h @ U + B)
        hs.append(h)
        ys.append((h * h).sum(axis=1))
    return h, np.stack(hs), np.stack(ys)


def rnn_args(steps=6, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((steps, 2, 4)), rng.standard_normal((2, 4)), 0.5 * rng.standard_normal((4, 4)),
            0.5 * rng.standard_normal((4, 4)), rng.standard_normal(4)]


def rnn_syms():
    return [tensor("X", None, 2, 4), tensor("H0", 2, 4), tensor("W", 4, 4), tensor("U", 4, 4), tensor("B", 4)]


@pytest.mark.parametrize("backwards", [False, True])
def test_rnn_forward_with_sequences_and_stacks(jit_now, monkeypatch, backwards):
    def build():
        syms = rnn_syms()
        return cgvm.compile(syms, list(C.scan(*syms, body=rnn_body(), n_seqs=1, n_carry=1, go_backwards=backwards)))

    f, python = compiled_both(monkeypatch, build)
    for steps in (6, 9):   # another length: the same compiled loop (the row shapes are its signature)
        args = rnn_args(steps)
        for g, r, w in zip(f(*args), python(*args), rnn_numpy(*args, backwards=backwards)):
            np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    (jit,) = scan_jits(f)
    assert len(jit.loops) == 1 and jit.last is not None, jit.why


@pytest.mark.parametrize("backwards", [False, True])
def test_rnn_gradient_runs_both_loops_compiled(jit_now, monkeypatch, backwards):
    """BPTT: the backward scan (seq_order, go_backwards, reset carries) is compiled as well."""
    def build():
        syms = rnn_syms()
        hT, Hs, Ys = C.scan(*syms, body=rnn_body(), n_seqs=1, n_carry=1, go_backwards=backwards)
        cost = E.add(R.sum(Ys), R.sum(E.mul(hT, hT)))
        return cgvm.compile(syms, [cost] + cgvm.grad(cost, syms))

    f, python = compiled_both(monkeypatch, build)
    args = rnn_args()
    got, ref = f(*args), python(*args)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-13)

    def cost(v):
        h, _, ys = rnn_numpy(*v, backwards=backwards)
        return float(ys.sum() + (h * h).sum())

    assert abs(float(got[0]) - cost(args)) < 1e-10
    for k in range(5):
        np.testing.assert_allclose(got[k + 1], numeric_grad(cost, args, k, 1e-6), rtol=1e-5, atol=1e-7)
    jits = scan_jits(f)
    assert len(jits) == 2 and all(j.last is not None for j in jits), [j.why for j in jits]


def test_truncated_loop_zeros_the_rows_it_did_not_run(jit_now, monkeypatch):
    def build():
        syms = rnn_syms()
        return cgvm.compile(syms, list(C.scan(*syms, body=rnn_body(), n_seqs=1, n_carry=1, truncate=3)))

    f, python = compiled_both(monkeypatch, build)
    args = rnn_args()
    got = f(*args)
    for g, r in zip(got, python(*args)):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-14)
    assert not got[1][3:].any() and got[1][2].any()
    assert scan_jits(f)[0].last is not None


def test_until_stops_after_the_step_whose_condition_holds(jit_now, monkeypatch):
    def build():
        xt, h = tensor("xt"), tensor("h")
        nh = E.add(h, xt)
        body = Graph([xt, h], [nh, E.gt(nh, 2.5)], name="until")
        X, H0 = tensor("X", None), tensor("H0")
        return cgvm.compile([X, H0], list(C.scan(X, H0, body=body, n_seqs=1, n_carry=1, has_until=True)))

    f, python = compiled_both(monkeypatch, build)
    x = np.array([1.0, 1.0, 1.0, 1.0, 1.0])
    got, ref = f(x, np.float64(0.0)), python(x, np.float64(0.0))
    assert float(got[0]) == 3.0 and list(got[1]) == [1.0, 2.0, 3.0]
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)
    assert scan_jits(f)[0].last is not None, scan_jits(f)[0].why


def test_swapped_and_unchanged_carries_read_the_old_values(jit_now, monkeypatch):
    """(a, b, c) -> (b, a + b, c): a carry that is another carry's old value, one that stays."""
    def build():
        a, b, c = tensor("a", 2), tensor("b", 2), tensor("c", 2)
        body = Graph([a, b, c], [b, E.add(a, b), c], name="fib")
        A, B, Cc = tensor("A", 2), tensor("B", 2), tensor("C", 2)
        return cgvm.compile([A, B, Cc], list(C.scan(A, B, Cc, body=body, n_carry=3, n_steps=7)))

    f, python = compiled_both(monkeypatch, build)
    args = [np.array([0.0, 1.0]), np.array([1.0, 1.0]), np.array([5.0, 6.0])]
    got, ref = f(*args), python(*args)
    a, b = args[0], args[1]
    for _ in range(7):
        a, b = b, a + b
    np.testing.assert_array_equal(got[0], a)
    np.testing.assert_array_equal(got[1], b)
    np.testing.assert_array_equal(got[2], args[2])
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)
    assert scan_jits(f)[0].last is not None


def test_float32_integer_and_boolean_values(jit_now, monkeypatch):
    """A float32 carry (float32 arithmetic throughout), an int64 counter and a comparison."""
    def build():
        x, n = tensor("x", 3, dtype="float32"), tensor("n", 1, dtype="int64")
        nx = E.mul(E.exp(E.neg(x)), np.float32(1.5))
        body = Graph([x, n], [nx, E.add(n, np.int64(1)), E.cast(E.gt(nx, np.float32(0.5)), dtype="float32")],
                     name="mixed")
        X, N = tensor("X", 3, dtype="float32"), tensor("N", 1, dtype="int64")
        return cgvm.compile([X, N], list(C.scan(X, N, body=body, n_carry=2, n_steps=5)))

    f, python = compiled_both(monkeypatch, build)
    x0 = np.array([0.1, 1.0, 3.0], np.float32)
    got, ref = f(x0, np.array([2])), python(x0, np.array([2]))
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype
        np.testing.assert_allclose(g, r, rtol=1e-6)
    x, want = x0, []
    for _ in range(5):
        x = (np.exp(-x) * np.float32(1.5)).astype(np.float32)
        want.append(x)
    np.testing.assert_allclose(got[0], x, rtol=1e-6)
    assert got[1].tolist() == [7]
    assert scan_jits(f)[0].last is not None, scan_jits(f)[0].why


def test_reductions_reshapes_and_broadcasts_in_a_body(jit_now, monkeypatch):
    """max/mean/sum over axes, keepdims, a transpose, expand_dims and broadcast_like, a fill."""
    def build():
        h, m = tensor("h", 3, 4), tensor("m", 4, 3)
        centred = E.sub(h, R.max(h, axis=(1,), keepdims=True))
        col = S.expand_dims(R.mean(centred, axis=(0,)), axis=(0,))
        nh = E.add(E.tanh(E.add(centred, S.broadcast_like(col, h))), S.transpose(m))
        body = Graph([h, m], [nh, E.add(R.sum(nh), R.sum(S.ones_like(nh)))], name="mix")
        H, M = tensor("H", 3, 4), tensor("M", 4, 3)
        return cgvm.compile([H, M], list(C.scan(H, M, body=body, n_carry=1, n_steps=4, stacked=())))

    f, python = compiled_both(monkeypatch, build)
    rng = np.random.default_rng(3)
    h0, m = rng.standard_normal((3, 4)), rng.standard_normal((4, 3))
    got, ref = f(h0, m), python(h0, m)
    h, ys = h0, []
    for _ in range(4):
        c = h - h.max(axis=1, keepdims=True)
        h = np.tanh(c + c.mean(axis=0)[None, :]) + m.T
        ys.append(h.sum() + h.size)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got[0], h, rtol=1e-12)
    np.testing.assert_allclose(got[1], ys, rtol=1e-12)
    assert scan_jits(f)[0].last is not None, scan_jits(f)[0].why


def test_slices_and_subtensor_updates_in_a_body(jit_now, monkeypatch):
    """A window of a carry (negative step), and a region of it set and incremented."""
    def build():
        h = tensor("h", 4, 6)
        window = I.slice(h, starts=(1, 5), stops=(3, 0), steps=(1, -2), axes=(0, 1))     # h[1:3, 5:0:-2]
        grown = I.inc_subtensor(h, E.tanh(window), starts=(2, 1), stops=(4, 7), steps=(1, 2), axes=(0, 1))
        nh = I.set_subtensor(grown, 0.5, starts=(0,), stops=(1,), axes=(0,))
        H = tensor("H", 4, 6)
        return cgvm.compile([H], list(C.scan(H, body=Graph([h], [nh], name="win"), n_carry=1, n_steps=3)))

    f, python = compiled_both(monkeypatch, build)
    h0 = np.random.default_rng(5).standard_normal((4, 6))
    got, ref = f(h0), python(h0)
    h, hs = h0, []
    for _ in range(3):
        h = h.copy()
        h[2:4, 1:7:2] += np.tanh(h[1:3, 5:0:-2])
        h[0:1] = 0.5
        hs.append(h)
    for g, r, w in zip(got, ref, (h, np.stack(hs))):
        np.testing.assert_allclose(g, r, rtol=1e-12)
        np.testing.assert_allclose(g, w, rtol=1e-12)
    assert scan_jits(f)[0].last is not None, scan_jits(f)[0].why


# --------------------------------------------------------------------------- fallbacks and switches

def cumsum_scan():
    xt, h = tensor("xt", 3), tensor("h", 3)
    body = Graph([xt, h], [E.add(h, R.cumsum(xt, axis=0))], name="cum")   # cumsum has no Numba lowering
    X, H0 = tensor("X", None, 3), tensor("H0", 3)
    return cgvm.compile([X, H0], list(C.scan(X, H0, body=body, n_seqs=1, n_carry=1)))


def test_a_body_with_an_op_without_lowering_keeps_the_python_loop(jit_now):
    f = cumsum_scan()
    x = np.arange(12.0).reshape(4, 3)
    for _ in range(3):
        got = f(x, np.zeros(3))
        np.testing.assert_allclose(got[0], np.cumsum(x, axis=1).sum(axis=0))
    (jit,) = scan_jits(f)
    assert jit.last is None and "cumsum" in jit.why
    assert list(jit.loops.values()) == [None]   # tried once, for its signature


def test_a_body_numba_fails_on_falls_back_for_good(jit_now, monkeypatch):
    """Source Numba cannot type (a name defined nowhere): no crash, the Python loop, no retry."""
    generate = scan_jit.generate
    attempts = []

    def broken(*a):
        attempts.append(1)
        lines, *rest = generate(*a)
        return [lines[0], "    undefined_name += 1"] + lines[1:], *rest

    monkeypatch.setattr(scan_jit, "generate", broken)
    syms = rnn_syms()
    f = cgvm.compile(syms, list(C.scan(*syms, body=rnn_body(), n_seqs=1, n_carry=1)))
    for steps in (6, 7, 6):
        args = rnn_args(steps)
        for g, w in zip(f(*args), rnn_numpy(*args)):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    (jit,) = scan_jits(f)
    assert jit.dead and jit.last is None and attempts == [1]


def test_cgvm_jit_0_turns_the_tier_off(monkeypatch):
    monkeypatch.setenv("CGVM_JIT", "0")
    monkeypatch.setenv("CGVM_JIT_HOT", "0")
    assert scan_jit.hot_threshold() is None
    f = cumsum_scan()
    assert scan_jits(f) == [None]


def test_without_numba_scans_run_as_before(monkeypatch):
    monkeypatch.delenv("CGVM_JIT", raising=False)
    monkeypatch.setattr(scan_jit, "_numba_installed", lambda: False)
    assert scan_jit.hot_threshold() is None
    syms = rnn_syms()
    f = cgvm.compile(syms, list(C.scan(*syms, body=rnn_body(), n_seqs=1, n_carry=1)))
    args = rnn_args()
    for g, w in zip(f(*args), rnn_numpy(*args)):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
    assert scan_jits(f) == [None]


def test_a_scan_compiles_only_once_hot(monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.delenv("CGVM_JIT", raising=False)
    monkeypatch.setenv("CGVM_JIT_HOT", "2")
    syms = rnn_syms()
    f = cgvm.compile(syms, list(C.scan(*syms, body=rnn_body(), n_seqs=1, n_carry=1)))
    (jit,) = scan_jits(f)
    args = rnn_args()
    want = rnn_numpy(*args)
    for call in range(4):
        got = f(*args)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
        assert (jit.last is not None) == (call >= 2)


def test_unset_default_and_bad_settings(monkeypatch):
    monkeypatch.delenv("CGVM_JIT_HOT", raising=False)
    monkeypatch.setattr(scan_jit, "_numba_installed", lambda: True)
    for on in ("", "1", "yes"):
        monkeypatch.setenv("CGVM_JIT", on)
        assert scan_jit.hot_threshold() == scan_jit.DEFAULT_HOT
    monkeypatch.setenv("CGVM_JIT", "maybe")
    with pytest.raises(ConfigError, match="CGVM_JIT"):
        scan_jit.hot_threshold()
    monkeypatch.setenv("CGVM_JIT", "1")
    monkeypatch.setenv("CGVM_JIT_HOT", "-3")
    with pytest.raises(ConfigError, match="CGVM_JIT_HOT"):
        scan_jit.hot_threshold()


def test_other_shapes_and_layouts_get_their_own_loop(jit_now):
    """A new row shape compiles another loop; a Fortran-ordered or read-only argument is refused by
    the compiled signature and gets one of its own; results stay right throughout."""
    xt, h = tensor("xt", None), tensor("h", None)
    body = Graph([xt, h], [E.add(E.mul(h, 0.5), xt)], name="ema")
    X, H0 = tensor("X", None, None), tensor("H0", None)
    f = cgvm.compile([X, H0], list(C.scan(X, H0, body=body, n_seqs=1, n_carry=1)))

    def want(x, h0):
        h, hs = h0, []
        for row in x:
            h = 0.5 * h + row
            hs.append(h)
        return h, np.stack(hs)

    rng = np.random.default_rng(4)
    x3, x5 = rng.standard_normal((4, 3)), rng.standard_normal((4, 5))
    fortran = np.asfortranarray(rng.standard_normal((6, 3)))
    readonly = rng.standard_normal(3)
    readonly.setflags(write=False)
    for x, h0 in ((x3, np.zeros(3)), (x5, np.ones(5)), (fortran, readonly), (x3, np.zeros(3))):
        for g, w in zip(f(x, h0), want(x, h0)):
            np.testing.assert_allclose(g, w, rtol=1e-12)
    (jit,) = scan_jits(f)
    assert not jit.dead and len([v for v in jit.loops.values() if v is not None]) == 3


def test_unsupported_is_what_lowerings_raise_for_other_types():
    em = lc.Emitter({})
    with pytest.raises(lc.Unsupported):
        em.cast(cgvm.ir.types.DType("int8"))
    big = lc.Buf("a", (200, 200), cgvm.ir.types.DType("float64"))
    with pytest.raises(lc.Unsupported, match="multiply-adds"):
        lc.product(em, big, big, lc.Buf("o", (200, 200), big.dtype))
