"""Selection ops (cgvm.ops.selection): filter_rows / unfilter_rows against plain NumPy loops, and gradients."""
import numpy as np
import pytest

import cgvm
from cgvm.errors import ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R
from cgvm.ops import selection as S
from harness import Case, check_case, check_grad

rng = np.random.default_rng(5)


def r(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def kept_rows(x, selector):
    return np.stack([x[i] for i in range(len(selector)) if selector[i] != 0]) if np.any(selector != 0) \
        else np.zeros((0,) + x.shape[1:], x.dtype)


def scattered(g, selector, like):
    out = np.zeros(like.shape, g.dtype)
    j = 0
    for i in range(len(selector)):
        if selector[i] != 0:
            out[i] = g[j]
            j += 1
    return out


SEL = np.array([1.0, 0.0, 2.5, 0.0, -1.0], np.float32)

CASES = [
    Case("filter_float_selector", lambda x, s: S.filter_rows(x, s), [r(5, 3), SEL], kept_rows, grad_inputs=[0]),
    Case("filter_int_selector_4d", lambda x, s: S.filter_rows(x, s), [r(4, 2, 3, 2), np.array([0, 1, 1, 0])],
         kept_rows),
    Case("filter_vector", lambda x, s: S.filter_rows(x, s), [r(5), SEL], kept_rows, grad_inputs=[0]),
    Case("filter_keeps_all_dynamic", lambda x, s: S.filter_rows(x, s), [r(3, 2), np.ones(3, np.float32)],
         kept_rows, dynamic=True, grad_inputs=[0]),
    Case("filter_keeps_none", lambda x, s: S.filter_rows(x, s), [r(3, 2), np.zeros(3, np.float32)],
         kept_rows, grad=False),
    Case("filter_then_math", lambda x, s: E.tanh(S.filter_rows(E.mul(x, x), s)), [r(5, 2), SEL],
         lambda x, s: np.tanh(kept_rows(x * x, s)), grad_inputs=[0]),
    Case("unfilter", lambda g, s, like: S.unfilter_rows(g, s, like), [r(3, 2), SEL, r(5, 2)], scattered,
         grad_inputs=[0]),
    Case("unfilter_dynamic", lambda g, s, like: S.unfilter_rows(g, s, like), [r(2, 2, 2), np.array([0, 1, 0, 1]),
         r(4, 2, 2)], scattered, dynamic=True, grad_inputs=[0]),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)


def test_filter_output_rows_are_unknown_until_run_time():
    x = input_value(TensorType((5, 3), "float32"))
    s = input_value(TensorType((5,), "float32"))
    y = S.filter_rows(x, s)
    assert tuple(y.shape) == (None, 3)


def test_second_derivative_through_filter():
    x = input_value(TensorType((5,), "float64"))
    s = input_value(TensorType((5,), "float64"))
    (gx,) = cgvm.grad(R.sum(E.exp(S.filter_rows(x, s))), [x])
    (ggx,) = cgvm.grad(R.sum(gx), [x])
    f = cgvm.compile([x, s], [gx, ggx])
    xv, sv = rng.standard_normal(5), SEL.astype(np.float64)
    want = np.where(sv != 0, np.exp(xv), 0.0)
    got_g, got_gg = f(xv, sv)
    np.testing.assert_allclose(got_g, want, rtol=1e-12)
    np.testing.assert_allclose(got_gg, want, rtol=1e-12)


def _sym(*shape, dtype="float32"):
    return input_value(TensorType(shape, dtype))


@pytest.mark.parametrize("build", [
    lambda: S.filter_rows(_sym(4, 2), _sym(3)),
    lambda: S.filter_rows(_sym(4, 2), _sym(4, 1)),
    lambda: S.unfilter_rows(_sym(2, 3), _sym(4), _sym(4, 2)),
], ids=["rows_mismatch", "selector_rank", "unfilter_row_shape"])
def test_bad_shapes_name_the_user_line(build):
    with pytest.raises(ShapeError) as info:
        build()
    assert "test_selection.py" in str(info.value)
