"""Neural-network ops (softmax, log_softmax, LRN, batch_norm, dropout, embedding, PReLU) against NumPy
references written here, with first and second derivatives checked numerically in float64."""
import numpy as np
import pytest

import cgvm
from cgvm.errors import GraphBuildError, ShapeError
from cgvm.ir import TensorType, const_value, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import nn
from cgvm.ops import reduce as R
from harness import Case, check_case, check_grad, run_op

rng = np.random.default_rng(7)


def r(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def away_from_zero(*shape):
    v = r(*shape)
    return (np.sign(v) * (np.abs(v) + 0.3)).astype(np.float32)


def positive(*shape):
    return (np.abs(r(*shape)) + 0.5).astype(np.float32)


def weighted_second_derivative(op, n_diff):
    """build(*xs) -> grad(sum(w * op(*xs)), first n_diff xs), w a fixed random weight: check_grad on it
    checks Hessian-vector products of op."""
    def build(*xs):
        y = op(*xs)
        y = y[0] if isinstance(y, tuple) else y
        w = np.random.default_rng(3).standard_normal([d for d in y.shape]).astype(y.dtype.np)
        return tuple(cgvm.grad(R.sum(E.mul(y, w)), list(xs[:n_diff])))
    return build


def numeric_vjp(fn, g, x, eps=1e-6):
    """d/dx sum(g * fn(x)) by central differences in float64 (a reference for the gradient ops)."""
    x = x.astype(np.float64)
    g = g.astype(np.float64)
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        plus = np.sum(g * fn(x))
        x[idx] = old - eps
        minus = np.sum(g * fn(x))
        x[idx] = old
        out[idx] = (plus - minus) / (2 * eps)
    return out


# --------------------------------------------------------------------------- references

def softmax_ref(x, axis=1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax_ref(x, axis=1):
    s = x - x.max(axis=axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=axis, keepdims=True))


def lrn_ref(x, local_size=5, alpha=1.0, beta=0.75, k=1.0, norm_region="ACROSS_CHANNELS"):
    """Caffe's naive reference (test_lrn_layer.cpp): a loop over every output element."""
    y = np.empty_like(x)
    half = local_size // 2
    for idx in np.ndindex(x.shape):
        if norm_region == "ACROSS_CHANNELS":
            n, c = idx[0], idx[1]
            lo, hi = max(0, c - half), min(x.shape[1], c + half + 1)
            window = x[(n, slice(lo, hi)) + idx[2:]]
            scale = k + alpha / local_size * np.sum(window ** 2)
        else:
            n, c, h, w = idx
            window = x[n, c, max(0, h - half):h + half + 1, max(0, w - half):w + half + 1]
            scale = 1.0 + alpha / local_size ** 2 * np.sum(window ** 2)
        y[idx] = x[idx] * scale ** -beta
    return y


def box_sum_ref(x, size):
    """Sum over the size x size window around each pixel, zero beyond the borders."""
    half = size // 2
    y = np.empty_like(x)
    for n, c, h, w in np.ndindex(x.shape):
        y[n, c, h, w] = x[n, c, max(0, h - half):h + half + 1, max(0, w - half):w + half + 1].sum()
    return y


def bn_ref(x, mean, var, scale=None, bias=None, eps=1e-5, training=False, axis=1):
    a = axis % x.ndim
    axes = tuple(i for i in range(x.ndim) if i != a)
    shape = [1] * x.ndim
    shape[a] = x.shape[a]
    if training:
        mean, var = x.mean(axis=axes), x.var(axis=axes)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
    if scale is not None:
        y = y * scale.reshape(shape)
    if bias is not None:
        y = y + bias.reshape(shape)
    return (y, mean, var) if training else y


def bn_grad_ref(gy, x, mean, var, scale=None, eps=1e-5, axis=1):
    """The textbook batch-norm backward pass, written out per channel."""
    a = axis % x.ndim
    xm, gm = np.moveaxis(x, a, 0), np.moveaxis(gy, a, 0)
    dx = np.empty_like(xm)
    dscale, dbias = np.empty(xm.shape[0], x.dtype), np.empty(xm.shape[0], x.dtype)
    for c in range(xm.shape[0]):
        inv = 1.0 / np.sqrt(var[c] + eps)
        xhat = (xm[c] - mean[c]) * inv
        g = gm[c]
        dbias[c], dscale[c] = g.sum(), (g * xhat).sum()
        gamma = 1.0 if scale is None else scale[c]
        dx[c] = gamma * inv * (g - g.mean() - xhat * (g * xhat).mean())
    return np.moveaxis(dx, 0, a), dscale, dbias


def prelu_ref(x, slope, axis=1):
    a = axis % x.ndim
    aligned = slope.reshape(slope.shape + (1,) * (x.ndim - a - slope.ndim))
    return np.where(x > 0, x, x * aligned)


def dropout_mask_ref(seed, shape, ratio):
    """The documented draw: kept where default_rng(seed).random(shape, float32) >= ratio."""
    return np.random.default_rng(seed).random(shape, dtype=np.float32) >= ratio


# --------------------------------------------------------------------------- cases

SOFTMAX = [
    Case("softmax_axis1", nn.softmax, [r(2, 4, 3, 2)], softmax_ref),
    Case("softmax_last_axis", lambda x: nn.softmax(x, axis=-1), [r(3, 5)], lambda x: softmax_ref(x, -1)),
    Case("softmax_axis0", lambda x: nn.softmax(x, axis=0), [r(4, 3)], lambda x: softmax_ref(x, 0)),
    Case("softmax_dynamic", nn.softmax, [r(2, 3, 2)], softmax_ref, dynamic=True),
    Case("softmax_large_logits", nn.softmax, [r(3, 4) * 1000], softmax_ref, grad=False),
    Case("log_softmax_axis1", nn.log_softmax, [r(2, 4, 3)], log_softmax_ref),
    Case("log_softmax_last_axis", lambda x: nn.log_softmax(x, axis=-1), [r(3, 5)], lambda x: log_softmax_ref(x, -1)),
    Case("log_softmax_large_logits", nn.log_softmax, [r(3, 4) * 1000], log_softmax_ref, grad=False,
         rtol=1e-5, atol=1e-3),
    Case("log_softmax_dynamic", lambda x: nn.log_softmax(x, axis=2), [r(2, 2, 4)],
         lambda x: log_softmax_ref(x, 2), dynamic=True),
    Case("softmax_grad", lambda g, y: nn.softmax_grad(g, y, axis=1), [r(3, 4), softmax_ref(r(3, 4))],
         lambda g, y: y * (g - (g * y).sum(axis=1, keepdims=True))),
    Case("log_softmax_grad", lambda g, y: nn.log_softmax_grad(g, y, axis=-1), [r(3, 4), log_softmax_ref(r(3, 4), -1)],
         lambda g, y: g - np.exp(y) * g.sum(axis=-1, keepdims=True)),
    Case("softmax_second_derivative", weighted_second_derivative(nn.softmax, 1), [r(2, 4)],
         lambda x: numeric_vjp(softmax_ref, np.random.default_rng(3).standard_normal((2, 4)), x), rtol=1e-4,
         atol=1e-5),
    Case("log_softmax_second_derivative", weighted_second_derivative(lambda x: nn.log_softmax(x, axis=-1), 1),
         [r(3, 3)], lambda x: numeric_vjp(lambda v: log_softmax_ref(v, -1), np.random.default_rng(3)
                                           .standard_normal((3, 3)), x), rtol=1e-4, atol=1e-5),
]


def _lrn(**attrs):
    return lambda x: nn.lrn(x, **attrs)


def _lrn_grad_ref(**attrs):
    return lambda g, x: numeric_vjp(lambda v: lrn_ref(v, **attrs), g, x)


LRN_ACROSS = dict(local_size=5, alpha=1.0, beta=0.75, k=1.0)
LRN_ALEXNET = dict(local_size=5, alpha=1e-1, beta=0.75, k=2.0)
LRN_LARGE = dict(local_size=15, alpha=1.0, beta=0.75, k=1.0)
LRN_WITHIN = dict(local_size=3, alpha=1.0, beta=0.75, norm_region="WITHIN_CHANNEL")

LRN = [
    Case("lrn_across", _lrn(), [r(2, 7, 3, 3)], lrn_ref),
    Case("lrn_across_alexnet_k2", _lrn(**LRN_ALEXNET), [r(2, 7, 3, 3)], lambda x: lrn_ref(x, **LRN_ALEXNET)),
    Case("lrn_across_large_region", _lrn(**LRN_LARGE), [r(2, 7, 3, 3)], lambda x: lrn_ref(x, **LRN_LARGE)),
    Case("lrn_within", _lrn(**LRN_WITHIN), [r(2, 3, 4, 5)], lambda x: lrn_ref(x, **LRN_WITHIN)),
    Case("lrn_within_k_ignored", _lrn(k=5.0, **LRN_WITHIN), [r(1, 2, 3, 3)], lambda x: lrn_ref(x, **LRN_WITHIN)),
    Case("lrn_within_size5_small_image", _lrn(local_size=5, alpha=2.0, beta=0.5, norm_region="WITHIN_CHANNEL"),
         [r(1, 2, 3, 2)], lambda x: lrn_ref(x, 5, 2.0, 0.5, norm_region="WITHIN_CHANNEL")),
    Case("lrn_across_2d", _lrn(local_size=3), [r(3, 6)], lambda x: lrn_ref(x, 3)),
    Case("lrn_dynamic", _lrn(local_size=3, alpha=0.5), [r(2, 4, 2, 2)], lambda x: lrn_ref(x, 3, 0.5), dynamic=True),
    Case("lrn_grad_across", lambda g, x: nn.lrn_grad(g, x, **LRN_ACROSS), [r(2, 6, 2, 2), r(2, 6, 2, 2)],
         _lrn_grad_ref(**LRN_ACROSS), rtol=1e-4, atol=1e-5),
    Case("lrn_grad_within", lambda g, x: nn.lrn_grad(g, x, **LRN_WITHIN), [r(1, 2, 3, 3), r(1, 2, 3, 3)],
         _lrn_grad_ref(**LRN_WITHIN), rtol=1e-4, atol=1e-5),
    Case("lrn_grad_across_k2", lambda g, x: nn.lrn_grad(g, x, **LRN_ALEXNET), [r(1, 5, 2, 1), r(1, 5, 2, 1)],
         _lrn_grad_ref(**LRN_ALEXNET), rtol=1e-4, atol=1e-5),
    Case("lrn_window_sum_within", lambda x: nn.lrn_window_sum(x, local_size=3, norm_region="WITHIN_CHANNEL"),
         [r(1, 2, 3, 4)], lambda x: box_sum_ref(x, 3)),
    Case("lrn_window_sum_across", lambda x: nn.lrn_window_sum(x, local_size=5), [r(2, 6, 2)],
         lambda x: np.stack([x[:, max(0, c - 2):c + 3].sum(axis=1) for c in range(6)], axis=1)),
]


BN_TRAIN = [r(4, 3, 2, 2), np.zeros(3, np.float32), np.ones(3, np.float32), positive(3), r(3)]
BN_EVAL = [r(4, 3, 2, 2), r(3), positive(3), positive(3), r(3)]


def _bn(**attrs):
    return lambda *xs: nn.batch_norm(*xs, **attrs)


BATCH_NORM = [
    Case("bn_train_affine", _bn(training=True), BN_TRAIN, lambda *a: bn_ref(*a, training=True), grad_inputs=[0, 3, 4]),
    Case("bn_train_plain_2d", _bn(training=True, eps=1e-3), [r(5, 4), np.zeros(4, np.float32), np.ones(4, np.float32)],
         lambda *a: bn_ref(*a, eps=1e-3, training=True), grad_inputs=[0]),
    Case("bn_train_channels_last", _bn(training=True, axis=-1),
         [r(3, 2, 4), np.zeros(4, np.float32), np.ones(4, np.float32), positive(4)],
         lambda *a: bn_ref(*a, training=True, axis=-1), grad_inputs=[0, 3]),
    Case("bn_train_dynamic", _bn(training=True), BN_TRAIN, lambda *a: bn_ref(*a, training=True),
         grad_inputs=[0, 3, 4], dynamic=True),
    Case("bn_eval_affine", _bn(), BN_EVAL, bn_ref),
    Case("bn_eval_plain", _bn(eps=0.1), BN_EVAL[:3], lambda *a: bn_ref(*a, eps=0.1)),
    Case("bn_eval_scale_only_axis2", _bn(axis=2), [r(2, 3, 4), r(4), positive(4), positive(4)],
         lambda *a: bn_ref(*a, axis=2)),
    Case("bn_eval_dynamic", _bn(), BN_EVAL, bn_ref, dynamic=True),
    Case("bn_grad", lambda *xs: nn.batch_norm_grad(*xs), [r(3, 2, 2), r(3, 2, 2), r(2), positive(2), r(2)],
         lambda gy, x, m, v, s: bn_grad_ref(gy, x, m, v, s), rtol=1e-4, atol=1e-5),
    Case("bn_grad_no_scale_last_axis", lambda *xs: nn.batch_norm_grad(*xs, axis=-1, eps=0.01),
         [r(4, 3), r(4, 3), r(3), positive(3)], lambda gy, x, m, v: bn_grad_ref(gy, x, m, v, eps=0.01, axis=-1),
         rtol=1e-4, atol=1e-5),
    Case("bn_train_second_derivative", weighted_second_derivative(_bn(training=True), 1), BN_TRAIN[:4],
         lambda x, m, v, s: numeric_vjp(lambda t: bn_ref(t, m, v, s, training=True)[0],
                                        np.random.default_rng(3).standard_normal(x.shape), x),
         rtol=1e-3, atol=1e-4, grad_inputs=[0, 3]),
    Case("bn_eval_second_derivative", weighted_second_derivative(_bn(), 5), BN_EVAL,
         lambda *a: [numeric_vjp(lambda t: bn_ref(*a[:i], t, *a[i + 1:]), np.random.default_rng(3)
                                 .standard_normal(a[0].shape), a[i]) for i in range(5)],
         rtol=1e-3, atol=1e-4, grad_inputs=[0, 1, 2, 3]),   # the bias only shifts: no second derivative
]

SEED = np.array(1234, np.int64)

DROPOUT = [
    Case("dropout_ratio0_is_identity", lambda x, s: nn.dropout(x, s, ratio=0.0), [r(3, 4), SEED], lambda x, s: x),
    Case("dropout_linear_gradient", lambda x, s: nn.dropout(x, s, ratio=0.3), [r(4, 5), SEED],
         lambda x, s: x * dropout_mask_ref(1234, x.shape, 0.3) / np.float32(0.7)),
    Case("dropout_grad_linear", lambda g, s: nn.dropout_grad(g, s, ratio=0.5, scale_train=False), [r(6), SEED],
         lambda g, s: g * dropout_mask_ref(1234, g.shape, 0.5)),
]

EMBED_W = r(5, 10)
EMBEDDING = [
    # Caffe's test_embed_layer: ids (4,1,1,1) in [0, 5), weights (5, 10) -> (4, 1, 1, 1, 10)
    Case("embedding_caffe_shape", nn.embedding, [np.array([3, 0, 4, 3], np.int64).reshape(4, 1, 1, 1), EMBED_W],
         lambda i, w: w[i], grad_inputs=[1]),
    Case("embedding_repeated_rows", nn.embedding, [np.array([[1, 1, 2], [0, 1, 4]], np.int32), r(6, 3)],
         lambda i, w: w[i], grad_inputs=[1]),
    Case("embedding_3d_weights_dynamic", nn.embedding, [np.array([2, 0, 2], np.int64), r(3, 2, 2)],
         lambda i, w: w[i], grad_inputs=[1], dynamic=True),
    Case("embedding_grad", nn.embedding_grad, [r(2, 3, 4), np.array([[0, 2, 0], [4, 4, 1]], np.int64), r(5, 4)],
         lambda g, i, w: np.stack([g.reshape(6, 4)[i.reshape(-1) == row].sum(axis=0) for row in range(5)]),
         grad_inputs=[0]),
]

PRELU = [
    Case("prelu_channelwise", nn.prelu, [away_from_zero(2, 3, 2, 2), r(3)], prelu_ref),
    Case("prelu_channel_shared_scalar", nn.prelu, [away_from_zero(2, 3, 2), np.array(0.25, np.float32)], prelu_ref),
    Case("prelu_channel_shared_1", nn.prelu, [away_from_zero(2, 3, 2), np.array([0.1], np.float32)], prelu_ref),
    Case("prelu_per_position", nn.prelu, [away_from_zero(2, 3, 2), r(3, 1)], prelu_ref),
    Case("prelu_channels_last", lambda x, s: nn.prelu(x, s, axis=-1), [away_from_zero(3, 4), r(4)],
         lambda x, s: prelu_ref(x, s, -1)),
    Case("prelu_dynamic", nn.prelu, [away_from_zero(2, 3, 2), r(3)], prelu_ref, dynamic=True),
    Case("prelu_equals_leaky_relu", lambda x, s: nn.prelu(x, s), [r(2, 3), np.full(3, 0.25, np.float32)],
         lambda x, s: np.where(x > 0, x, np.float32(0.25) * x), grad=False),
]

CASES = SOFTMAX + LRN + BATCH_NORM + DROPOUT + EMBEDDING + PRELU


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    if case.name.startswith("dropout") and backend != "numpy":
        pytest.skip("the reference mask is NumPy's default_rng stream")
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)


# --------------------------------------------------------------------------- properties



def test_softmax_sums_to_one_per_position(backend):
    """Caffe's test_softmax_layer: for every (n, h, w) the channel values sum to 1."""
    (y,) = run_op(nn.softmax, [r(2, 10, 2, 3)], backend)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)


def test_batch_norm_training_output_is_standardized(backend):
    """Caffe's test_batch_norm_layer: per channel mean 0 and variance 1 (within 1e-3)."""
    x = r(5, 2, 3, 4) * 3 + 2
    y, mean, var = run_op(lambda x, m, v: nn.batch_norm(x, m, v, training=True),
                        [x, np.zeros(2, np.float32), np.ones(2, np.float32)], backend)
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), 0.0, atol=1e-3)
    np.testing.assert_allclose(y.var(axis=(0, 2, 3)), 1.0, atol=1e-3)
    np.testing.assert_allclose(var, x.var(axis=(0, 2, 3)), rtol=1e-5)   # biased, as documented


@pytest.mark.parametrize("ratio", [0.5, 0.75])
def test_dropout_keeps_about_one_minus_ratio_scaled(ratio, backend):
    """Caffe's test_neuron_layer: survivors equal x / (1 - p); the fraction kept is about 1 - p."""
    x = positive(200, 50)
    seeds = [np.array(s, np.int64) for s in (1, 2)]
    y1, y2, g = run_op(lambda x, s1, s2: (nn.dropout(x, s1, ratio=ratio), nn.dropout(x, s2, ratio=ratio),
                                        nn.dropout_grad(x, s1, ratio=ratio)), [x] + seeds, backend)
    kept = y1 != 0
    np.testing.assert_allclose(y1[kept], x[kept] / (1 - ratio), rtol=1e-6)
    assert abs(kept.mean() - (1 - ratio)) < 0.02
    assert (kept != (y2 != 0)).any()                       # another seed, another mask
    np.testing.assert_array_equal(g, y1)                    # dropout_grad regenerates the same mask


def test_dropout_without_scale_train(backend):
    x = positive(50, 20)
    (y,) = run_op(lambda x, s: nn.dropout(x, s, ratio=0.4, scale_train=False), [x, SEED], backend)
    kept = y != 0
    np.testing.assert_array_equal(y[kept], x[kept])


def test_dropout_is_never_merged_or_folded():
    assert nn.dropout.stateful and nn.dropout_grad.stateful


def test_batch_norm_gradient_through_statistics_sums_to_zero(backend):
    """With the full backward pass, dx sums to 0 per channel (the mean is subtracted out)."""
    x = r(4, 3, 2, 2)
    build = lambda x, m, v: cgvm.grad(R.sum(E.mul(nn.batch_norm(x, m, v, training=True)[0], r(4, 3, 2, 2))), x)
    (dx,) = run_op(build, [x, np.zeros(3, np.float32), np.ones(3, np.float32)], backend)
    np.testing.assert_allclose(dx.sum(axis=(0, 2, 3)), 0.0, atol=1e-5)


def test_embedding_gradient_accumulates_repeats(backend):
    w = r(4, 2)
    idx = np.array([1, 1, 1, 3], np.int64)
    (dw,) = run_op(lambda i, w: cgvm.grad(R.sum(nn.embedding(i, w)), w), [idx, w], backend)
    np.testing.assert_array_equal(dw, [[0, 0], [3, 3], [0, 0], [1, 1]])


def test_kernels_run_in_place(backend):
    """A chain whose intermediates die at once overwrites them (the in-place pairs declared are safe)."""
    x, slope, mean, var = r(2, 4, 3, 3), r(4), r(4), positive(4)
    seed = np.array(5, np.int64)

    def build(x, slope, mean, var, seed):
        h = nn.prelu(E.mul(x, 2.0), slope)
        h = nn.lrn(h, local_size=3, alpha=0.5)
        h = nn.batch_norm(h, mean, var)
        h = nn.dropout(h, seed, ratio=0.0)
        h = nn.log_softmax(nn.softmax(h))
        return h, cgvm.grad(R.sum(E.mul(h, h)), x)

    xs = [input_value(TensorType(a.shape, a.dtype), f"x{i}") for i, a in enumerate((x, slope, mean, var, seed))]
    ws = cgvm.Workspace(backend)
    f = cgvm.compile(xs, list(build(*xs)), workspace=ws, debug=True)
    got, dx = [ws.backend.to_numpy(v) for v in f(*[ws.backend.asarray(a) for a in (x, slope, mean, var, seed)])]
    want = log_softmax_ref(softmax_ref(bn_ref(lrn_ref(prelu_ref(2 * x, slope), 3, 0.5), mean, var)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    unplanned = cgvm.compile(xs, list(build(*xs)), workspace=ws, inplace=False)
    _, dx_unplanned = [ws.backend.to_numpy(v) for v in unplanned(*[ws.backend.asarray(a) for a in
                                                                    (x, slope, mean, var, seed)])]
    np.testing.assert_allclose(dx, dx_unplanned, rtol=1e-6, atol=1e-7)
    (plan,) = f.memory_plans().values()
    assert len(plan.inplace) >= 3, plan.summary()


# --------------------------------------------------------------------------- errors

def _sym(shape, dtype="float32", name="x"):
    return input_value(TensorType(shape, dtype), name)


def test_lrn_even_local_size_names_the_source():
    with pytest.raises(ShapeError, match=r"local_size.*test_nn\.py"):
        nn.lrn(_sym((2, 4, 3, 3)), local_size=4)


def test_lrn_within_needs_4d():
    with pytest.raises(ShapeError, match=r"WITHIN_CHANNEL.*test_nn\.py"):
        nn.lrn(_sym((2, 4, 3)), norm_region="WITHIN_CHANNEL")


def test_batch_norm_statistics_must_match_channels():
    x = _sym((2, 3, 4, 4))
    with pytest.raises(ShapeError, match=r"mean must have shape \(3,\).*test_nn\.py"):
        nn.batch_norm(x, _sym((4,), name="m"), _sym((3,), name="v"))


def test_prelu_slope_must_line_up():
    with pytest.raises(ShapeError, match=r"slope.*test_nn\.py"):
        nn.prelu(_sym((2, 3, 4)), _sym((4,), name="s"))


def test_dropout_ratio_and_seed_are_checked():
    with pytest.raises(ShapeError, match=r"ratio.*test_nn\.py"):
        nn.dropout(_sym((3,)), _sym((), "int64", "s"), ratio=1.0)
    with pytest.raises(ShapeError, match=r"seed.*test_nn\.py"):
        nn.dropout(_sym((3,)), _sym((), "float32", "s"))


def test_embedding_needs_integer_indices():
    with pytest.raises(ShapeError, match=r"integers.*test_nn\.py"):
        nn.embedding(_sym((3,)), _sym((5, 2), name="w"))


def test_unknown_norm_region_is_refused():
    with pytest.raises(GraphBuildError, match=r"norm_region.*test_nn\.py"):
        nn.lrn(_sym((2, 4, 3, 3)), norm_region="ACROSS")


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_lrn_in_sample_chunks_matches_the_whole_batch(monkeypatch, region):
    """LRN runs a few samples at a time to bound its temporaries; chunking must not change a value."""
    from cgvm.ops import nn_norm

    rng = np.random.default_rng(5)
    x, g = rng.standard_normal((7, 6, 5, 4)), rng.standard_normal((7, 6, 5, 4))
    attrs = dict(local_size=3, norm_region=region, alpha=0.7, beta=0.75, k=2.0)
    fwd = nn_norm.lrn.bind(np, attrs)
    bwd = nn_norm.lrn_grad.bind(np, attrs)
    whole_y, whole_dx = fwd(x), bwd(g, x)
    monkeypatch.setattr(nn_norm, "CHUNK_BYTES", x[0].nbytes * 2)   # chunks of 2 samples (and a last of 1)
    assert len(nn_norm._sample_chunks(x)) == 4
    np.testing.assert_allclose(fwd(x), whole_y, rtol=1e-14)
    np.testing.assert_allclose(bwd(g, x), whole_dx, rtol=1e-14)


def test_batch_norm_training_step_in_planned_buffers_and_sample_chunks_matches_torch(monkeypatch):
    """batch_norm and batch_norm_grad write their outputs into planned buffers (multi_out) and work a
    few samples at a time; y, the batch statistics and the gradients must match PyTorch's."""
    torch = pytest.importorskip("torch")
    from cgvm.ops import nn_norm

    rng = np.random.default_rng(4)
    x, g = rng.standard_normal((7, 3, 5, 4)), rng.standard_normal((7, 3, 5, 4))
    scale, bias = rng.standard_normal(3) + 1.0, rng.standard_normal(3)
    monkeypatch.setattr(nn_norm, "CHUNK_BYTES", x[0].nbytes * 2)     # chunks of 2 samples (and a last of 1)
    assert len(nn_norm._bn_parts(x, 1)) == 4
    xs = [input_value(TensorType(a.shape, "float64"), n) for a, n in ((x, "x"), (g, "g"), (scale, "s"), (bias, "b"))]
    zeros = const_value(np.zeros(3)), const_value(np.ones(3))
    y, bmean, bvar = nn.batch_norm(E.tanh(xs[0]), *zeros, xs[2], xs[3], training=True)
    loss = R.sum(E.mul(E.tanh(y), xs[1]))
    f = cgvm.compile(xs, [y, bmean, bvar] + cgvm.grad(loss, [xs[0], xs[2], xs[3]]))
    got = f(x, g, scale, bias)
    plan = next(iter(f.memory_plans().values()))
    from cgvm.vm.bytecode import CALL

    bn_nodes = [i for i in f.program.instrs if i.opcode == CALL and f.program.nodes[i.node].op.name.startswith("batch_norm")]
    assert {f.program.nodes[i.node].op.name for i in bn_nodes} == {"batch_norm", "batch_norm_grad"}
    grad_ins = next(i for i in bn_nodes if f.program.nodes[i.node].op.name == "batch_norm_grad")
    assert plan.storage[grad_ins.results[0]] is not None          # dx planned, not allocated by the kernel
    tx, ts, tb = (torch.tensor(a, requires_grad=True) for a in (x, scale, bias))
    ty = torch.nn.functional.batch_norm(torch.tanh(tx), None, None, ts, tb, training=True, eps=1e-5)
    (torch.tanh(ty) * torch.tensor(g)).sum().backward()
    th = torch.tanh(tx).detach()
    want = [ty.detach(), th.mean(dim=(0, 2, 3)), th.var(dim=(0, 2, 3), unbiased=False), tx.grad, ts.grad, tb.grad]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b.numpy(), rtol=1e-10, atol=1e-12)
