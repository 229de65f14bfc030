"""The facts compiler passes read are declared on the ops (cgvm.ops.registry), and none was lost
when they moved there from the tables keyed by op name that the passes used to keep."""
import numpy as np
import pytest

import cgvm
from cgvm.ir import TensorType, input_value
from cgvm.ir.types import float32, int32
from cgvm.ops import all_ops, registry
from cgvm.ops import elementwise as E
from cgvm.ops import linalg as L


def _names(pred):
    return {name for name, op in all_ops().items() if pred(op)}


def test_shape_only_inputs_are_the_ops_own():
    assert registry.SHAPE_ONLY_INPUTS >= {
        ("sum_to_like", 1), ("reshape_like", 1), ("broadcast_like", 1), ("zeros_like", 0), ("ones_like", 0),
        ("full_like", 0), ("shape_of", 0), ("steps_like", 1), ("pad_steps_like", 1), ("place_first", 1)}
    assert all_ops()["sum_to_like"].reads_only_shape(1) and not all_ops()["sum_to_like"].reads_only_shape(0)


def test_gemm_identity_nonnegative_and_fill_facts():
    assert registry.GEMM_OPS >= {"matmul", "gemm", "gemm_bias_act"}
    assert _names(lambda op: op.may_be_identity) >= {"sum_to_like", "broadcast_like", "reshape_like", "cast"}
    t = TensorType((2, 3), float32)
    assert E.cast.is_identity([t], t) and not E.cast.is_identity([t], t.with_dtype(int32))
    fills = {name: op.fill for name, op in all_ops().items() if op.fill is not None}
    assert fills == {"zeros_like": 0.0, "ones_like": 1.0}
    x = input_value(TensorType((4,), float32), "x")
    for fn in (E.exp, E.sqrt, E.square, E.abs, E.sigmoid, E.softplus):
        assert fn.is_nonnegative(fn(x).node), fn.name
    assert E.relu.is_nonnegative(E.relu(x).node) and not E.relu.is_nonnegative(E.relu(x, negative_slope=0.1).node)
    assert not E.tanh.is_nonnegative(E.tanh(x).node)


def test_activations_lowerings_and_epilogues():
    x = input_value(TensorType((4, 4), float32), "x")
    assert E.relu.activation_of(E.relu(x).node) == "relu"
    assert E.relu.activation_of(E.relu(x, negative_slope=0.2).node) is None
    assert E.tanh.activation_of(E.tanh(x).node) == "tanh" and E.exp.activation_of(E.exp(x).node) is None
    assert E.rsqrt.lower(E.rsqrt(x).node) == [("sqrt", (0,)), ("reciprocal", ("acc",))]
    assert E.clip(x, lo=0.0).node.op.lower(E.clip(x, lo=0.0).node) == [("maximum", (0, ("lit", 0.0, "float32")))]
    assert _names(lambda op: op.epilogue is not None) >= {"matmul", "gemm", "conv"}
    assert L.matmul.epilogue.bias_after is E.add
    gemm = L.gemm(x, x, x, alpha=2.0).node
    assert gemm.op.epilogue.attrs(gemm, "relu") is None   # gemm_bias_act adds c unscaled


@pytest.mark.parametrize("act", ["relu", "tanh", "sigmoid"])
def test_an_epilogue_the_ops_declare_is_fused_and_computes_the_same(act):
    x = input_value(TensorType((3, 4), float32), "x")
    w = input_value(TensorType((4, 5), float32), "w")
    b = input_value(TensorType((5,), float32), "b")
    y = getattr(E, act)(E.add(L.matmul(x, w), b))
    f = cgvm.compile([x, w, b], y)
    assert "gemm_bias_act" in f.dis()
    rng = np.random.default_rng(0)
    xs, ws, bs = (rng.standard_normal(s).astype(np.float32) for s in ((3, 4), (4, 5), (5,)))
    z = xs @ ws + bs
    want = {"relu": np.maximum(z, 0), "tanh": np.tanh(z), "sigmoid": 1 / (1 + np.exp(-z))}[act]
    np.testing.assert_allclose(f(xs, ws, bs), want, rtol=1e-5, atol=1e-6)
