"""Simplification: algebraic identities, stable forms of log-softmax and cross-entropies, BN/Scale/Bias
folded into the preceding convolution.

Each rewrite: the ops of the optimized graph (before/after), and its results against the
unoptimized program (``passes=[]``) within float32 tolerance (or against NumPy where the
unoptimized program overflows, which is the point of the stable forms).
"""
import numpy as np
import pytest

import cgvm
from cgvm.compiler import prune
from cgvm.compiler.simplify import simplify
from cgvm.ir import Graph, TensorType, input_value, param_value
from cgvm.ops import conv as C
from cgvm.ops import elementwise as E
from cgvm.ops import grad_control as G
from cgvm.ops import indexing as I
from cgvm.ops import loss as LS
from cgvm.ops import nn as N
from cgvm.ops import reduce as R
from cgvm.ops import shape as S

RNG = np.random.default_rng(1)
TOL = dict(rtol=1e-5, atol=1e-6)
NO_FUSION = [p for p in cgvm.compiler.pass_names() if p not in ("epilogues", "fuse")]


def ops(f):
    return [n.op.name for n in f.graph.nodes]


def pair(inputs, outputs, **kw):
    """(simplified, unoptimized): the simplified one without fusion, so its ops stay readable."""
    return cgvm.compile(inputs, outputs, passes=NO_FUSION, **kw), cgvm.compile(inputs, outputs, passes=[], **kw)


def check_same(f, bare, *args, **tol):
    got, want = f(*args), bare(*args)
    for g, w in zip(got if isinstance(got, list) else [got], want if isinstance(want, list) else [want]):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, **(tol or TOL))


def randn(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


# --------------------------------------------------------------------------- algebra

def test_identity_elements_vanish():
    x = input_value(TensorType((None, 3)), "x")
    y = E.tanh(E.sub(E.div(E.add(0.0, E.mul(1.0, E.add(E.mul(x, 1.0), 0.0))), 1.0), 0.0))
    f, bare = pair([x], y)
    assert ops(f) == ["tanh"]
    check_same(f, bare, randn(4, 3))


def test_identity_constants_that_widen_or_retype_stay():
    x = input_value(TensorType((3,)), "x")
    i = input_value(TensorType((3,), "int32"), "i")
    widen = E.mul(x, np.ones((2, 3), np.float32))          # (3,) * ones(2, 3) is (2, 3)
    retype = E.add(i, np.zeros(3, np.float32))              # int32 + float32 zeros is float64
    f, bare = pair([x, i], [widen, retype])
    assert ops(f) == ["mul", "add"]
    check_same(f, bare, randn(3), np.arange(3, dtype=np.int32))


def test_zeros_like_and_ones_like_are_identity_elements():
    x = input_value(TensorType((4, 3)), "x")
    w = input_value(TensorType((4, 3)), "w")
    y = E.tanh(E.mul(E.add(S.zeros_like(w), x), S.ones_like(w)))        # autodiff's zero gradient + x
    f, bare = pair([x, w], y)
    assert ops(f) == ["tanh"]
    check_same(f, bare, randn(4, 3), randn(4, 3))
    big = input_value(TensorType((2, 4, 3)), "big")
    f, bare = pair([x, big], E.add(S.zeros_like(big), x))    # the zeros widen x: the add stays
    assert "add" in ops(f)
    check_same(f, bare, randn(4, 3), randn(2, 4, 3))


def test_sum_to_like_its_own_static_shape_vanishes():
    x = input_value(TensorType((4, 3)), "x")
    like = input_value(TensorType((4, 3)), "like")
    small = input_value(TensorType((1, 3)), "small")
    unknown = input_value(TensorType((None, 3)), "unknown")
    f, bare = pair([x, like, small, unknown],
                   [E.tanh(R.sum_to_like(x, like)), R.sum_to_like(x, small), R.sum_to_like(unknown, like)])
    assert ops(f) == ["tanh", "sum_to_like", "sum_to_like"]   # reducing, or not provably the same shape
    check_same(f, bare, randn(4, 3), randn(4, 3), randn(1, 3), randn(4, 3))


def test_sgd_on_a_gathered_gradient_adds_to_the_rows_only():
    """w - lr * take_grad(g, w, i) (an embedding's SGD step) -> take_add(w, -(lr g), i): no zeros the size of w."""
    w = input_value(TensorType((None, 3)), "w")
    g = input_value(TensorType((None, 2, 3)), "g")
    i = input_value(TensorType((None, 2), "int64"), "i")
    lr = input_value(TensorType(()), "lr")
    f, bare = pair([w, g, i, lr], [E.sub(w, E.mul(lr, I.take_grad(g, w, i, axis=0))),
                                   E.add(I.take_grad(g, w, i, axis=0), w)])
    assert "take_grad" not in ops(f) and ops(f).count("take_add") == 2
    check_same(f, bare, randn(6, 3), randn(4, 2, 3), np.array([[0, 5], [5, 1], [0, 0], [2, 3]]),
               np.array(0.3, np.float32))
    other = input_value(TensorType((None, 3)), "other")    # shaped after another value: left alone
    f, _ = pair([w, other, g, i], E.sub(other, I.take_grad(g, w, i, axis=0)))
    assert "take_grad" in ops(f)


def test_a_gradient_broadcast_to_the_value_it_updates_is_not_broadcast():
    """c - lr * broadcast_like(p, c): the subtraction broadcasts p to c's shape itself, and the
    product then adds into c as one gemm (accumulate)."""
    from cgvm.ops import linalg as L
    a, b = input_value(TensorType((None, None)), "a"), input_value(TensorType((None, None)), "b")
    c = input_value(TensorType((None, None)), "c")
    lr = input_value(TensorType(()), "lr")
    y = E.sub(c, E.mul(lr, S.broadcast_like(L.matmul(a, b), c)))
    f, bare = pair([a, b, c, lr], y)
    assert "broadcast_like" not in ops(f)
    assert "gemm_accumulate" in [n.op.name for n in cgvm.compile([a, b, c, lr], y).graph.nodes]
    check_same(f, bare, randn(4, 5), randn(5, 3), randn(4, 3), np.array(0.1, np.float32))
    check_same(f, bare, randn(1, 5), randn(5, 3), randn(4, 3), np.array(0.1, np.float32))   # p broadcast into c


def test_double_negation_and_log_of_exp():
    x = input_value(TensorType((None,)), "x")
    f, bare = pair([x], E.tanh(E.log(E.exp(E.neg(E.neg(x))))))
    assert ops(f) == ["tanh"]
    check_same(f, bare, randn(6))


def test_exp_of_log_only_for_values_that_cannot_be_negative():
    x = input_value(TensorType((None,)), "x")
    f, bare = pair([x], [E.mul(E.exp(E.log(E.sqrt(x))), 2.0), E.mul(E.exp(E.log(x)), 2.0)])
    assert ops(f).count("log") == 1 and ops(f).count("exp") == 1 and ops(f).count("sqrt") == 1
    with np.errstate(divide="ignore", invalid="ignore"):   # log(0) and log(-1) in the unoptimized program
        check_same(f, bare, np.array([4.0, 0.25, 0.0, 9.0], np.float32))
        nan_where_negative = f(np.array([-1.0, 2.0], np.float32))[1]
    assert np.isnan(nan_where_negative[0]) and nan_where_negative[1] == pytest.approx(4.0)


def test_transposes_compose_or_cancel():
    x = input_value(TensorType((2, 3, 4)), "x")
    once = S.transpose(S.transpose(x, perm=(1, 0, 2)), perm=(0, 2, 1))
    back = S.transpose(S.transpose(x, perm=(2, 0, 1)), perm=(1, 2, 0))
    g = simplify(Graph([x], [E.exp(once), E.exp(back)]))
    transposes = [n for n in g.nodes if n.op.name == "transpose"]
    assert len(transposes) == 1 and transposes[0].attrs["perm"] == (1, 2, 0)
    f, bare = cgvm.compile([x], [E.exp(once), E.exp(back)], passes=["simplify"]), \
        cgvm.compile([x], [E.exp(once), E.exp(back)], passes=[])
    check_same(f, bare, randn(2, 3, 4))


def test_reshapes_collapse_and_identity_views_go():
    x = input_value(TensorType((None, 6)), "x")
    r = S.reshape(S.reshape(x, shape=(-1, 2, 3)), shape=(-1, 3, 2))
    same = S.reshape(x, shape=(-1, 6))
    kept = G.stop_gradient(E.cast(S.squeeze(S.expand_dims(x, axis=(1,)), axis=(1,)), dtype="float32"))
    f, bare = pair([x], [E.exp(r), E.exp(same), E.tanh(kept)])
    assert ops(f).count("reshape") == 1
    assert not {"cast", "squeeze", "expand_dims", "stop_gradient"} & set(ops(f))
    check_same(f, bare, randn(2, 6))


def test_squeeze_of_an_unknown_dimension_is_kept():
    x = input_value(TensorType((None, 3)), "x")
    f, bare = pair([x], E.exp(S.squeeze(x)))     # the batch may be 1 at run time
    assert "squeeze" in ops(f)
    check_same(f, bare, randn(1, 3))


def test_outputs_never_become_the_callers_own_arrays():
    x = input_value(TensorType((3,)), "x")
    f = cgvm.compile([x], E.mul(x, 1.0))
    v = randn(3)
    out = f(v)
    assert out is not v and not np.shares_memory(out, v)
    np.testing.assert_array_equal(out, v)


def test_values_fed_from_outside_stay_leaves():
    x = input_value(TensorType((4,)), "x")
    h = N.softmax(E.exp(x), axis=0)
    g = prune(Graph([x], [E.log(h)]), given=[h])           # h is an input now, though a node made it
    f = cgvm.compile(list(g.inputs[1:]), list(g.outputs))
    p = np.full(4, 0.25, np.float32)
    np.testing.assert_allclose(f(p)[0], np.log(p), **TOL)


# --------------------------------------------------------------------------- stable forms

def test_log_softmax_is_stable():
    x = input_value(TensorType((None, 5)), "x")
    f, bare = pair([x], E.log(N.softmax(x, axis=1)))
    assert ops(bare) == ["softmax", "log"] and ops(f) == ["log_softmax"]
    check_same(f, bare, randn(3, 5))
    big = randn(3, 5, scale=300)
    want = big - big.max(1, keepdims=True)
    want = want - np.log(np.exp(want).sum(1, keepdims=True))
    assert np.isfinite(f(big)).all()
    np.testing.assert_allclose(f(big), want, rtol=1e-5, atol=1e-4)


def test_log_of_sigmoid_and_of_its_complement():
    x = input_value(TensorType((None,)), "x")
    f, bare = pair([x], [E.log(E.sigmoid(x)), E.log(E.sub(1.0, E.sigmoid(x)))])
    assert "log" not in ops(f) and "sigmoid" not in ops(f) and "softplus" in ops(f)
    check_same(f, bare, randn(10), rtol=1e-5, atol=1e-5)
    v = np.array([-200.0, 200.0], np.float32)
    np.testing.assert_allclose(f(v)[0], [-200.0, 0.0], atol=1e-5)
    np.testing.assert_allclose(f(v)[1], [0.0, -200.0], atol=1e-5)


def test_log1p_expm1_and_a_hand_written_softmax():
    x = input_value(TensorType((None, 4)), "x")
    e = E.exp(x)
    manual = E.div(e, R.sum(e, axis=1, keepdims=True))
    f, bare = pair([x], [E.log(E.add(1.0, E.abs(x))), E.sub(E.exp(x), 1.0), manual])
    assert {"log1p", "expm1", "softmax"} <= set(ops(f)) and "log" not in ops(f) and "div" not in ops(f)
    check_same(f, bare, randn(3, 4), rtol=1e-5, atol=1e-6)
    with np.errstate(over="ignore"):    # exp and expm1 overflow; the softmax does not
        assert np.isfinite(f(randn(2, 4, scale=200))[2]).all()


def test_binary_crossentropy_of_a_sigmoid_uses_the_logits():
    x = input_value(TensorType((None, 3)), "x")
    t = input_value(TensorType((None, 3)), "t")
    f, bare = pair([x, t], LS.binary_crossentropy(E.sigmoid(x), t))
    assert "binary_crossentropy" not in ops(f) and "softplus" in ops(f)
    check_same(f, bare, randn(4, 3), RNG.random((4, 3)).astype(np.float32), rtol=1e-5, atol=1e-5)
    assert np.isfinite(f(randn(4, 3, scale=100), np.ones((4, 3), np.float32))).all()


@pytest.mark.parametrize("float_targets", [False, True])
def test_categorical_crossentropy_of_a_softmax_uses_log_softmax(float_targets):
    x = input_value(TensorType((None, 5)), "x")
    t = input_value(TensorType((None, 5)) if float_targets else TensorType((None,), "int64"), "t")
    f, bare = pair([x, t], LS.categorical_crossentropy(N.softmax(x, axis=1), t))
    assert "categorical_crossentropy" not in ops(f) and "log_softmax" in ops(f)
    labels = RNG.integers(0, 5, 4)
    tv = np.eye(5, dtype=np.float32)[labels] if float_targets else labels
    check_same(f, bare, randn(4, 5), tv, rtol=1e-5, atol=1e-5)
    assert np.isfinite(f(randn(4, 5, scale=300), tv)).all()


def sce_reference(x, labels, norm):
    z = x - x.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    picked = np.take_along_axis(logp, np.expand_dims(labels, 1), axis=1)
    total = -picked.sum()
    return total / {"NONE": 1, "FULL": labels.size, "BATCH_SIZE": labels.shape[0]}[norm]


@pytest.mark.parametrize("form", ["sum", "mean", "keras_sparse", "nchw_batch_mean"])
def test_cross_entropy_patterns_become_softmax_cross_entropy(form):
    if form == "nchw_batch_mean":
        x = input_value(TensorType((None, 4, 2, 3)), "x")
        y = input_value(TensorType((None, 2, 3), "int64"), "y")
        per = R.sum(E.mul(LS.one_hot_like(y, x, axis=1), N.log_softmax(x, axis=1)), axis=1)   # (n, 2, 3)
        loss = E.neg(R.mean(R.sum(per, axis=(1, 2)), axis=0))
        xv, yv, norm = randn(2, 4, 2, 3), RNG.integers(0, 4, (2, 2, 3)), "BATCH_SIZE"
    else:
        x = input_value(TensorType((None, 5)), "x")
        y = input_value(TensorType((None,), "int64"), "y")
        onehot = I.one_hot(y, depth=5, dtype="float32") if form == "keras_sparse" else LS.one_hot_like(y, x, axis=1)
        per = E.neg(R.sum(E.mul(onehot, N.log_softmax(x, axis=-1 if form == "keras_sparse" else 1)), axis=(1,)))
        loss = R.sum(per) if form == "sum" else R.mean(per)
        xv, yv, norm = randn(6, 5), RNG.integers(0, 5, 6), "NONE" if form == "sum" else "FULL"
    f, bare = pair([x, y], loss)
    assert ops(f) == ["softmax_cross_entropy"] and f.graph.nodes[0].attrs["normalization"] == norm
    check_same(f, bare, xv, yv, rtol=1e-5, atol=1e-5)
    if form != "nchw_batch_mean":
        np.testing.assert_allclose(f(xv, yv), sce_reference(xv, yv, norm), rtol=1e-5)


def test_cross_entropy_whose_log_softmax_feeds_the_gradient_is_left_alone():
    x = input_value(TensorType((None, 5)), "x")
    y = input_value(TensorType((None,), "int64"), "y")
    loss = R.mean(E.neg(R.sum(E.mul(LS.one_hot_like(y, x, axis=1), N.log_softmax(x, axis=1)), axis=1)))
    (gx,) = cgvm.grad(loss, [x])
    f, bare = pair([x, y], [loss, gx])
    assert "softmax_cross_entropy" not in ops(f)
    check_same(f, bare, randn(3, 5), RNG.integers(0, 5, 3))


def test_a_mean_over_classes_is_not_a_cross_entropy():
    x = input_value(TensorType((None, 5)), "x")
    y = input_value(TensorType((None,), "int64"), "y")
    f, _ = pair([x, y], E.neg(R.mean(E.mul(LS.one_hot_like(y, x, axis=1), N.log_softmax(x, axis=1)))))
    assert "softmax_cross_entropy" not in ops(f)


# --------------------------------------------------------------------------- folding into convolutions

def conv_net(x, w, stats, scale_shift=True, bias=None):
    mean, var, gamma, beta = stats
    y = N.batch_norm(C.conv(x, w, *([bias] if bias is not None else []), pad=1), mean, var, eps=1e-3)
    if scale_shift:
        y = E.add(E.mul(y, S.reshape(gamma, shape=(-1, 1, 1))), S.reshape(beta, shape=(-1, 1, 1)))
    return E.relu(y)


def stats(c):
    return [randn(c), (RNG.random(c) + 0.5).astype(np.float32), randn(c), randn(c)]


def test_batch_norm_and_scale_with_constant_statistics_fold_into_the_weights():
    x = input_value(TensorType((None, 3, 8, 8)), "x")
    y = conv_net(x, randn(4, 3, 3, 3), stats(4), bias=randn(4))
    f, bare = pair([x], y)
    assert ops(bare) == ["conv", "batch_norm", "reshape", "mul", "reshape", "add", "relu"]
    assert ops(f) == ["conv", "relu"]
    assert all(v.kind == "const" for v in f.graph.nodes[0].inputs[1:])
    check_same(f, bare, randn(2, 3, 8, 8), rtol=1e-4, atol=1e-4)
    fused = cgvm.compile([x], y)
    assert [n.op.name for n in fused.graph.nodes] == ["conv_bias_act"]
    check_same(fused, bare, randn(2, 3, 8, 8), rtol=1e-4, atol=1e-4)


def test_batch_norm_with_parameters_folds_as_nodes_read_every_call():
    ws = cgvm.Workspace()
    for name, value in zip(("mean", "var", "gamma", "beta"), stats(4)):
        ws[name] = value
    ws["w"] = randn(4, 3, 3, 3)
    p = {k: param_value(k, TensorType(ws[k].shape)) for k in ("w", "mean", "var", "gamma", "beta")}
    x = input_value(TensorType((None, 3, 8, 8)), "x")
    y = conv_net(x, p["w"], [p["mean"], p["var"], p["gamma"], p["beta"]])
    f, bare = pair([x], y, workspace=ws)
    assert "batch_norm" not in ops(f) and ops(f).count("conv") == 1
    xv = randn(2, 3, 8, 8)
    check_same(f, bare, xv, rtol=1e-4, atol=1e-4)
    ws["var"] = ws["var"] * 4          # the workspace changes: the folded weight follows
    check_same(f, bare, xv, rtol=1e-4, atol=1e-4)


def test_batch_norm_with_a_weight_larger_than_a_sample_is_left_alone():
    ws = cgvm.Workspace()
    for name, value in zip(("mean", "var", "gamma", "beta"), stats(16)):
        ws[name] = value
    ws["w"] = randn(16, 8, 3, 3)       # 1152 weights against 16 * 2 * 2 = 64 values per sample
    p = {k: param_value(k, TensorType(ws[k].shape)) for k in ("w", "mean", "var", "gamma", "beta")}
    x = input_value(TensorType((None, 8, 2, 2)), "x")
    f, bare = pair([x], conv_net(x, p["w"], [p["mean"], p["var"], p["gamma"], p["beta"]], scale_shift=False),
                   workspace=ws)
    assert "batch_norm" in ops(f)
    check_same(f, bare, randn(3, 8, 2, 2), rtol=1e-4, atol=1e-4)


def test_training_batch_norm_and_shared_conv_outputs_are_not_folded():
    x = input_value(TensorType((None, 3, 6, 6)), "x")
    w = randn(4, 3, 3, 3)
    mean, var = np.zeros(4, np.float32), np.ones(4, np.float32)
    y, _, _ = N.batch_norm(C.conv(x, w, pad=1), mean, var, training=True)
    c = C.conv(x, w, pad=1)
    shared = E.add(N.batch_norm(c, mean, var), c)
    f, bare = pair([x], [y, shared])
    assert ops(f).count("batch_norm") == 2
    check_same(f, bare, randn(2, 3, 6, 6), rtol=1e-4, atol=1e-4)


def test_per_channel_bias_of_a_conv_rides_in_its_bias_input():
    x = input_value(TensorType((None, 2, 5, 5)), "x")
    b = input_value(TensorType((3,)), "b")          # a computed bias: folded as a node, O(channels)
    y = E.add(S.reshape(b, shape=(1, 3, 1, 1)), C.conv(x, randn(3, 2, 3, 3)))
    f, bare = pair([x, b], E.tanh(y))
    assert "add" not in ops(f) and len(next(n for n in f.graph.nodes if n.op.name == "conv").inputs) == 3
    check_same(f, bare, randn(2, 2, 5, 5), randn(3), rtol=1e-5, atol=1e-5)


def test_a_spatial_operand_is_not_per_channel():
    x = input_value(TensorType((None, 2, 4, 4)), "x")
    plane = randn(4, 4)                              # broadcasts over channels, not per channel
    f, bare = pair([x], E.mul(C.conv(x, randn(2, 2, 1, 1)), plane))
    assert "mul" in ops(f)
    check_same(f, bare, randn(1, 2, 4, 4), rtol=1e-5, atol=1e-5)


def test_powers_one_and_two_become_the_value_and_its_square():
    """Weight decay (W ** 2).sum() and its gradient 2 * W ** 1: no generic power per element left;
    other exponents and integer bases keep theirs."""
    x = input_value(TensorType((4, 3)), "x")
    n = input_value(TensorType((4, 3), "int32"), "n")
    outs = [R.sum(E.pow(x, 2)), E.mul(2.0, E.pow(x, 1)), E.pow(x, 3), E.pow(n, 2)]
    f, bare = pair([x, n], outs)
    assert ops(f).count("pow") == 2 and "sum_squares" in ops(f)   # a square, then summed by one dot (reductions)
    xv = RNG.standard_normal((4, 3)).astype(np.float32)
    nv = RNG.integers(-5, 5, (4, 3)).astype(np.int32)
    check_same(f, bare, xv, nv, **TOL)
    np.testing.assert_array_equal(f(xv, nv)[1], 2 * xv)
