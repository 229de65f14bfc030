"""theano.function, shared variables, updates, givens, In/Out, errors, aliasing, call overhead."""

import numpy as np
import pytest

import cgvm.theano as theano
import cgvm.theano.tensor as T
from cgvm.errors import MissingInputError, UnusedInputError


def test_single_and_list_outputs_and_kwargs():
    x, y = T.dvectors("x", "y")
    f = theano.function([x, y], x + y)
    assert isinstance(f(np.ones(2), np.ones(2)), np.ndarray)
    g = theano.function([x, y], [x * y])
    assert isinstance(g([1.0], [2.0]), list)
    np.testing.assert_allclose(f(y=[1.0, 2.0], x=[3.0, 4.0]), [4, 6])
    assert theano.function([x], [], on_unused_input="ignore")([1.0]) == []
    with pytest.raises(TypeError):
        f([1.0])
    with pytest.raises(TypeError):
        f([1.0], [1.0], [1.0])
    with pytest.raises(TypeError):
        f([1.0], x=[1.0])
    with pytest.raises(TypeError):
        f(np.ones((2, 2)), np.ones(2))  # wrong rank, before any kernel runs


def test_input_downcast_rules():
    x = T.fvector()
    f = theano.function([x], x * 2)
    with pytest.raises(TypeError):
        f(np.ones(2))  # float64 array into fvector
    np.testing.assert_allclose(f(np.ones(2, "float32")), [2, 2])
    np.testing.assert_allclose(theano.function([x], x * 2, allow_input_downcast=True)(np.ones(2)), [2, 2])
    s = T.fscalar()
    assert float(theano.function([s], s + 1)(1.5)) == 2.5  # python float into a floatX scalar
    i = T.ivector()
    np.testing.assert_array_equal(theano.function([i], i + 1)([1, 2]), [2, 3])


def test_shared_get_set_and_sharing():
    w = theano.shared(np.arange(3.0), name="w")
    assert w.dtype == "float64" and w.name == "w"
    assert theano.shared(0).dtype == "int64" and theano.shared(1.0).dtype == "float64"
    v = w.get_value()
    v[0] = 100
    assert w.get_value()[0] == 0
    arr = np.zeros(3)
    w2 = theano.shared(arr, borrow=True)
    arr[0] = 5
    assert w2.get_value(borrow=True)[0] == 5
    w.set_value(np.ones(4))
    np.testing.assert_allclose(w.get_value(), np.ones(4))
    with pytest.raises(TypeError):
        w.set_value(np.ones((2, 2)))
    inc = theano.function([], [], updates=[(w, w + 1)])
    read = theano.function([], w * 1)
    inc()
    np.testing.assert_allclose(read(), 2 * np.ones(4))


def test_updates_use_old_values_and_run_after_outputs():
    a = theano.shared(1.0)
    b = theano.shared(2.0)
    f = theano.function([], [a, b], updates={a: b, b: a})
    out = f()
    assert [float(o) for o in out] == [1.0, 2.0]
    assert (a.get_value(), b.get_value()) == (2.0, 1.0)
    with pytest.raises(ValueError):
        theano.function([], [], updates=[(a, a + 1), (a, a + 2)])
    with pytest.raises(TypeError):
        theano.function([], [], updates=[(theano.shared(np.int64(1)), a * 1.5)])


def test_outputs_never_alias():
    w = theano.shared(np.zeros(3))
    x = T.dvector()
    f = theano.function([x], [x, w, x.T, w])
    arr = np.ones(3)
    r = f(arr)
    assert not np.shares_memory(r[0], arr) and not np.shares_memory(r[1], w.get_value(borrow=True))
    assert not np.shares_memory(r[1], r[3])
    r[1][0] = 9
    assert w.get_value()[0] == 0


def test_missing_unused_and_bad_inputs():
    x, y = T.dvectors("x", "y")
    with pytest.raises(MissingInputError, match="y"):
        theano.function([x], x + y)
    with pytest.raises(UnusedInputError):
        theano.function([x, y], x * 2)
    theano.function([x, y], x * 2, on_unused_input="ignore")
    with pytest.raises(UnusedInputError):
        theano.function([x, x], x * 2)
    with pytest.raises(TypeError):
        theano.function([theano.shared(1.0)], x)


def test_givens_minibatch_idiom():
    data = theano.shared(np.arange(20.0).reshape(10, 2))
    i = T.lscalar("i")
    x = T.dmatrix("x")
    f = theano.function([i], x.sum(), givens={x: data[i * 2:(i + 1) * 2]})
    assert float(f(1)) == np.arange(20.0).reshape(10, 2)[2:4].sum()
    with pytest.raises(RuntimeError):
        theano.function([x], x * 2, givens={x: data})


def test_in_out_and_default_updates():
    x = T.dvector("x")
    y = T.dscalar("y")
    f = theano.function([x, theano.In(y, value=2.0)], x * y)
    np.testing.assert_allclose(f([1.0]), [2.0])
    np.testing.assert_allclose(f([1.0], 3.0), [3.0])
    c = theano.shared(0)
    c.default_update = c + 1
    g = theano.function([], c * 1)
    g()
    g()
    assert c.get_value() == 2
    theano.function([], c * 1, no_default_updates=True)()
    assert c.get_value() == 2
    assert theano.function([x], theano.Out(x * 2, borrow=True))([1.0])[0] == 2.0


def test_trust_input_and_copy():
    x = T.dvector()
    w = theano.shared(1.0)
    f = theano.function([x], x * w, updates=[(w, w + 1)])
    f.trust_input = True
    np.testing.assert_allclose(f(np.ones(2)), [1, 1])
    w2 = theano.shared(10.0)
    g = f.copy(swap={w: w2})
    np.testing.assert_allclose(g(np.ones(2)), [10, 10])
    assert w2.get_value() == 11.0


def test_runtime_shape_error_names_source():
    from cgvm.errors import CgvmError

    x, y = T.dvectors("x", "y")
    f = theano.function([x, y], x + y)
    with pytest.raises(CgvmError, match="test_theano_function.py"):
        f(np.ones(2), np.ones(3))

