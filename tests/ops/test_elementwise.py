"""Elementwise ops against NumPy references, and their gradients."""
import numpy as np
import pytest

from cgvm.ops import elementwise as E
from harness import Case, check_case, check_grad

rng = np.random.default_rng(42)


def r(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


CASES = [
    Case("add", E.add, [r(3, 4), r(4)], lambda a, b: a + b),
    Case("add_dynamic", E.add, [r(2, 1, 4), r(3, 1)], lambda a, b: a + b, dynamic=True),
    Case("sub", E.sub, [r(3, 4), r(3, 1)], lambda a, b: a - b),
    Case("mul", E.mul, [r(2, 3), r(2, 3)], lambda a, b: a * b),
    Case("neg", E.neg, [r(5)], lambda a: -a),
    Case("exp", E.exp, [r(3, 3)], np.exp),
    Case("tanh", E.tanh, [r(3, 3)], np.tanh),
    Case("relu", E.relu, [r(4, 5)], lambda a: np.maximum(a, 0)),
    Case("relu_leaky", lambda x: E.relu(x, negative_slope=0.1), [r(4, 5)], lambda a: np.where(a > 0, a, 0.1 * a)),
    Case("cast_int", lambda x: E.cast(x, dtype="int32"), [r(3) * 10], lambda a: a.astype(np.int32), grad=False),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)
