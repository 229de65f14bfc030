"""The same Theano scripts under PyTensor and under cgvm give the same numbers (skipped without pytensor)."""
import numpy as np
import pytest

pytensor = pytest.importorskip("pytensor")
import pytensor.tensor as pt  # noqa: E402

import cgvm.theano as ctheano  # noqa: E402
import cgvm.theano.tensor as cT  # noqa: E402

pytensor.config.floatX = "float64"  # compare in float64 on both sides
PEERS = {
    "pytensor": dict(theano=pytensor, T=pt, softmax=lambda x: pt.special.softmax(x, axis=-1),
                     ifelse=lambda: __import__("pytensor.ifelse", fromlist=["ifelse"]).ifelse,
                     until=lambda: __import__("pytensor.scan.utils", fromlist=["until"]).until, jacobian=lambda: pytensor.gradient.jacobian,
                     hessian=lambda: pytensor.gradient.hessian),
    "cgvm": dict(theano=ctheano, T=cT, softmax=cT.nnet.softmax, ifelse=lambda: ctheano.ifelse.ifelse,
                 until=lambda: ctheano.scan_module.until, jacobian=lambda: ctheano.gradient.jacobian,
                 hessian=lambda: ctheano.gradient.hessian),
}


def _scan(th, *args, **kwargs):
    res = th.scan(*args, **kwargs)
    return res if isinstance(res, tuple) else (res, {})


def digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype("float64"), d.target.astype("int64")


def logistic_regression(p, X, Y, steps=8, batch=100):
    theano, T = p["theano"], p["T"]
    rng = np.random.RandomState(0)
    data_x, data_y = theano.shared(X), theano.shared(Y)
    W = theano.shared(rng.randn(64, 10) * 0.01, name="W")
    b = theano.shared(np.zeros(10), name="b")
    x, y, i = T.dmatrix("x"), T.lvector("y"), T.lscalar("i")
    prob = p["softmax"](T.dot(x, W) + b)
    cost = -T.mean(T.log(prob)[T.arange(y.shape[0]), y])
    gW, gb = T.grad(cost, [W, b])
    train = theano.function([i], cost, updates=[(W, W - 0.5 * gW), (b, b - 0.5 * gb)],
                            givens={x: data_x[i * batch:(i + 1) * batch], y: data_y[i * batch:(i + 1) * batch]})
    return [float(train(k % 10)) for k in range(steps)] + [W.get_value()]


def mlp(p, X, Y, steps=6, batch=64):
    theano, T = p["theano"], p["T"]
    rng = np.random.RandomState(1)
    W1 = theano.shared(rng.randn(64, 32) * 0.1)
    b1 = theano.shared(np.zeros(32))
    W2 = theano.shared(rng.randn(32, 10) * 0.1)
    b2 = theano.shared(np.zeros(10))
    x, y = T.dmatrix("x"), T.lvector("y")
    h = T.tanh(T.dot(x, W1) + b1)
    prob = p["softmax"](T.dot(h, W2) + b2)
    cost = -T.mean(T.log(prob)[T.arange(y.shape[0]), y]) + 1e-4 * (W1 ** 2).sum()
    params = [W1, b1, W2, b2]
    grads = T.grad(cost, params)
    train = theano.function([x, y], cost, updates=[(q, q - 0.3 * g) for q, g in zip(params, grads)])
    return [float(train(X[k * batch:(k + 1) * batch], Y[k * batch:(k + 1) * batch])) for k in range(steps)]


def rnn(p):
    theano, T = p["theano"], p["T"]
    rng = np.random.RandomState(2)
    Wx = theano.shared(rng.randn(4, 5) * 0.3)
    Wh = theano.shared(rng.randn(5, 5) * 0.3)
    xs, h0 = T.dmatrix("xs"), T.dvector("h0")
    hs, _ = _scan(theano, lambda x_t, h: T.tanh(T.dot(x_t, Wx) + T.dot(h, Wh)), sequences=xs, outputs_info=h0)
    cost = (hs[-1] ** 2).sum() + hs.mean()
    f = theano.function([xs, h0], [hs, cost] + T.grad(cost, [Wx, Wh, h0, xs]))
    return f(rng.randn(7, 4), rng.randn(5))


def scan_taps_until(p):
    theano, T = p["theano"], p["T"]
    x, f0 = T.dvector("x"), T.dvector("f0")
    taps, _ = _scan(theano, lambda a, b, c: a * b + c, sequences=dict(input=x, taps=[-1, 0, 2]))
    fib, _ = _scan(theano, lambda a, b: a + b, outputs_info=dict(initial=f0, taps=[-2, -1]), n_steps=8)
    until = p["until"]()
    grow, _ = _scan(theano, lambda v: (v * 1.5, until(v * 1.5 > 10)), outputs_info=x[0], n_steps=50)
    g = T.grad(taps.sum() + (fib ** 2).sum() * 1e-3, [x, f0])
    return theano.function([x, f0], [taps, fib, grow] + g)(np.linspace(1, 2, 6), np.array([1.0, 1.0]))


def ifelse_case(p):
    theano, T = p["theano"], p["T"]
    a, b = T.dscalars("a", "b")
    w = T.dvector("w")
    z = p["ifelse"]()(T.lt(a, b), (w * a).sum(), (w ** 2).sum() * b)
    f = theano.function([a, b, w], [z, T.grad(z, w)])
    return f(1.0, 2.0, np.array([1.0, 3.0])) + f(5.0, 2.0, np.array([1.0, 3.0]))


def jac_hess(p):
    theano, T = p["theano"], p["T"]
    x = T.dvector("x")
    y = T.tanh(x) * x.sum()
    return theano.function([x], [p["jacobian"]()(y, x), p["hessian"]()((x ** 3).sum() * x[0], x)])(
        np.array([0.3, -0.7, 1.1]))


def special_and_logic(p):
    theano, T = p["theano"], p["T"]
    x, i = T.dvector("x"), T.lvector("i")
    y = (T.arcsin(x * 0.5) + T.arccos(x * 0.3) * T.arctan(x) + T.arctan2(x, 1.5) + T.tan(x * 0.4)
         + T.sinh(x) * T.cosh(x * 0.2) + T.arcsinh(x) + T.arccosh(abs(x) + 1.5) + T.arctanh(x * 0.3)
         + T.log2(x + 3.0) * T.log10(x + 4.0) + T.gamma(x + 2.5) + T.gammaln(abs(x) + 0.3) + T.psi(x + 3.0)
         + T.tri_gamma(x + 2.0) + T.polygamma(2, x + 3.0) + T.erfinv(x * 0.4))
    ints = ((i & 6) | ~i) ^ 3
    mask = ((x > 0) & ~(x > 1)) | ((x < -1) ^ (x > 0.5))
    f = theano.function([x, i], [y, T.grad(y.sum(), x), ints, T.switch(mask, x, -x),
                                 T.and_(i, 12), T.or_(i, 1), T.xor(i, i + 1), T.invert(i)])
    out = f(np.array([-1.4, -0.6, 0.0, 0.3, 0.8, 1.2]), np.arange(-4, 8, dtype="int64"))
    assert out[2].dtype == np.int64 and out[4].dtype == np.int64
    return out


def _compare(fn, *args, rtol=1e-9, atol=1e-11):
    ref = fn(PEERS["pytensor"], *args)
    got = fn(PEERS["cgvm"], *args)
    assert len(ref) == len(got)
    for k, (r, g) in enumerate(zip(ref, got)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=rtol, atol=atol, err_msg=f"result {k}")


def test_logistic_regression_digits_same_losses():
    pytest.importorskip("sklearn")
    X, Y = digits()
    _compare(logistic_regression, X, Y)


def test_mlp_digits_same_losses():
    pytest.importorskip("sklearn")
    X, Y = digits()
    _compare(mlp, X, Y)


def test_rnn_scan_and_bptt():
    _compare(rnn)


def test_scan_taps_and_until():
    _compare(scan_taps_until)


def test_ifelse():
    _compare(ifelse_case)


def test_jacobian_hessian():
    _compare(jac_hess)


def test_special_functions_and_bitwise_logic():
    _compare(special_and_logic, rtol=1e-12, atol=1e-13)
