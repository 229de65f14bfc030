"""T.nnet.relu is Theano 1.0's ``0.5 * (x + abs(x))``: max(x, 0) to the bit, and Theano's gradient at 0."""
import numpy as np
import pytest

import cgvm.theano as theano
import cgvm.theano.tensor as T

X = np.array([[-2.0, -0.0, 0.0, 1.5], [3.0, -1e-30, 0.0, -4.0]])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_relu_values_are_max_to_the_bit(dtype):
    x = T.matrix("x", dtype=dtype)
    f = theano.function([x], T.nnet.relu(x))
    data = X.astype(dtype)
    got = f(data)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.maximum(data, 0))
    assert not np.signbit(got).any()          # -0.0 comes out +0.0, as x + |x| gives


@pytest.mark.parametrize("alpha", [0, 0.1])
def test_relu_gradient_is_theanos(alpha):
    x = T.matrix("x", dtype="float64")
    g = theano.function([x], theano.grad(T.nnet.relu(x, alpha).sum(), x))(X)
    # Theano: d/dx [0.5(1+a) x + 0.5(1-a) |x|] = 0.5(1+a) + 0.5(1-a) sgn(x), so 0.5(1+a) at 0
    expected = 0.5 * (1 + alpha) + 0.5 * (1 - alpha) * np.sign(X)
    np.testing.assert_array_equal(g, expected)
    assert g[0, 2] == 0.5 * (1 + alpha)


def test_relu_gradient_matches_pytensor_on_theanos_definition():
    pytensor = pytest.importorskip("pytensor")
    pt = pytest.importorskip("pytensor.tensor")
    xp = pt.matrix("x", dtype="float64")
    ref = pytensor.function([xp], pytensor.grad((0.5 * (xp + abs(xp))).sum(), xp))(X)
    x = T.matrix("x", dtype="float64")
    got = theano.function([x], theano.grad(T.nnet.relu(x).sum(), x))(X)
    np.testing.assert_array_equal(got, ref)
