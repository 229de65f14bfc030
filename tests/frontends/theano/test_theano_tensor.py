"""T namespace: constructors, types, operators, math, reductions, shapes, indexing — values against NumPy."""
import math

import numpy as np
import pytest

import cgvm.theano as theano
import cgvm.theano.tensor as T

rng = np.random.RandomState(0)
A = rng.randn(3, 4)
B = rng.randn(3, 4)
P = rng.rand(3, 4) + 0.5


def run(inputs, out, *vals):
    return theano.function(inputs, out, on_unused_input="ignore")(*vals)


def test_constructors_and_types():
    assert T.matrix().dtype == theano.config.floatX == "float64"  # Theano's default
    assert T.dvector("v").dtype == "float64" and T.dvector("v").name == "v"
    assert T.imatrix().dtype == "int32" and T.lscalar().dtype == "int64" and T.bvector().dtype == "int8"
    assert T.row().broadcastable == (True, False) and T.col().broadcastable == (False, True)
    assert T.tensor4().ndim == 4 and T.tensor3(dtype="float64").dtype == "float64"
    a, b = T.dmatrices("a", "b")
    assert (a.name, b.name) == ("a", "b")
    assert [v.name for v in T.scalars("xyz")] == ["x", "y", "z"]
    assert len(T.fvectors(3)) == 3
    t = T.TensorType("float64", (False, True))("t")
    assert t.type.shape == (None, 1) and t.type == T.TensorType("float64", shape=(None, 1))
    assert T.tensor(dtype="int32", broadcastable=(False,)).dtype == "int32"
    with theano.config.change_flags(floatX="float32"):
        assert T.vector().dtype == "float32"
    assert T.vector().dtype == "float64"


def test_upcasting():
    f, d, i, b8 = T.fvector(), T.dvector(), T.ivector(), T.bvector()
    assert (f * 0.5).dtype == "float32" and (f + 2).dtype == "float32"
    assert (i + f).dtype == "float64" and (b8 + f).dtype == "float32"
    assert (i / i).dtype == "float64" and (i // i).dtype == "int32"
    assert T.mean(i).dtype == "float64" and (f + d).dtype == "float64"
    assert T.lt(f, 1).dtype == "bool"


@pytest.mark.parametrize("name, fn, ref", [
    ("add", lambda x, y: x + y, np.add), ("sub", lambda x, y: x - y, np.subtract),
    ("mul", lambda x, y: x * y, np.multiply), ("div", lambda x, y: x / y, np.divide),
    ("pow", lambda x, y: abs(x) ** y, lambda x, y: np.abs(x) ** y),
    ("max", T.maximum, np.maximum), ("min", T.minimum, np.minimum),
    ("lt", lambda x, y: x < y, np.less), ("ge", lambda x, y: x >= y, np.greater_equal),
    ("eq", T.eq, np.equal), ("neq", T.neq, np.not_equal),
    ("switch", lambda x, y: T.switch(x > 0, x, y), lambda x, y: np.where(x > 0, x, y)),
    ("and", lambda x, y: T.and_(x > 0, y > 0), lambda x, y: (x > 0) & (y > 0)),
    ("mod", lambda x, y: x % y, np.mod),
])
def test_binary(name, fn, ref):
    x, y = T.dmatrices("x", "y")
    np.testing.assert_allclose(run([x, y], fn(x, y), A, B), ref(A, B), rtol=1e-12)


@pytest.mark.parametrize("fn, ref", [
    (T.exp, np.exp), (T.log, np.log), (T.sqrt, np.sqrt), (T.tanh, np.tanh), (T.sin, np.sin), (T.cos, np.cos),
    (T.tan, np.tan), (T.sinh, np.sinh), (T.cosh, np.cosh), (T.log2, np.log2), (T.log10, np.log10),
    (T.log1p, np.log1p), (T.expm1, np.expm1), (T.sqr, np.square), (T.abs_, np.abs), (T.sgn, np.sign),
    (T.floor, np.floor), (T.ceil, np.ceil), (T.inv, np.reciprocal), (T.neg, np.negative),
    (T.nnet.sigmoid, lambda a: 1 / (1 + np.exp(-a))), (T.nnet.softplus, lambda a: np.log1p(np.exp(a))),
    (T.arcsinh, np.arcsinh), (T.arctanh, lambda a: np.arctanh(a / 2)),
    (T.arcsin, np.arcsin), (T.arccos, np.arccos), (T.arctan, np.arctan),
    (lambda a: T.arccosh(a + 1), lambda a: np.arccosh(a + 1)),
    (lambda a: T.arctan2(a, 0.5 - a), lambda a: np.arctan2(a, 0.5 - a)),
    (T.gamma, np.vectorize(math.gamma)), (T.gammaln, np.vectorize(math.lgamma)),
    (lambda a: T.psi(a + 1) - T.psi(a), lambda a: 1 / a),                    # psi(x + 1) = psi(x) + 1/x
    (lambda a: T.tri_gamma(a) - T.polygamma(1, a + 1), lambda a: 1 / a ** 2),
    (lambda a: T.erf(T.erfinv(a)), lambda a: a),
    (lambda a: T.clip(a, 0.6, 1.2), lambda a: np.clip(a, 0.6, 1.2)),
    (lambda a: T.round(a * 2), lambda a: np.round(a * 2)),
    (lambda a: T.round(a * 2, "half_away_from_zero"), lambda a: np.sign(a * 2) * np.floor(np.abs(a * 2) + .5)),
])
def test_unary(fn, ref):
    x = T.dmatrix()
    arg = P / 2 if ref is not np.arctanh else P
    got = run([x], fn(x) if fn is not T.arctanh else fn(x / 2), arg)
    np.testing.assert_allclose(got, ref(arg), rtol=1e-10)


def test_bitwise_operators_on_integers_and_logical_on_bools():
    i, j = T.ivectors("i", "j")
    a, b = np.array([-3, 0, 5, 12, 7], np.int32), np.array([6, -1, 3, 10, 7], np.int32)
    outs = run([i, j], [i & j, i | j, i ^ j, ~i, T.and_(i, 12), 5 | i, T.invert(j)], a, b)
    want = [a & b, a | b, a ^ b, ~a, a & 12, 5 | a, ~b]
    for got, ref in zip(outs, want):
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, ref)
    x = T.dvector("x")
    v = np.array([-2.0, -0.5, 0.5, 1.5, 3.0])
    outs = run([x], [(x > 0) & ~(x > 1), (x < -1) | (x > 2), (x > 0) ^ (x > 1), ~(x > 0)], v)
    want = [(v > 0) & ~(v > 1), (v < -1) | (v > 2), (v > 0) ^ (v > 1), ~(v > 0)]
    for got, ref in zip(outs, want):
        assert got.dtype == np.bool_
        np.testing.assert_array_equal(got, ref)
    with pytest.raises(Exception, match="bitwise_and"):
        T.dvector() & T.dvector()


def test_isnan_isinf_isclose():
    x = T.dvector()
    v = np.array([1.0, np.nan, np.inf, -np.inf])
    np.testing.assert_array_equal(run([x], T.isnan(x), v), np.isnan(v))
    np.testing.assert_array_equal(run([x], T.isinf(x), v), np.isinf(v))
    assert run([x], T.allclose(x, x + 1e-12), np.array([1.0, 2.0]))


@pytest.mark.parametrize("fn, ref", [
    (lambda x: x.sum(), lambda a: a.sum()), (lambda x: x.sum(axis=1), lambda a: a.sum(1)),
    (lambda x: x.sum(axis=0, keepdims=True), lambda a: a.sum(0, keepdims=True)),
    (lambda x: x.mean(axis=-1), lambda a: a.mean(-1)), (lambda x: x.prod(axis=0), lambda a: a.prod(0)),
    (lambda x: x.max(axis=1), lambda a: a.max(1)), (lambda x: x.min(), lambda a: a.min()),
    (lambda x: x.argmax(axis=1), lambda a: a.argmax(1)), (lambda x: T.argmin(x), lambda a: a.argmin()),
    (lambda x: x.var(axis=0), lambda a: a.var(0)), (lambda x: x.std(), lambda a: a.std()),
    (lambda x: T.all(x > -5), lambda a: np.all(a > -5)), (lambda x: T.any(x > 1, axis=0), lambda a: np.any(a > 1, 0)),
    (lambda x: T.cumsum(x, axis=1), lambda a: np.cumsum(a, 1)), (lambda x: T.cumsum(x), np.cumsum),
    (lambda x: T.cumprod(x, axis=1), lambda a: np.cumprod(a, 1)),
    (lambda x: T.sort(x), np.sort), (lambda x: T.argsort(x, axis=0), lambda a: np.argsort(a, 0)),
    (lambda x: T.sort(x, axis=None), lambda a: np.sort(a, None)),
    (lambda x: T.norm(x, 2, axis=1), lambda a: np.linalg.norm(a, axis=1)),
    (lambda x: T.max_and_argmax(x, axis=0)[1], lambda a: a.argmax(0)),
])
def test_reductions(fn, ref):
    x = T.dmatrix()
    np.testing.assert_allclose(run([x], fn(x), A), ref(A), rtol=1e-10)


@pytest.mark.parametrize("fn, ref", [
    (lambda x: x.reshape((4, 3)), lambda a: a.reshape(4, 3)),
    (lambda x: x.reshape((x.shape[0], -1, 2)), lambda a: a.reshape(3, -1, 2)),
    (lambda x: x.dimshuffle(1, 0), lambda a: a.T), (lambda x: x.dimshuffle(0, "x", 1), lambda a: a[:, None]),
    (lambda x: x.dimshuffle("x", 1, 0), lambda a: a.T[None]), (lambda x: x.T, lambda a: a.T),
    (lambda x: x.flatten(), lambda a: a.ravel()), (lambda x: T.flatten(x.dimshuffle(0, 1, "x"), 2), lambda a: a),
    (lambda x: T.concatenate([x, x * 2], axis=1), lambda a: np.concatenate([a, a * 2], 1)),
    (lambda x: T.stack([x, x]), lambda a: np.stack([a, a])), (lambda x: T.stack(x, x), lambda a: np.stack([a, a])),
    (lambda x: T.join(0, x, x), lambda a: np.concatenate([a, a])),
    (lambda x: T.shape_padleft(x), lambda a: a[None]), (lambda x: T.shape_padright(x, 2), lambda a: a[..., None, None]),
    (lambda x: T.tile(x, (2, 1)), lambda a: np.tile(a, (2, 1))), (lambda x: T.repeat(x, 2, axis=1), lambda a: np.repeat(a, 2, 1)),
    (lambda x: x.shape, lambda a: np.array(a.shape)), (lambda x: x.size, lambda a: np.array(a.size)),
    (lambda x: T.zeros_like(x) + T.ones_like(x), np.ones_like),
    (lambda x: T.alloc(1.5, x.shape[0], 2), lambda a: np.full((3, 2), 1.5)),
    (lambda x: T.zeros((2, x.shape[1])), lambda a: np.zeros((2, 4))),
    (lambda x: T.arange(x.shape[0]), lambda a: np.arange(3)),
    (lambda x: T.arange(1, 10, 3), lambda a: np.arange(1, 10, 3)),
    (lambda x: T.eye(3), lambda a: np.eye(3)), (lambda x: T.identity_like(x), lambda a: np.eye(3, 4)),
    (lambda x: T.dot(x, x.T), lambda a: a @ a.T), (lambda x: T.dot(x[0], x[1]), lambda a: a[0] @ a[1]),
    (lambda x: T.tensordot(x, x, [[1], [1]]), lambda a: np.tensordot(a, a, [[1], [1]])),
    (lambda x: T.batched_dot(x, x), lambda a: (a * a).sum(1)), (lambda x: T.outer(x[0], x[1]), lambda a: np.outer(a[0], a[1])),
    (lambda x: x @ x.T, lambda a: a @ a.T), (lambda x: T.cast(x * 3, "int32"), lambda a: (a * 3).astype("int32")),
    (lambda x: T.diagonal(x), np.diagonal), (lambda x: T.extra_ops.diff(x), np.diff),
    (lambda x: T.swapaxes(x, 0, 1), lambda a: a.T), (lambda x: T.fill(x, 2.0), lambda a: np.full_like(a, 2.0)),
])
def test_shapes_and_creation(fn, ref):
    x = T.dmatrix()
    np.testing.assert_allclose(run([x], fn(x), A), ref(A), rtol=1e-10)


def test_dimshuffle_cannot_drop_known_axis():
    with pytest.raises(ValueError, match="cannot drop"):
        T.dmatrix().reshape((3, 4)).dimshuffle(0)


@pytest.mark.parametrize("fn, ref", [
    (lambda x: x[1], lambda a: a[1]), (lambda x: x[-1, 2], lambda a: a[-1, 2]),
    (lambda x: x[1:3], lambda a: a[1:3]), (lambda x: x[:, ::-2], lambda a: a[:, ::-2]),
    (lambda x: x[None, 1], lambda a: a[None, 1]), (lambda x: x[..., 1], lambda a: a[..., 1]),
    (lambda x: x[[0, 2, 2]], lambda a: a[[0, 2, 2]]), (lambda x: x[:, [3, 0]], lambda a: a[:, [3, 0]]),
    (lambda x: x[[0, 1], [3, 2]], lambda a: a[[0, 1], [3, 2]]),
    (lambda x: T.set_subtensor(x[1:, 2], 7.0), lambda a: _set(a, (slice(1, None), 2), 7.0)),
    (lambda x: T.inc_subtensor(x[0], x[1]), lambda a: _set(a, 0, a[0] + a[1])),
    (lambda x: T.inc_subtensor(x[[0, 0, 2]], 1.0), lambda a: _addat(a, [0, 0, 2], 1.0)),
    (lambda x: T.set_subtensor(x[[0, 1], [1, 2]], 5.0), lambda a: _set(a, ([0, 1], [1, 2]), 5.0)),
])
def test_indexing(fn, ref):
    x = T.dmatrix()
    np.testing.assert_allclose(run([x], fn(x), A), ref(A), rtol=1e-12)


def _set(a, idx, v):
    a = a.copy()
    a[idx] = v
    return a


def _addat(a, idx, v):
    a = a.copy()
    np.add.at(a, idx, v)
    return a


def test_symbolic_indices_and_minibatch_slice():
    x = T.dmatrix()
    i, n = T.lscalars("i", "n")
    f = theano.function([x, i, n], [x[i], x[i * n:(i + 1) * n], x[-n:], T.set_subtensor(x[i], 0.0)])
    row, batch, tail, zeroed = f(A, 1, 1)
    np.testing.assert_allclose(row, A[1])
    np.testing.assert_allclose(batch, A[1:2])
    np.testing.assert_allclose(tail, A[-1:])
    np.testing.assert_allclose(zeroed, _set(A, 1, 0.0))


def test_constants_and_eval():
    c = T.constant(3)
    assert c.dtype == "int8" and T.constant(1.5).dtype == "float32"
    assert T.constant([1.0, 2.0], dtype="float64").dtype == "float64"
    x = T.dvector("x")
    np.testing.assert_allclose((x * 2).eval({x: np.arange(3.0)}), [0, 2, 4])
    assert float((T.constant(2.0) + 1).eval()) == 3.0
    assert T.as_tensor_variable([1.0, 2.0]).ndim == 1


def test_variable_identity_and_errors():
    x = T.dvector()
    assert x == x and hash(x) == hash(x) and x != T.dvector()
    with pytest.raises(TypeError):
        bool(x > 0)
    with pytest.raises(TypeError):
        len(x)


def test_shape_error_names_user_line():
    from cgvm.errors import ShapeError

    x = T.dmatrix().reshape((3, 4))
    with pytest.raises(ShapeError, match="test_theano_tensor.py"):
        T.dot(x, x)
