"""Loss ops against NumPy references written here (loops where Caffe loops), every normalization mode and
ignore_label, with first and second derivatives checked numerically in float64."""
import numpy as np
import pytest

import cgvm
from cgvm.errors import GraphBuildError, ShapeError
from cgvm.ir import TensorType, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import loss as L
from cgvm.ops import reduce as R
from harness import Case, check_case, check_grad, run_op

rng = np.random.default_rng(11)


def r(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def labels(*shape, classes, dtype=np.int64):
    return rng.integers(0, classes, size=shape).astype(dtype)


def probs(*shape, lo=0.05, hi=0.95):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def second_derivative(op, n_diff):
    """build(*xs) -> grad(op(*xs), first n_diff xs) for a scalar loss: check_grad on it checks the Hessian."""
    def build(*xs):
        y = op(*xs)
        if y.ndim:
            w = np.random.default_rng(5).standard_normal(y.shape).astype(y.dtype.np)
            y = R.sum(E.mul(y, w))
        return tuple(cgvm.grad(y, list(xs[:n_diff])))
    return build


def numeric_grads(fn, inputs, which, eps=1e-6):
    """Central differences in float64 of a scalar-valued NumPy reference fn(*inputs) (or of sum(w * fn))."""
    inputs = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in inputs]
    first = fn(*inputs)
    w = np.random.default_rng(5).standard_normal(np.shape(first)) if np.ndim(first) else 1.0
    out = []
    for k in which:
        x = inputs[k]
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            old = x[idx]
            x[idx] = old + eps
            plus = np.sum(w * fn(*inputs))
            x[idx] = old - eps
            minus = np.sum(w * fn(*inputs))
            x[idx] = old
            g[idx] = (plus - minus) / (2 * eps)
        out.append(g)
    return tuple(out)


# --------------------------------------------------------------------------- references (Caffe's loops)

def normalizer(mode, count_valid, total, outer):
    n = {"FULL": total, "VALID": count_valid, "BATCH_SIZE": outer, "NONE": 1}[mode]
    return max(1, n)


def softmax_ce_ref(logits, lab, axis=1, ignore_label=None, normalization="VALID"):
    x = np.moveaxis(logits.astype(np.float64), axis, -1)
    lab = lab.reshape(x.shape[:-1])
    logp = x - x.max(axis=-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(axis=-1, keepdims=True))
    total, count = 0.0, 0
    for idx in np.ndindex(lab.shape):
        if ignore_label is not None and lab[idx] == ignore_label:
            continue
        total -= logp[idx + (lab[idx],)]
        count += 1
    outer = int(np.prod(logits.shape[:axis % logits.ndim]))
    return np.float64(total / normalizer(normalization, count, lab.size, outer))


def softmax_ce_grad_ref(g, logits, lab, axis=1, ignore_label=None, normalization="VALID"):
    return numeric_grads(lambda x: softmax_ce_ref(x, lab, axis, ignore_label, normalization) * g, [logits], [0])[0]


def sigmoid_ce_ref(x, t, ignore_label=None, normalization="BATCH_SIZE"):
    x, t = x.astype(np.float64), t.astype(np.float64)
    # -[t log p + (1 - t) log(1 - p)] with p = sigmoid(x), and log p = -log(1 + e^-x) written as logaddexp
    log_p, log_1mp = -np.logaddexp(0, -x), -np.logaddexp(0, x)
    total, count = 0.0, 0
    for idx in np.ndindex(x.shape):
        if ignore_label is not None and int(t[idx]) == ignore_label:
            continue
        total -= t[idx] * log_p[idx] + (1 - t[idx]) * log_1mp[idx]
        count += 1
    return np.float64(total / normalizer(normalization, count, x.size, x.shape[0]))


def bce_ref(p, t, eps=0.0):
    q = np.clip(p, eps, 1 - eps) if eps else p
    return -(t * np.log(q) + (1 - t) * np.log(1 - q))


def cce_ref(p, t, axis=1, eps=0.0):
    q = np.clip(p, eps, 1 - eps) if eps else p
    if t.dtype.kind == "f":
        return -(t * np.log(q)).sum(axis=axis)
    qm = np.moveaxis(q, axis, -1)
    out = np.empty(qm.shape[:-1], p.dtype)
    for idx in np.ndindex(out.shape):
        out[idx] = -np.log(qm[idx + (t.reshape(out.shape)[idx],)])
    return out


def euclidean_ref(a, b):
    return np.sum((a - b.reshape(a.shape)).astype(np.float64) ** 2) / (2 * a.shape[0])


def mse_ref(a, b, reduction="mean"):
    sq = (a - b) ** 2
    return {"mean": lambda: sq.mean(), "sum": lambda: sq.sum(), "none": lambda: sq,
            "per_sample": lambda: sq.reshape(sq.shape[0], -1).mean(axis=1),
            "last_axis": lambda: sq.mean(axis=-1)}[reduction]()


def hinge_ref(x, lab, norm="L1"):
    """HingeLossLayer::Forward_cpu: negate the true class, then max(0, 1 + t), asum or sumsq, / num."""
    t = x.astype(np.float64).copy()
    for i in range(x.shape[0]):
        t[i, lab.reshape(-1)[i]] *= -1
    t = np.maximum(0, 1 + t)
    return np.float64((t.sum() if norm == "L1" else (t ** 2).sum()) / x.shape[0])


def contrastive_ref(a, b, y, margin=1.0, legacy_version=False):
    n = a.shape[0]
    total = 0.0
    for i in range(n):
        d2 = np.sum((a[i].astype(np.float64) - b[i]) ** 2)
        if int(y.reshape(-1)[i]) != 0:
            total += d2
        elif legacy_version:
            total += max(margin - d2, 0.0)
        else:
            total += max(margin - np.sqrt(d2), 0.0) ** 2
    return np.float64(total / (2 * n))


# --------------------------------------------------------------------------- cases

LOGITS4 = r(4, 5, 2, 3)
LABELS4 = labels(4, 2, 3, classes=5)
IGNORED4 = np.where(rng.random((4, 2, 3)) < 0.3, 255, LABELS4)   # Caffe's segmentation idiom


def _sce(**attrs):
    return lambda x, t: L.softmax_cross_entropy(x, t, **attrs)


SOFTMAX_CE = [
    Case("sce_2d", _sce(), [r(6, 4), labels(6, classes=4)], softmax_ce_ref, grad_inputs=[0]),
    Case("sce_spatial", _sce(), [LOGITS4, LABELS4], softmax_ce_ref, grad_inputs=[0]),
    Case("sce_label_with_class_axis", _sce(), [LOGITS4, LABELS4.reshape(4, 1, 2, 3).astype(np.int32)],
         softmax_ce_ref, grad_inputs=[0]),
    Case("sce_last_axis", _sce(axis=-1), [r(2, 3, 4), labels(2, 3, classes=4)],
         lambda x, t: softmax_ce_ref(x, t, axis=2), grad_inputs=[0]),
    Case("sce_dynamic", _sce(ignore_label=255), [LOGITS4, IGNORED4],
         lambda x, t: softmax_ce_ref(x, t, ignore_label=255), grad_inputs=[0], dynamic=True),
    Case("sce_large_logits", _sce(), [r(3, 4) * 1000, labels(3, classes=4)], softmax_ce_ref, grad=False, rtol=1e-4),
    Case("sce_everything_ignored", _sce(ignore_label=1), [r(3, 4), np.ones(3, np.int64)],
         lambda x, t: np.float32(0.0), grad_inputs=[0]),
] + [
    Case(f"sce_ignore_{mode.lower()}", _sce(ignore_label=255, normalization=mode), [LOGITS4, IGNORED4],
         lambda x, t, mode=mode: softmax_ce_ref(x, t, ignore_label=255, normalization=mode), grad_inputs=[0])
    for mode in L.NORMALIZATIONS
] + [
    Case(f"sce_no_ignore_{mode.lower()}", _sce(normalization=mode), [LOGITS4, LABELS4],
         lambda x, t, mode=mode: softmax_ce_ref(x, t, normalization=mode), grad_inputs=[0])
    for mode in L.NORMALIZATIONS
] + [
    Case("sce_grad_valid", lambda g, x, t: L.softmax_cross_entropy_grad(g, x, t, ignore_label=255),
         [np.array(1.7, np.float32), LOGITS4[:2], IGNORED4[:2]],
         lambda g, x, t: softmax_ce_grad_ref(g, x, t, ignore_label=255), rtol=1e-4, atol=1e-6, grad_inputs=[0, 1]),
    Case("sce_second_derivative", second_derivative(_sce(normalization="FULL"), 1), [r(3, 4), labels(3, classes=4)],
         lambda x, t: numeric_grads(lambda v: softmax_ce_ref(v, t, normalization="FULL"), [x], [0]),
         rtol=1e-4, atol=1e-6, grad_inputs=[0]),
]


def _sig(**attrs):
    return lambda x, t: L.sigmoid_cross_entropy(x, t, **attrs)


SOFT_TARGETS = probs(4, 3, lo=0.0, hi=1.0)
HARD_WITH_IGNORED = np.where(rng.random((4, 3)) < 0.3, -1.0, rng.integers(0, 2, (4, 3))).astype(np.float32)

SIGMOID_CE = [
    Case("sigce_default_batch_size", _sig(), [r(4, 3) * 3, SOFT_TARGETS], sigmoid_ce_ref),
    Case("sigce_4d", _sig(), [r(2, 3, 2, 2), probs(2, 3, 2, 2, lo=0.0, hi=1.0)], sigmoid_ce_ref),
    Case("sigce_large_logits", _sig(), [r(3, 3) * 200, SOFT_TARGETS[:3]], sigmoid_ce_ref, grad=False, rtol=1e-4),
    Case("sigce_int_targets", _sig(), [r(4, 3), rng.integers(0, 2, (4, 3)).astype(np.int32)], sigmoid_ce_ref,
         grad_inputs=[0]),
    Case("sigce_dynamic", _sig(ignore_label=-1), [r(4, 3), HARD_WITH_IGNORED],
         lambda x, t: sigmoid_ce_ref(x, t, ignore_label=-1), dynamic=True, grad_inputs=[0]),
] + [
    Case(f"sigce_ignore_{mode.lower()}", _sig(ignore_label=-1, normalization=mode), [r(4, 3), HARD_WITH_IGNORED],
         lambda x, t, mode=mode: sigmoid_ce_ref(x, t, ignore_label=-1, normalization=mode), grad_inputs=[0])
    for mode in L.NORMALIZATIONS
] + [
    Case("sigce_grad", lambda g, x, t: L.sigmoid_cross_entropy_grad(g, x, t, normalization="VALID"),
         [np.array(0.8, np.float32), r(3, 2), probs(3, 2)],
         lambda g, x, t: g * (1 / (1 + np.exp(-x)) - t) / 6),
    Case("sigce_second_derivative", second_derivative(_sig(ignore_label=-1), 2), [r(4, 3), HARD_WITH_IGNORED],
         lambda x, t: numeric_grads(lambda v, u: sigmoid_ce_ref(v, u, ignore_label=-1), [x, t], [0])
         + (np.where(t == -1, 0, -x / 4).astype(np.float32),), rtol=1e-4, atol=1e-6, grad_inputs=[0]),
]

PROBABILITY_CE = [
    Case("bce", L.binary_crossentropy, [probs(3, 4), probs(3, 4, lo=0, hi=1)], bce_ref),
    Case("bce_hard_targets_broadcast", L.binary_crossentropy, [probs(3, 4), np.array([0, 1, 1, 0], np.float32)],
         bce_ref),
    Case("bce_int_targets", L.binary_crossentropy, [probs(5), np.array([0, 1, 1, 0, 1], np.int64)], bce_ref),
    Case("bce_clipped", lambda p, t: L.binary_crossentropy(p, t, eps=0.1),
         [np.array([0.01, 0.5, 0.97, 0.3, 0.05, 0.99], np.float32), probs(6, lo=0, hi=1)],
         lambda p, t: bce_ref(p, t, 0.1)),
    Case("bce_dynamic", L.binary_crossentropy, [probs(2, 3), probs(2, 3, lo=0, hi=1)], bce_ref, dynamic=True),
    Case("bce_second_derivative", second_derivative(L.binary_crossentropy, 2), [probs(2, 3), probs(2, 3, lo=0, hi=1)],
         lambda p, t: numeric_grads(bce_ref, [p, t], [0, 1]), rtol=1e-4, atol=1e-5),
    Case("cce_onehot", L.categorical_crossentropy, [probs(3, 4), np.eye(4, dtype=np.float32)[[0, 3, 1]]], cce_ref),
    Case("cce_soft_targets", L.categorical_crossentropy, [probs(3, 4), probs(3, 4, lo=0, hi=1)], cce_ref),
    Case("cce_int_targets", L.categorical_crossentropy, [probs(4, 3), labels(4, classes=3)], cce_ref,
         grad_inputs=[0]),
    Case("cce_int_targets_spatial", L.categorical_crossentropy, [probs(2, 3, 2), labels(2, 2, classes=3)],
         cce_ref, grad_inputs=[0]),
    Case("cce_last_axis_clipped", lambda p, t: L.categorical_crossentropy(p, t, axis=-1, eps=0.1),
         [np.array([[0.02, 0.5, 0.48], [0.3, 0.96, 0.04]], np.float32), probs(2, 3, lo=0, hi=1)],
         lambda p, t: cce_ref(p, t, axis=-1, eps=0.1)),
    Case("cce_dynamic", L.categorical_crossentropy, [probs(2, 3), labels(2, classes=3)], cce_ref, dynamic=True,
         grad_inputs=[0]),
    Case("cce_second_derivative", second_derivative(L.categorical_crossentropy, 2), [probs(2, 3), probs(2, 3)],
         lambda p, t: numeric_grads(cce_ref, [p, t], [0, 1]), rtol=1e-4, atol=1e-5),
]

REGRESSION = [
    Case("euclidean", L.euclidean, [r(4, 3), r(4, 3)], euclidean_ref),
    Case("euclidean_other_shape", L.euclidean, [r(4, 3), r(4, 3, 1, 1)], euclidean_ref),
    Case("euclidean_dynamic", L.euclidean, [r(3, 2, 2), r(3, 2, 2)], euclidean_ref, dynamic=True),
    Case("euclidean_second_derivative", second_derivative(L.euclidean, 2), [r(3, 2), r(3, 2)],
         lambda a, b: numeric_grads(euclidean_ref, [a, b], [0, 1]), rtol=1e-4, atol=1e-5),
] + [
    Case(f"mse_{mode}", lambda a, b, mode=mode: L.mse(a, b, reduction=mode), [r(3, 2, 4), r(3, 2, 4)],
         lambda a, b, mode=mode: mse_ref(a, b, mode))
    for mode in L.MSE_REDUCTIONS
] + [
    Case("mse_broadcast_target", L.mse, [r(3, 4), r(4)], mse_ref),
    Case("mse_per_sample_dynamic", lambda a, b: L.mse(a, b, reduction="per_sample"), [r(3, 2, 2), r(3, 2, 2)],
         lambda a, b: mse_ref(a, b, "per_sample"), dynamic=True),
    Case("mse_per_sample_1d", lambda a, b: L.mse(a, b, reduction="per_sample"), [r(3), r(3)],
         lambda a, b: (a - b) ** 2),
    Case("mse_second_derivative", second_derivative(lambda a, b: L.mse(a, b, reduction="last_axis"), 2),
         [r(2, 3), r(2, 3)], lambda a, b: numeric_grads(lambda u, v: mse_ref(u, v, "last_axis"), [a, b], [0, 1]),
         rtol=1e-4, atol=1e-5),
]


def _margins_away_from_kink(n, d):
    """Scores whose hinge margins 1 + t stay clear of 0, so central differences see one side only."""
    x = r(n, d)
    return np.where(np.abs(np.abs(x) - 1) < 0.1, x * 1.5, x).astype(np.float32)


HINGE_X, HINGE_Y = _margins_away_from_kink(5, 4), labels(5, classes=4)

MARGIN_LOSSES = [
    Case("hinge_l1", L.hinge, [HINGE_X, HINGE_Y], hinge_ref, grad_inputs=[0]),
    Case("hinge_l2", lambda x, t: L.hinge(x, t, norm="L2"), [HINGE_X, HINGE_Y],
         lambda x, t: hinge_ref(x, t, "L2"), grad_inputs=[0]),
    Case("hinge_label_column", L.hinge, [HINGE_X, HINGE_Y.reshape(5, 1).astype(np.int32)], hinge_ref,
         grad_inputs=[0]),
    Case("hinge_dynamic", lambda x, t: L.hinge(x, t, norm="L2"), [HINGE_X, HINGE_Y],
         lambda x, t: hinge_ref(x, t, "L2"), grad_inputs=[0], dynamic=True),
]

PAIR_A = r(6, 3) * 0.5
PAIR_B = (PAIR_A + r(6, 3) * np.array([[0.1], [0.2], [0.6], [0.9], [0.05], [1.5]])).astype(np.float32)
PAIR_Y = np.array([1, 0, 0, 1, 0, 0], np.float32)
CONTRASTIVE = [
    Case("contrastive", L.contrastive, [PAIR_A, PAIR_B, PAIR_Y], contrastive_ref, grad_inputs=[0, 1]),
    Case("contrastive_legacy", lambda a, b, y: L.contrastive(a, b, y, legacy_version=True),
         [PAIR_A, PAIR_B, PAIR_Y], lambda a, b, y: contrastive_ref(a, b, y, legacy_version=True), grad_inputs=[0, 1]),
    Case("contrastive_margin2_int_labels_caffe_shape", lambda a, b, y: L.contrastive(a, b, y, margin=2.0),
         [PAIR_A.reshape(6, 3, 1, 1), PAIR_B.reshape(6, 3, 1, 1), PAIR_Y.astype(np.int64).reshape(6, 1, 1, 1)],
         lambda a, b, y: contrastive_ref(a, b, y, margin=2.0), grad_inputs=[0, 1]),
    Case("contrastive_dynamic", L.contrastive, [PAIR_A, PAIR_B, PAIR_Y], contrastive_ref, grad_inputs=[0, 1],
         dynamic=True),
    Case("contrastive_second_derivative", second_derivative(L.contrastive, 2), [PAIR_A, PAIR_B, PAIR_Y],
         lambda a, b, y: numeric_grads(contrastive_ref, [a, b, y], [0, 1]), rtol=1e-4, atol=1e-5,
         grad_inputs=[0, 1]),
]

HELPERS = [
    Case("loss_weights_valid", lambda t: L.loss_weights(t, ignore_label=255), [IGNORED4],
         lambda t: (t != 255).astype(np.float32) / max(1, (t != 255).sum()), grad=False),
    Case("loss_weights_batch_two_outer_axes", lambda t: L.loss_weights(t, outer_axes=2, normalization="BATCH_SIZE"),
         [IGNORED4], lambda t: np.full(t.shape, 1 / 8, np.float32), grad=False),
    Case("loss_weights_float_labels_truncate", lambda t: L.loss_weights(t, ignore_label=-1, normalization="NONE"),
         [np.array([-1.0, -0.5, 2.0, -1.7], np.float32)], lambda t: np.array([0, 1, 1, 0], np.float32), grad=False),
    Case("one_hot_like", lambda t, x: L.one_hot_like(t, x, axis=1), [np.array([[2, 0], [255, 1]]), r(2, 3, 2)],
         lambda t, x: (np.arange(3)[None, :, None] == t[:, None, :]).astype(np.float32), grad=False),
]

CASES = SOFTMAX_CE + SIGMOID_CE + PROBABILITY_CE + REGRESSION + MARGIN_LOSSES + CONTRASTIVE + HELPERS


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values(case, backend):
    check_case(case, backend)


@pytest.mark.parametrize("case", [c for c in CASES if c.grad], ids=repr)
def test_gradients(case, backend):
    check_grad(case, backend)


# --------------------------------------------------------------------------- properties



def test_softmax_loss_ignoring_each_label_sums_to_four_times_the_loss(backend):
    """Caffe's test_softmax_with_loss_layer: normalize false (BATCH_SIZE), bottom 10x5x2x3, labels 10x1x2x3;
    ignoring each of the 5 labels in turn and summing gives 4x the full loss."""
    x, t = r(10, 5, 2, 3), labels(10, 1, 2, 3, classes=5)
    build = lambda x, t: [L.softmax_cross_entropy(x, t, normalization="BATCH_SIZE")] + [
        L.softmax_cross_entropy(x, t, ignore_label=i, normalization="BATCH_SIZE") for i in range(5)]
    full, *partial = run_op(build, [x, t], backend)
    np.testing.assert_allclose(sum(partial), 4 * full, rtol=1e-5)


def test_softmax_loss_gradient_is_softmax_minus_onehot(backend):
    x, t = r(3, 4), np.array([0, 3, 3])
    (dx,) = run_op(lambda x, t: cgvm.grad(L.softmax_cross_entropy(x, t, ignore_label=0), x), [x, t], backend)
    p = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    want = (p - np.eye(4)[t]) / 2
    want[0] = 0                       # the ignored position gets no gradient
    np.testing.assert_allclose(dx, want, rtol=1e-5, atol=1e-7)


def test_sigmoid_loss_default_normalizes_by_batch(backend):
    """Caffe's SigmoidCrossEntropyLoss default: divide by N, not by the element count."""
    x, t = r(4, 6), probs(4, 6, lo=0, hi=1)
    (batch,), (full,) = (run_op(lambda x, t: L.sigmoid_cross_entropy(x, t, normalization=m), [x, t], backend)
                         for m in ("BATCH_SIZE", "FULL"))
    (default,) = run_op(L.sigmoid_cross_entropy, [x, t], backend)
    np.testing.assert_allclose(default, batch)
    np.testing.assert_allclose(batch, 6 * full, rtol=1e-5)


def test_contrastive_identical_dissimilar_pair_has_zero_gradient(backend):
    a = r(2, 3)
    y = np.array([0, 0], np.float32)
    loss, da = run_op(lambda a, b, y: (L.contrastive(a, b, y), cgvm.grad(L.contrastive(a, b, y), a)),
                    [a, a.copy(), y], backend)
    np.testing.assert_allclose(loss, 0.5)          # max(1 - 0, 0)^2 per pair, / (2 N) with N = 2
    np.testing.assert_array_equal(da, 0.0)


def test_loss_weight_scales_loss_and_gradient(backend):
    """Caffe's test_net: a loss weight of 3.7 scales the loss and every gradient by 3.7."""
    a, b = r(4, 3), r(4, 3)
    build = lambda a, b: (E.mul(L.euclidean(a, b), 3.7), cgvm.grad(E.mul(L.euclidean(a, b), 3.7), a))
    loss, da = run_op(build, [a, b], backend)
    np.testing.assert_allclose(loss, 3.7 * euclidean_ref(a, b), rtol=1e-5)
    np.testing.assert_allclose(da, 3.7 * (a - b) / 4, rtol=1e-5)


# --------------------------------------------------------------------------- errors

def _sym(shape, dtype="float32", name="x"):
    return input_value(TensorType(shape, dtype), name)


def test_softmax_loss_needs_integer_labels():
    with pytest.raises(ShapeError, match=r"labels must be integers.*test_loss\.py"):
        L.softmax_cross_entropy(_sym((4, 3)), _sym((4,), name="t"))


def test_softmax_loss_label_shape_is_checked():
    with pytest.raises(ShapeError, match=r"expected shape \(2, 4, 4\).*test_loss\.py"):
        L.softmax_cross_entropy(_sym((2, 5, 4, 4)), _sym((2, 4, 5), "int64", "t"))


def test_unknown_normalization_is_refused():
    with pytest.raises(GraphBuildError, match=r"normalization.*test_loss\.py"):
        L.softmax_cross_entropy(_sym((4, 3)), _sym((4,), "int64", "t"), normalization="BATCH")


def test_hinge_needs_2d_scores_and_contrastive_one_label_per_pair():
    with pytest.raises(ShapeError, match=r"hinge.*test_loss\.py"):
        L.hinge(_sym((2, 3, 4)), _sym((2,), "int64", "t"))
    with pytest.raises(ShapeError, match=r"one per sample.*test_loss\.py"):
        L.contrastive(_sym((4, 3)), _sym((4, 3), name="b"), _sym((4, 2), name="y"))


@pytest.mark.parametrize("normalization", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
@pytest.mark.parametrize("classes", [10, 40])
def test_softmax_loss_over_few_classes_matches_the_definition(normalization, classes):
    """(rows, classes) logits with few classes take a transposed, classes-first path (loss, its
    gradient, softmax and log_softmax); many classes the general one. Both against float64 NumPy."""
    from cgvm.ops import nn

    rng = np.random.default_rng(9)
    x = (rng.standard_normal((64, classes)) * 4).astype(np.float32)
    y = rng.integers(0, classes, 64)
    assert (nn.classes_first(np, x, 1) is not None) == (classes <= nn.SHORT_CLASS_AXIS)
    z = x.astype(np.float64) - x.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    divisor = 1 if normalization == "NONE" else 64
    attrs = dict(axis=1, ignore_label=None, normalization=normalization)
    loss = L.softmax_cross_entropy.bind(np, attrs)(x, y)
    np.testing.assert_allclose(loss, -logp[np.arange(64), y].sum() / divisor, rtol=1e-5)
    out = np.full_like(x, np.nan)
    grad = L.softmax_cross_entropy_grad.bind(np, attrs)(np.float32(3.0), x, y, out=out)
    want = np.exp(logp)
    want[np.arange(64), y] -= 1
    assert grad is out
    np.testing.assert_allclose(grad, 3.0 * want / divisor, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(nn.softmax_values(np, x, 1), np.exp(logp), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(nn.log_softmax_values(np, x, 1), logp, rtol=1e-5, atol=1e-5)
