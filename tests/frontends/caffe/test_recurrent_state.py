"""LSTM and RNN carry their final states into the next forward, as BVLC Caffe's RecurrentLayer does.

Without expose_hidden, a forward starts from the previous forward's h_T (and c_T); cont = 1 at
t = 0 continues the sequence, cont = 0 starts afresh; backward differentiates from the state the
forward started from (no gradient crosses batches); a batch-size change starts from zeros. Checked
against a NumPy implementation of Caffe's recurrences with its own BPTT, itself checked against
central differences.
"""
import numpy as np
import pytest

from caffe_helpers import one_layer_net
from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe import solver as S
from cgvm.frontends.caffe.prototxt import parse_solver_text

H, FEATURES = 3, 2
FILLERS = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 }'
N_STATES = {"LSTM": 2, "RNN": 1}


def sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def lstm_reference(x, cont, params, states, top_diff=None):
    """Caffe's LSTM (gates i, f, o, g) from ``states`` = [h0, c0], each (N, H).

    Returns (tops (T, N, H), [h_T, c_T], grads): grads, given ``top_diff``, are d<top_diff, tops>
    with respect to W_xc, b_c, W_hc and x, by backpropagation through these steps only.
    """
    w_xc, b_c, w_hc = params
    steps, batch = cont.shape
    xs = x.reshape(steps, batch, -1)
    h, c = states
    tops, tape = [], []
    for t in range(steps):
        kept = cont[t][:, None]
        h_in = kept * h
        a = xs[t] @ w_xc.T + b_c + h_in @ w_hc.T
        i, f_raw, o = (sigmoid(a[:, k * H:(k + 1) * H]) for k in range(3))
        g = np.tanh(a[:, 3 * H:])
        f = kept * f_raw
        c_new = f * c + i * g
        h = o * np.tanh(c_new)
        tape.append((kept, h_in, c, i, f_raw, f, o, g, c_new))
        c = c_new
        tops.append(h)
    if top_diff is None:
        return np.stack(tops), [h, c], None
    grads = [np.zeros_like(p) for p in params] + [np.zeros_like(xs)]
    dh_next, dc_next = np.zeros((batch, H)), np.zeros((batch, H))
    for t in reversed(range(steps)):
        kept, h_in, c_prev, i, f_raw, f, o, g, c_t = tape[t]
        dh = top_diff[t] + dh_next
        tanh_c = np.tanh(c_t)
        dc = dc_next + dh * o * (1 - tanh_c ** 2)
        da = np.concatenate([dc * g * i * (1 - i), dc * c_prev * kept * f_raw * (1 - f_raw),
                             dh * tanh_c * o * (1 - o), dc * i * (1 - g ** 2)], axis=1)
        grads[0] += da.T @ xs[t]
        grads[1] += da.sum(0)
        grads[2] += da.T @ h_in
        grads[3][t] = da @ w_xc
        dh_next, dc_next = kept * (da @ w_hc), dc * f
    grads[3] = grads[3].reshape(x.shape)
    return np.stack(tops), [h, c], grads


def rnn_reference(x, cont, params, states, top_diff=None):
    """Caffe's RNN from ``states`` = [h0]: h_t = tanh(W_xh x + b_h + W_hh (cont h)); o_t = tanh(W_ho h_t + b_o).

    Returns (tops o (T, N, H), [h_T], grads for W_xh, b_h, W_hh, W_ho, b_o and x, or None).
    """
    w_xh, b_h, w_hh, w_ho, b_o = params
    steps, batch = cont.shape
    xs = x.reshape(steps, batch, -1)
    (h,) = states
    tops, tape = [], []
    for t in range(steps):
        kept = cont[t][:, None]
        h_in = kept * h
        h = np.tanh(xs[t] @ w_xh.T + b_h + h_in @ w_hh.T)
        out = np.tanh(h @ w_ho.T + b_o)
        tape.append((kept, h_in, h, out))
        tops.append(out)
    if top_diff is None:
        return np.stack(tops), [h], None
    grads = [np.zeros_like(p) for p in params] + [np.zeros_like(xs)]
    dh_next = np.zeros((batch, H))
    for t in reversed(range(steps)):
        kept, h_in, h_t, out = tape[t]
        d_out = top_diff[t] * (1 - out ** 2)
        grads[3] += d_out.T @ h_t
        grads[4] += d_out.sum(0)
        d_pre = (d_out @ w_ho + dh_next) * (1 - h_t ** 2)
        grads[0] += d_pre.T @ xs[t]
        grads[1] += d_pre.sum(0)
        grads[2] += d_pre.T @ h_in
        grads[5][t] = d_pre @ w_xh
        dh_next = kept * (d_pre @ w_hh)
    grads[5] = grads[5].reshape(x.shape)
    return np.stack(tops), [h], grads


REFERENCES = {"LSTM": lstm_reference, "RNN": rnn_reference}


def recurrent_net(kind, steps, batch, phase=caffe_pb2.TEST):
    body = f'type: "{kind}" recurrent_param {{ num_output: {H} {FILLERS} }}'
    return one_layer_net(body, [(steps, batch, FEATURES), (steps, batch)], phase=phase)


def params_of(net, layer="under_test"):
    return [np.array(b.data, copy=True) for b in net.params[layer]]


def forward(net, x, cont):
    net.blobs["b0"].data[...] = x
    net.blobs["b1"].data[...] = cont
    net.forward()
    return np.array(net.blobs["t0"].data, copy=True)


def zeros(kind, batch):
    return [np.zeros((batch, H)) for _ in range(N_STATES[kind])]


def sequence(steps, batch, seed=5):
    return np.random.default_rng(seed).normal(size=(steps, batch, FEATURES))


# --------------------------------------------------------------------------- the reference itself

@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_reference_bptt_matches_central_differences(kind):
    rng = np.random.default_rng(11)
    shapes = {"LSTM": [(4 * H, FEATURES), (4 * H,), (4 * H, H)],
              "RNN": [(H, FEATURES), (H,), (H, H), (H, H), (H,)]}[kind]
    params = [rng.normal(scale=0.5, size=s) for s in shapes]
    x, cont = sequence(3, 2), np.array([[1, 1], [0, 1], [1, 1]], np.float64)
    states = [rng.normal(size=(2, H)) for _ in range(N_STATES[kind])]
    seed = rng.normal(size=(3, 2, H))
    reference = REFERENCES[kind]
    _, _, grads = reference(x, cont, params, states, seed)
    for target, grad in zip(params + [x], grads):
        for index in np.ndindex(target.shape):
            original = target[index]
            target[index] = original + 1e-6
            up = (seed * reference(x, cont, params, states)[0]).sum()
            target[index] = original - 1e-6
            down = (seed * reference(x, cont, params, states)[0]).sum()
            target[index] = original
            assert grad[index] == pytest.approx((up - down) / 2e-6, rel=1e-6, abs=1e-8)


# --------------------------------------------------------------------------- forward

@pytest.mark.parametrize("phase", [caffe_pb2.TRAIN, caffe_pb2.TEST], ids=["TRAIN", "TEST"])
@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_two_halves_equal_the_whole_sequence(kind, phase):
    x = sequence(6, 2)
    cont = np.array([[0, 0], [1, 1], [1, 0], [1, 1], [0, 1], [1, 1]], np.float64)   # t = 3: both continue
    net = recurrent_net(kind, 3, 2, phase)
    params = params_of(net)
    first, second = forward(net, x[:3], cont[:3]), forward(net, x[3:], cont[3:])
    whole, _, _ = REFERENCES[kind](x, cont, params, zeros(kind, 2))
    np.testing.assert_allclose(np.concatenate([first, second]), whole, rtol=1e-12, atol=1e-12)
    fresh, _, _ = REFERENCES[kind](x[3:], cont[3:], params, zeros(kind, 2))
    assert not np.allclose(second, fresh), "the carried state must change the second half"


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_cont_zero_at_the_start_resets_the_carried_state(kind):
    x = sequence(6, 2)
    cont = np.array([[1, 1], [1, 1], [1, 1], [0, 1], [1, 1], [1, 1]], np.float64)  # column 0 restarts at t = 3
    net = recurrent_net(kind, 3, 2)
    params = params_of(net)
    forward(net, x[:3], cont[:3])
    second = forward(net, x[3:], cont[3:])
    fresh, _, _ = REFERENCES[kind](x[3:], cont[3:], params, zeros(kind, 2))
    np.testing.assert_allclose(second[:, 0], fresh[:, 0], rtol=1e-12, atol=1e-12)
    whole, _, _ = REFERENCES[kind](x, cont, params, zeros(kind, 2))
    np.testing.assert_allclose(second[:, 1], whole[3:, 1], rtol=1e-12, atol=1e-12)
    assert not np.allclose(second[:, 1], fresh[:, 1])


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_batch_size_change_starts_from_zeros(kind):
    ones = lambda batch: np.ones((3, batch))  # noqa: E731  (cont = 1 everywhere: any carried state would show)
    net = recurrent_net(kind, 3, 2)
    params = params_of(net)
    reference = REFERENCES[kind]
    forward(net, sequence(3, 2, seed=1), ones(2))
    net.blobs["b0"].reshape(3, 3, FEATURES)
    net.blobs["b1"].reshape(3, 3)
    x3a, x3b = sequence(3, 3, seed=2), sequence(3, 3, seed=3)
    want, finals, _ = reference(x3a, ones(3), params, zeros(kind, 3))
    np.testing.assert_allclose(forward(net, x3a, ones(3)), want, rtol=1e-12, atol=1e-12)
    want, _, _ = reference(x3b, ones(3), params, finals)
    np.testing.assert_allclose(forward(net, x3b, ones(3)), want, rtol=1e-12, atol=1e-12)
    # back to the first batch size: the function compiled for it runs again, from zeros
    net.blobs["b0"].reshape(3, 2, FEATURES)
    net.blobs["b1"].reshape(3, 2)
    x2 = sequence(3, 2, seed=4)
    want, finals, _ = reference(x2, ones(2), params, zeros(kind, 2))
    np.testing.assert_allclose(forward(net, x2, ones(2)), want, rtol=1e-12, atol=1e-12)
    want, _, _ = reference(x2, ones(2), params, finals)
    np.testing.assert_allclose(forward(net, x2, ones(2)), want, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- backward

@pytest.mark.parametrize("phase", [caffe_pb2.TRAIN, caffe_pb2.TEST], ids=["TRAIN", "TEST"])
@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_backward_starts_from_the_state_the_forward_used(kind, phase):
    x = sequence(9, 2)
    cont = np.array([[0, 0], [1, 1], [1, 1], [1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [0, 1]], np.float64)
    net = recurrent_net(kind, 3, 2, phase)
    params = params_of(net)
    reference = REFERENCES[kind]
    rng = np.random.default_rng(2)
    forward(net, x[:3], cont[:3])
    _, states, _ = reference(x[:3], cont[:3], params, zeros(kind, 2))
    for part in (slice(3, 6), slice(6, 9)):   # the second backward reuses the compiled backward
        forward(net, x[part], cont[part])
        seed = rng.normal(size=(3, 2, H))
        net.blobs["t0"].diff[...] = seed
        net.clear_param_diffs()
        net.backward()
        _, next_states, grads = reference(x[part], cont[part], params, states, seed)
        for blob, want in zip(net.params["under_test"], grads):
            np.testing.assert_allclose(blob.diff, want, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(net.blobs["b0"].diff, grads[-1], rtol=1e-10, atol=1e-12)
        states = next_states


# --------------------------------------------------------------------------- solver

SOLVER = """
type: "SGD" base_lr: 0.1 lr_policy: "fixed" max_iter: 10 random_seed: 3
net_param {
  layer { name: "data" type: "DummyData" top: "x" top: "cont" top: "y"
          dummy_data_param { shape { dim: 3 dim: 2 dim: 2 } shape { dim: 3 dim: 2 } shape { dim: 3 dim: 2 dim: 3 }
                             data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 }
                             data_filler { type: "gaussian" std: 0.5 } } }
  layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
          recurrent_param { num_output: 3 %s } }
  layer { name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "y" top: "loss" }
}
""" % FILLERS


def test_solver_steps_carry_the_state_between_iterations():
    solver = S.SGDSolver(param=parse_solver_text(SOLVER), log=False)
    net, ws = solver.net, solver.workspace
    states = zeros("LSTM", 2)
    for _ in range(3):
        params = params_of(net, "lstm")
        solver.step(1)
        x, cont, y = (np.asarray(net.blobs[name].data, np.float64) for name in ("x", "cont", "y"))
        h, states_after, _ = lstm_reference(x, cont, params, states)
        want = ((h - y) ** 2).sum() / (2 * x.shape[0])
        assert np.isfinite(solver.smoothed_loss)
        assert solver.smoothed_loss == pytest.approx(want, rel=1e-4)
        if states[0].any():
            fresh, _, _ = lstm_reference(x, cont, params, zeros("LSTM", 2))
            assert not np.isclose(((fresh - y) ** 2).sum() / (2 * x.shape[0]), want, rtol=1e-3)
        for state, name in zip(states_after, ("h", "c")):   # what the next step starts from
            np.testing.assert_allclose(ws[net._entry("lstm") + f"@{name}_T"], state, rtol=1e-4, atol=1e-6)
        states = states_after
    assert not np.allclose(params_of(net, "lstm")[0], params[0]), "the step trained the weights"
