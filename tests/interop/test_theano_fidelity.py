"""Theano idioms real programs rely on, checked on PyTensor and on cgvm.theano side by side.

Types and floatX, update type checks, error types, Theano's gradient conventions (ties, integer
casts, NaN-free switch), indexing with duplicates, scan taps, pickling of models and functions.
Skipped without PyTensor.
"""
import copy
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

pytensor = pytest.importorskip("pytensor")
import pytensor.tensor as pt  # noqa: E402

import cgvm.theano as ctheano  # noqa: E402
import cgvm.theano.tensor as cT  # noqa: E402
from pytensor.gradient import Lop as pLop, Rop as pRop  # noqa: E402

BOTH = [(pytensor, pt), (ctheano, cT)]
IDS = ["pytensor", "cgvm"]


def both(fn):
    """fn(theano, T) on PyTensor and on cgvm; the two results."""
    return [fn(th, T) for th, T in BOTH]


def assert_same(fn, **kw):
    ref, got = both(fn)
    ref, got = (ref if isinstance(ref, list) else [ref]), (got if isinstance(got, list) else [got])
    assert len(ref) == len(got)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), **kw)
        assert np.asarray(g).dtype == np.asarray(r).dtype


# ----------------------------------------------------------------------------- 1. numbers and types


def test_floatx_defaults_to_float64_and_switches():
    assert ctheano.config.floatX == pytensor.config.floatX == "float64"
    assert cT.matrix().dtype == "float64"
    x = cT.matrix("x")
    f = ctheano.function([x], (x * 2).sum())
    assert f(np.ones((2, 3))) == 12.0  # float64 data into T.matrix(), as a default-floatX script passes
    with ctheano.config.change_flags(floatX="float32"):
        assert cT.vector().dtype == "float32"
    ctheano.config.floatX = "float32"
    try:
        assert cT.matrix().dtype == "float32"
    finally:
        ctheano.config.floatX = "float64"
    env = dict(os.environ, THEANO_FLAGS="floatX=float32", PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", "import cgvm.theano.tensor as T; print(T.matrix().dtype)"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert out == "float32"


def test_python_constants_autocast_as_theano():
    got = both(lambda th, T: [(T.fvector() * 0.1).dtype, (T.fvector() * 0.5).dtype, T.constant(1.5).dtype,
                              T.constant(0.1).dtype])
    assert got[0] == got[1]


def test_static_shapes():
    for th, T in BOTH:
        t = T.TensorType("float64", shape=(None, 1))("t")
        assert t.broadcastable == (False, True) and t.type.shape == (None, 1)
        v = T.tensor("v", dtype="float32", shape=(2, None))
        assert v.dtype == "float32" and v.type.shape == (2, None)


def test_complex_is_a_clear_error():
    from cgvm.errors import DTypeError

    for ctor in (cT.cvector, cT.zvector, cT.zmatrix):
        with pytest.raises(DTypeError, match="complex"):
            ctor()
    with pytest.raises(DTypeError, match="complex"):
        cT.TensorType("complex64", shape=(None,))


def test_input_downcast_and_out_of_range_integers():
    for th, T in BOTH:
        s = T.fscalar()
        f = th.function([s], s + 1)
        assert float(f(1.5)) == 2.5
        with pytest.raises(TypeError):
            f(0.1)  # not exactly representable in float32
        b = T.bvector()
        g = th.function([b], b + 1)
        with pytest.raises((TypeError, OverflowError)):
            g([300])
        with pytest.raises(TypeError):
            g(np.array([300]))
        assert list(th.function([b], b, allow_input_downcast=True)(np.array([300]))) == [44]


@pytest.mark.parametrize("case", ["float32_into_float64", "float64_into_float32", "int_into_float", "broadcast"])
def test_update_must_keep_the_shared_type(case):
    for th, T in BOTH:
        s64, s32 = th.shared(np.zeros(3)), th.shared(np.zeros(3, "float32"))
        target, expr, ins = {
            "float32_into_float64": (s64, T.fvector(), True),
            "float64_into_float32": (s32, s32 * np.float64(0.1), False),
            "int_into_float": (s64, T.lvector(), True),
            "broadcast": (th.shared(np.zeros((1, 3))), T.row(), True),
        }[case]
        with pytest.raises(TypeError):
            th.function([expr] if ins else [], [], updates=[(target, expr)])


def test_error_types():
    x = cT.dvector()
    f = ctheano.function([x], x[5])
    with pytest.raises(IndexError):
        f(np.ones(3))
    with pytest.raises(IndexError):
        cT.constant(np.ones(3))[5]
    with pytest.raises(ValueError, match="non-broadcastable"):
        cT.matrix().dimshuffle(1)  # Theano raises when the graph is built (PyTensor only at run time)
    assert cT.row().dimshuffle(1).ndim == 1
    pf = pytensor.function([pt.dvector()], pt.dvector()[5] if False else None) if False else None  # noqa
    px = pt.dvector()
    with pytest.raises(IndexError):
        pytensor.function([px], px[5])(np.ones(3))


# ----------------------------------------------------------------------------- 2. gradients


@pytest.mark.parametrize("name", ["max", "max_axis", "maximum0", "minimum0", "maximum_self", "abs0",
                                  "switch_sqrt", "switch_log"])
def test_gradient_conventions(name):
    data = {"max_axis": np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 1.0]])}.get(name, np.array([-1.0, 0.0, 3.0, 3.0]))

    def run(th, T):
        x = T.dmatrix() if data.ndim == 2 else T.dvector()
        cost = {
            "max": lambda: T.max(x), "max_axis": lambda: T.max(x, axis=1).sum(),
            "maximum0": lambda: T.maximum(x, 0).sum(), "minimum0": lambda: T.minimum(x, 0).sum(),
            "maximum_self": lambda: T.maximum(x, x[::-1]).sum(), "abs0": lambda: abs(x).sum(),
            "switch_sqrt": lambda: T.switch(x > 0, T.sqrt(x), 0).sum(),
            "switch_log": lambda: T.switch(x > 0, T.log(x), 0).sum(),
        }[name]()
        return th.function([x], T.grad(cost, x))(data)

    ref, got = both(run)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref)


def test_grad_of_integers_and_casts():
    def run(th, T):
        s, i, iv, x = T.dscalar(), T.lscalar(), T.lvector(), T.dvector()
        return [th.function([s], T.grad(s, s))(2.0),
                th.function([i], T.grad(i, i))(3),
                th.function([iv], T.grad(T.cast(iv, "float64").sum(), iv))(np.array([1, 2])),
                th.function([iv], T.grad((iv * 2).sum(), iv))(np.array([1, 2])),
                th.function([x], T.grad(T.cast(T.cast(x, "int64"), "float64").sum() + x.sum(), x))(
                    np.array([1.5, 2.0]))]

    assert_same(run)


def test_disconnected_inputs():
    for th, T in BOTH:
        x, z = T.dvector(), T.dvector()
        with pytest.raises(Exception, match="(?i)disconnected|does not depend"):
            T.grad(x.sum(), z)
        f = th.function([x, z], T.grad(x.sum(), z, disconnected_inputs="ignore"), on_unused_input="ignore")
        np.testing.assert_array_equal(f(np.ones(2), np.ones(3)), np.zeros(3))
        with pytest.warns(UserWarning):
            T.grad(x.sum(), z, disconnected_inputs="warn")
        assert T.grad(x.sum(), [x, z], disconnected_inputs="ignore", return_disconnected="None")[1] is None
        g = T.grad(x.sum(), [x, z], disconnected_inputs="ignore", return_disconnected="Disconnected")[1]
        assert "Disconnected" in type(g.type).__name__


def test_rop_lop():
    W = np.arange(6.0).reshape(2, 3)
    V = np.ones((2, 3))
    xv, u = np.array([1.0, -2.0]), np.array([0.5, 1.0, -1.0])

    def run(th, T, Rop, Lop):
        w, vv, x, uu = T.dmatrix(), T.dmatrix(), T.dvector(), T.dvector()
        y = T.tanh(T.dot(x, w))
        return [th.function([w, vv, x], Rop(y, w, vv))(W, V, xv),
                th.function([w, x, uu], Lop(y, w, uu))(W, xv, u)]

    ref = run(pytensor, pt, pRop, pLop)
    got = run(ctheano, cT, ctheano.gradient.Rop, ctheano.gradient.Lop)
    for r, g in zip(ref, got):
        np.testing.assert_allclose(g, r, rtol=1e-9)


# ----------------------------------------------------------------------------- 4. idioms of programs


class _Model:
    def __init__(self, th, T):
        self.input = T.dmatrix("x")
        self.W = th.shared(np.arange(12.0).reshape(4, 3) / 10, name="W")
        self.b = th.shared(np.zeros(3), name="b")
        self.p_y = T.nnet.softmax(T.dot(self.input, self.W) + self.b)
        self.y_pred = T.argmax(self.p_y, axis=1)


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_models_and_functions_pickle(how):
    clone = (lambda o: pickle.loads(pickle.dumps(o))) if how == "pickle" else copy.deepcopy
    m = _Model(ctheano, cT)
    data = np.random.RandomState(0).randn(5, 4)
    before = ctheano.function([m.input], m.p_y)(data)
    m2 = clone(m)
    np.testing.assert_array_equal(ctheano.function([m2.input], m2.p_y)(data), before)
    m2.W.set_value(np.zeros((4, 3)))  # the copy has its own storage, as in Theano
    assert m.W.get_value()[1, 1] == 0.4
    train = ctheano.function([m.input], m.p_y.sum(), updates=[(m.W, m.W * 2)])
    train2 = clone(train)
    train2(data)
    assert m.W.get_value()[1, 1] == 0.4 and train2.get_shared()[0].get_value()[1, 1] == 0.8
    train(data)
    assert m.W.get_value()[1, 1] == 0.8


def test_truthiness_as_theano_1():
    W = cT.dmatrix()
    assert bool(W) and (not W) is False  # ``if not W:`` for an optional argument
    with pytest.raises(TypeError):
        bool(W < 0)  # a < b < c would silently be wrong


def test_softmax_of_a_vector_is_a_row():
    v = cT.dvector()
    s = cT.nnet.softmax(v)
    assert s.ndim == 2 and s.broadcastable == (True, False)
    ref = pytensor.function([pv := pt.dvector()], pt.special.softmax(pv.dimshuffle("x", 0), axis=-1))
    np.testing.assert_allclose(ctheano.function([v], s)(np.arange(3.0)), ref(np.arange(3.0)))


def test_xlogx_and_scalar_module():
    x, y = cT.dvector(), cT.dvector()
    f = ctheano.function([x, y], [cT.xlogx.xlogx(x), cT.xlogx.xlogy0(x, y), cT.grad(cT.xlogx.xlogy0(x, y).sum(), y)])
    a, b = np.array([0.0, 0.5, 2.0]), np.array([0.0, 0.25, 3.0])
    xx, xy, gy = f(a, b)
    np.testing.assert_allclose(xx, [0.0, 0.5 * np.log(0.5), 2 * np.log(2)])
    np.testing.assert_allclose(xy, [0.0, 0.5 * np.log(0.25), 2 * np.log(3)])
    np.testing.assert_allclose(gy, [0.0, 2.0, 2 / 3])
    import cgvm.theano.scalar as cs
    import pytensor.scalar as ps

    for dts in [("int32", "float32"), ("int8", "float32"), ("float32", "float64"), ("int64", "int32")]:
        assert cs.upcast(*dts) == ps.upcast(*dts)
    assert cs.float32().dtype == "float32" and cs.float32().ndim == 0


# ----------------------------------------------------------------------------- 3. indexing and scan

_XV = np.array([-1.0, 2.0, -3.0, 4.0])
_MV = np.arange(12.0).reshape(3, 4)
_TV = np.arange(24.0).reshape(2, 3, 4)


@pytest.mark.parametrize("name", ["mask", "mask_2d", "mask_rows", "set_mask", "inc_mask_2d", "grad_mask",
                                  "axis1", "axis2", "two_apart", "two_adjacent_mid", "int_and_array",
                                  "index_matrix", "inc_repeats", "set_repeats_last_wins", "inc_repeats_chained",
                                  "inc_two_arrays", "set_two_adjacent_mid", "grad_two_adjacent_mid"])
def test_indexing_as_pytensor(name):
    def run(th, T):
        x, m, t3, iv, v = T.dvector(), T.dmatrix(), T.tensor3(dtype="float64"), T.lvector(), T.dvector()
        i2, i3 = np.array([1, 0]), np.array([0, 0, 2])
        case = {
            "mask": ([x], x[x > 0], [_XV]), "mask_2d": ([m], m[m > 5], [_MV]),
            "mask_rows": ([m, x], m[x[:3] > 0], [_MV, _XV]),
            "set_mask": ([x], T.set_subtensor(x[x > 0], 0), [_XV]),
            "inc_mask_2d": ([m], T.inc_subtensor(m[m > 5], 100.0), [_MV]),
            "grad_mask": ([x], T.grad((x[x > 0] ** 2).sum(), x), [_XV]),
            "axis1": ([m, iv], m[:, iv], [_MV, np.array([3, 0, 0])]),
            "axis2": ([t3, iv], t3[:, :, iv], [_TV, np.array([1, 1])]),
            "two_apart": ([t3, iv], t3[iv, :, iv], [_TV, i2]),
            "two_adjacent_mid": ([t3, iv], t3[:, iv, iv], [_TV, i2]),
            "int_and_array": ([m, iv], m[1, iv], [_MV, np.array([3, 0])]),
            "index_matrix": ([x, T.lmatrix()], None, None),
            "inc_repeats": ([x, iv], T.inc_subtensor(x[iv], 1.0), [_XV, i3]),
            "set_repeats_last_wins": ([x, iv, v], T.set_subtensor(x[iv], v), [_XV, i3, np.array([10., 20., 30.])]),
            "inc_repeats_chained": ([m, iv], T.inc_subtensor(m[iv, 1:3], 1.0), [_MV, i3]),
            "inc_two_arrays": ([m, iv], T.inc_subtensor(m[iv, iv], 1.0), [_MV, i3]),
            "set_two_adjacent_mid": ([t3, iv], T.set_subtensor(t3[:, iv, iv], -1.0), [_TV, i2]),
            "grad_two_adjacent_mid": ([t3, iv], T.grad((t3[:, iv, iv] ** 2).sum(), t3), [_TV, i2]),
        }[name]
        ins, out, vals = case
        if name == "index_matrix":
            out, vals = ins[0][ins[1]], [_XV, np.array([[0, 1], [3, 3]])]
        return th.function(ins, out)(*vals)

    assert_same(run)


def test_scan_taps_as_pytensor():
    def run(th, T):
        seq, x0 = T.dvector(), T.dvector()

        def scan(*a, **k):
            res = th.scan(*a, **k) if th is ctheano else th.scan(*a, return_updates=True, **k)
            return res[0]
        several = scan(lambda a, b, c: a + 10 * b + 100 * c, sequences=dict(input=seq, taps=[-2, 0, 1]))
        positive = scan(lambda a, b: a * 2 + b, sequences=dict(input=seq, taps=[3, -1]))
        mitsot = scan(lambda s, a, b: a + b + s, sequences=seq, outputs_info=dict(initial=x0, taps=[-3, -1]))
        fib = scan(lambda a, b: a - b, outputs_info=dict(initial=x0[:2], taps=[-2, -1]), n_steps=4)
        f = th.function([seq, x0], [several, positive, mitsot, fib])
        return f(np.arange(7.0), np.array([1.0, 2.0, 5.0]))

    assert_same(run)


def test_scan_strict_raises_missing_input():
    from cgvm.errors import MissingInputError

    seq, w = cT.dvector(), cT.dscalar()
    sh = ctheano.shared(np.float64(2.0))
    with pytest.raises(MissingInputError):
        ctheano.scan(lambda s: s * w, sequences=seq, strict=True)
    with pytest.raises(MissingInputError):
        ctheano.scan(lambda s: s * sh, sequences=seq, strict=True)
    with pytest.raises(Exception, match="missing inputs"):  # PyTensor raises for the shared variable too
        pytensor.scan(lambda s: s * pytensor.shared(np.float64(2.0)), sequences=pt.dvector(), strict=True,
                      return_updates=False)
    out, _ = ctheano.scan(lambda s, ww: s * ww, sequences=seq, non_sequences=[w], strict=True)
    np.testing.assert_array_equal(ctheano.function([seq, w], out)(np.arange(3.0), 2.0), [0.0, 2.0, 4.0])


def test_ifelse_is_lazy_on_every_path():
    from cgvm.theano.ifelse import ifelse

    c, x, bad, seq = cT.lscalar(), cT.dvector(), cT.dvector(), cT.dvector()
    boom = bad[np.int64(10)]  # out of bounds: evaluating it raises
    with pytest.raises(IndexError):
        ctheano.function([x, bad], boom + x)(_XV, np.ones(2))
    np.testing.assert_array_equal(ctheano.function([c, x, bad], ifelse(c, x * 2, boom + x))(1, _XV, np.ones(2)), _XV * 2)
    np.testing.assert_array_equal(ctheano.function([c, x, bad], ifelse(c, boom + x, x * 2))(0, _XV, np.ones(2)), _XV * 2)
    nested = ifelse(c, ifelse(c - 1, boom + x, x * 3), x)
    np.testing.assert_array_equal(ctheano.function([c, x, bad], nested)(1, _XV, np.ones(2)), _XV * 3)
    out, _ = ctheano.scan(lambda s, b: ifelse(cT.gt(s, 0), s * 2, b[np.int64(10)]), sequences=seq, non_sequences=[bad])
    np.testing.assert_array_equal(ctheano.function([seq, bad], out)(np.array([1.0, 2.0]), np.ones(2)), [2.0, 4.0])
    g = cT.grad(ifelse(c, (x ** 2).sum(), boom * x.sum()), x)
    np.testing.assert_array_equal(ctheano.function([c, x, bad], g)(1, _XV, np.ones(2)), 2 * _XV)


# ----------------------------------------------------------------------------- 6. rewrites and introspection


@pytest.mark.parametrize("name", ["softplus", "softplus_swapped", "log1p_exp", "log_sigmoid", "log_1_minus_sigmoid",
                                  "log_softmax"])
def test_stable_rewrites_as_pytensor(name):
    data = np.array([[-800.0, 0.0, 800.0]])

    def run(th, T):
        m = T.dmatrix()
        sig = T.nnet.sigmoid if th is ctheano else T.sigmoid
        sm = T.nnet.softmax if th is ctheano else (lambda z: T.special.softmax(z, axis=-1))
        e = {"softplus": lambda: T.log(1 + T.exp(m)), "softplus_swapped": lambda: T.log(T.exp(m) + 1),
             "log1p_exp": lambda: T.log1p(T.exp(m)), "log_sigmoid": lambda: T.log(sig(m)),
             "log_1_minus_sigmoid": lambda: T.log(1 - sig(m)), "log_softmax": lambda: T.log(sm(m))}[name]()
        return th.function([m], [e, T.grad(e[0, 0] + e.sum(), m)])(data)

    ref, got = both(run)
    for r, g in zip(ref, got):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, r)


def test_cse_and_fgraph_introspection():
    x, W = cT.dmatrix("x"), ctheano.shared(np.ones((3, 2)), name="W")
    y = cT.tanh(cT.dot(x, W)) + cT.tanh(cT.dot(x, W))
    f = ctheano.function([x], y)
    fg = f.maker.fgraph
    ops = [n.op.name for n in fg.toposort()]
    assert ops.count("matmul") + ops.count("gemm") + ops.count("gemm_bias_act") == 1  # merged, not twice
    assert set(fg.toposort()) == fg.apply_nodes
    assert fg.inputs == [x] and len(fg.outputs) == 1
    for node in fg.toposort():
        assert all(hasattr(v, "type") for v in list(node.inputs) + list(node.outputs))
