"""The Theano-style names at cgvm's top level."""
import numpy as np
def test_theano_names_at_the_top_level():
    """Issue 3: cgvm.function, cgvm.grad, cgvm.scan, cgvm.shared, cgvm.tensor are the Theano-style ones."""
    import cgvm
    import cgvm.theano as theano

    assert cgvm.function is theano.function and cgvm.grad is theano.grad and cgvm.scan is theano.scan
    assert cgvm.shared is theano.shared and cgvm.tensor is theano.tensor
    x = cgvm.tensor.vector("x")
    w = cgvm.shared(np.array([1.0, 2.0, 3.0], dtype="float32"), name="w_top")
    f = cgvm.function([x], cgvm.grad((x * w).sum() ** 2, w))
    v = np.array([1.0, 0.0, 2.0], dtype="float32")
    np.testing.assert_allclose(f(v), 2 * 7.0 * v)


def test_grad_of_plain_values_returns_values():
    import cgvm
    from cgvm.ir import TensorType, Value, input_value
    from cgvm.ops import elementwise as E
    from cgvm.ops import reduce as R

    v = input_value(TensorType((3,)), "v")
    g = cgvm.grad(R.sum(E.mul(v, v)), v)
    assert isinstance(g, Value)
    np.testing.assert_allclose(cgvm.compile([v], g)(np.array([1, 2, 3], np.float32)), [2, 4, 6])
