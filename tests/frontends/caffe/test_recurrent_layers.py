"""LSTM, RNN, LSTMUnit and Filter against plain NumPy loops of Caffe's formulas, and their gradients (float64)."""
import numpy as np
import pytest

from caffe_helpers import check_gradients, fill_inputs, one_layer_net
from cgvm.frontends.caffe.errors import CaffeNetError

FILLERS = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 }'
H = 3
# two sequences per column: column 0 restarts at t = 2, column 1 at t = 3
CONT = np.array([[0, 0], [1, 1], [0, 1], [1, 0], [1, 1]], np.float64)


def sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def lstm_reference(x, cont, w_xc, b_c, w_hc, x_static=None, w_static=None, h0=None, c0=None):
    """Caffe's unrolled LSTM, step by step: gate order i, f, o, g; returns (h for all steps, h_T, c_T)."""
    steps, batch = cont.shape
    hidden = w_hc.shape[1]
    h = np.zeros((batch, hidden)) if h0 is None else h0.reshape(batch, hidden)
    c = np.zeros((batch, hidden)) if c0 is None else c0.reshape(batch, hidden)
    hs = []
    for t in range(steps):
        for n in range(batch):
            gates = w_xc @ x[t, n].reshape(-1) + b_c + w_hc @ (cont[t, n] * h[n])
            if x_static is not None:
                gates = gates + w_static @ x_static[n].reshape(-1)
            i = sigmoid(gates[:hidden])
            f = cont[t, n] * sigmoid(gates[hidden:2 * hidden])
            o = sigmoid(gates[2 * hidden:3 * hidden])
            g = np.tanh(gates[3 * hidden:])
            c = c.copy()
            h = h.copy()
            c[n] = f * c[n] + i * g
            h[n] = o * np.tanh(c[n])
        hs.append(h.copy())
    return np.stack(hs), h, c


def rnn_reference(x, cont, w_xh, b_h, w_hh, w_ho, b_o, x_static=None, w_static=None, h0=None):
    """Caffe's unrolled RNN: h_t = tanh(W_hh (cont h) + W_xh x + b_h [+ static]); o_t = tanh(W_ho h_t + b_o)."""
    steps, batch = cont.shape
    hidden = w_hh.shape[0]
    h = np.zeros((batch, hidden)) if h0 is None else h0.reshape(batch, hidden).copy()
    os = []
    for t in range(steps):
        new = np.zeros_like(h)
        out = np.zeros_like(h)
        for n in range(batch):
            pre = w_hh @ (cont[t, n] * h[n]) + w_xh @ x[t, n].reshape(-1) + b_h
            if x_static is not None:
                pre = pre + w_static @ x_static[n].reshape(-1)
            new[n] = np.tanh(pre)
            out[n] = np.tanh(w_ho @ new[n] + b_o)
        h = new
        os.append(out)
    return np.stack(os), h


def blobs(net):
    return [b.data for b in net.params["under_test"]]


def recurrent_net(kind, shapes, n_tops=1, extra_param=""):
    body = f'type: "{kind}" recurrent_param {{ num_output: {H} {FILLERS} {extra_param} }}'
    return one_layer_net(body, shapes, n_tops=n_tops)


# --------------------------------------------------------------------------- LSTM

def test_lstm_matches_caffe_formulas_with_resets():
    net = recurrent_net("LSTM", [(5, 2, 3, 2), (5, 2)])
    fill_inputs(net, {1: CONT})
    net.forward()
    assert [b.shape for b in blobs(net)] == [(4 * H, 6), (4 * H,), (4 * H, H)]
    want, _, _ = lstm_reference(net.blobs["b0"].data, CONT, *blobs(net))
    np.testing.assert_allclose(net.blobs["t0"].data, want, rtol=1e-12, atol=1e-12)


def test_lstm_static_input_and_exposed_states():
    shapes = [(5, 2, 4), (5, 2), (2, 3, 1), (1, 2, H), (1, 2, H)]
    net = recurrent_net("LSTM", shapes, n_tops=3, extra_param="expose_hidden: true")
    fill_inputs(net, {1: CONT})
    net.forward()
    w_xc, b_c, w_static, w_hc = blobs(net)
    assert w_static.shape == (4 * H, 3) and w_hc.shape == (4 * H, H)
    x, xs, h0, c0 = (net.blobs[f"b{i}"].data for i in (0, 2, 3, 4))
    hs, h_last, c_last = lstm_reference(x, CONT, w_xc, b_c, w_hc, xs, w_static, h0, c0)
    np.testing.assert_allclose(net.blobs["t0"].data, hs, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(net.blobs["t1"].data, h_last[None], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(net.blobs["t2"].data, c_last[None], rtol=1e-12, atol=1e-12)


def test_lstm_gradients_every_bottom_and_blob():
    cont = np.array([[1, 0], [1, 1], [0, 1]], np.float64)   # nonzero at t = 0: the exposed states matter
    net = recurrent_net("LSTM", [(3, 2, 2), (3, 2), (2, 2), (1, 2, H), (1, 2, H)], n_tops=3,
                        extra_param="expose_hidden: true")
    fill_inputs(net, {1: cont})
    check_gradients(net, [0, 2, 3, 4])
    assert not net.blobs["b1"].diff.any(), "cont is an indicator: no gradient"


def test_lstm_whole_sequence_equals_steps_with_carried_state():
    shapes = [(4, 2, 3), (4, 2), (1, 2, H), (1, 2, H)]
    whole = recurrent_net("LSTM", shapes, n_tops=3, extra_param="expose_hidden: true")
    cont = np.array([[0, 0], [1, 1], [1, 0], [1, 1]], np.float64)
    fill_inputs(whole, {1: cont})
    whole.forward()
    step = recurrent_net("LSTM", [(1, 2, 3), (1, 2), (1, 2, H), (1, 2, H)], n_tops=3,
                         extra_param="expose_hidden: true")
    for mine, theirs in zip(blobs(step), blobs(whole)):
        mine[...] = theirs
    h, c = whole.blobs["b2"].data.copy(), whole.blobs["b3"].data.copy()
    for t in range(4):
        step.blobs["b0"].data[...] = whole.blobs["b0"].data[t:t + 1]
        step.blobs["b1"].data[...] = cont[t:t + 1]
        step.blobs["b2"].data[...], step.blobs["b3"].data[...] = h, c
        step.forward()
        np.testing.assert_allclose(step.blobs["t0"].data[0], whole.blobs["t0"].data[t], rtol=1e-12, atol=1e-12)
        h, c = step.blobs["t1"].data.copy(), step.blobs["t2"].data.copy()
    np.testing.assert_allclose(h, whole.blobs["t1"].data, rtol=1e-12)
    np.testing.assert_allclose(c, whole.blobs["t2"].data, rtol=1e-12)


# --------------------------------------------------------------------------- RNN

def test_rnn_matches_caffe_formulas_with_resets():
    net = recurrent_net("RNN", [(5, 2, 2, 2), (5, 2)])
    fill_inputs(net, {1: CONT})
    net.forward()
    assert [b.shape for b in blobs(net)] == [(H, 4), (H,), (H, H), (H, H), (H,)]
    want, _ = rnn_reference(net.blobs["b0"].data, CONT, *blobs(net))
    np.testing.assert_allclose(net.blobs["t0"].data, want, rtol=1e-12, atol=1e-12)


def test_rnn_static_input_and_exposed_state():
    net = recurrent_net("RNN", [(5, 2, 3), (5, 2), (2, 2), (1, 2, H)], n_tops=2, extra_param="expose_hidden: true")
    fill_inputs(net, {1: CONT})
    net.forward()
    w_xh, b_h, w_static, w_hh, w_ho, b_o = blobs(net)
    assert w_static.shape == (H, 2)
    x, xs, h0 = (net.blobs[f"b{i}"].data for i in (0, 2, 3))
    os, h_last = rnn_reference(x, CONT, w_xh, b_h, w_hh, w_ho, b_o, xs, w_static, h0)
    np.testing.assert_allclose(net.blobs["t0"].data, os, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(net.blobs["t1"].data, h_last[None], rtol=1e-12, atol=1e-12)


def test_rnn_gradients_every_bottom_and_blob():
    cont = np.array([[1, 1], [0, 1], [1, 0]], np.float64)
    net = recurrent_net("RNN", [(3, 2, 2), (3, 2), (2, 3), (1, 2, H)], n_tops=2, extra_param="expose_hidden: true")
    fill_inputs(net, {1: cont})
    check_gradients(net, [0, 2, 3])
    assert not net.blobs["b1"].diff.any()


# --------------------------------------------------------------------------- LSTMUnit

def lstm_unit_net():
    net = one_layer_net('type: "LSTMUnit"', [(1, 3, H), (1, 3, 4 * H), (1, 3)], n_tops=2)
    fill_inputs(net, {2: np.array([[1.0, 0.0, 1.0]])})
    return net


def test_lstm_unit_values():
    net = lstm_unit_net()
    net.forward()
    c_prev, x, cont = (net.blobs[f"b{i}"].data for i in range(3))
    for n in range(3):
        i, f = sigmoid(x[0, n, :H]), cont[0, n] * sigmoid(x[0, n, H:2 * H])
        o, g = sigmoid(x[0, n, 2 * H:3 * H]), np.tanh(x[0, n, 3 * H:])
        c = f * c_prev[0, n] + i * g
        np.testing.assert_allclose(net.blobs["t0"].data[0, n], c, rtol=1e-12)
        np.testing.assert_allclose(net.blobs["t1"].data[0, n], o * np.tanh(c), rtol=1e-12)
    np.testing.assert_allclose(net.blobs["t0"].data[0, 1], (sigmoid(x[0, 1, :H]) * np.tanh(x[0, 1, 3 * H:])),
                               rtol=1e-12, err_msg="cont = 0 resets the cell")


def test_lstm_unit_gradients():
    net = lstm_unit_net()
    check_gradients(net, [0, 1])
    assert not net.blobs["b2"].diff.any()


# --------------------------------------------------------------------------- Filter

def filter_net(selector):
    net = one_layer_net('type: "Filter"', [(4, 2, 3), (4, 2), (4, 1)], n_tops=2)
    fill_inputs(net, {2: np.asarray(selector, np.float64).reshape(4, 1)})
    return net


def test_filter_keeps_selected_items_and_scatters_gradients_back():
    net = filter_net([0, 1, 0, 1])
    net.forward()
    np.testing.assert_array_equal(net.blobs["t0"].data, net.blobs["b0"].data[[1, 3]])
    np.testing.assert_array_equal(net.blobs["t1"].data, net.blobs["b1"].data[[1, 3]])
    net.blobs["t0"].diff[...] = 1.0
    net.blobs["t1"].diff[...] = 2.0
    net.backward()
    np.testing.assert_array_equal(net.blobs["b0"].diff[:, 0, 0], [0, 1, 0, 1])
    np.testing.assert_array_equal(net.blobs["b1"].diff[:, 0], [0, 2, 0, 2])
    assert not net.blobs["b2"].diff.any()
    net.blobs["b2"].data[...] = np.array([[1], [1], [0], [-2.0]])   # a new selection: the top changes size
    net.forward()
    np.testing.assert_array_equal(net.blobs["t0"].data, net.blobs["b0"].data[[0, 1, 3]])
    check_gradients(net, [0, 1])


def test_filter_may_keep_nothing():
    net = filter_net([0, 0, 0, 0])
    net.forward()
    assert net.blobs["t0"].data.shape == (0, 2, 3)


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("body, shapes", [
    (f'type: "LSTM" recurrent_param {{ num_output: 3 }}', [(4, 2, 3), (4, 3)]),
    ('type: "RNN" recurrent_param { }', [(4, 2, 3), (4, 2)]),
    ('type: "LSTM" recurrent_param { num_output: 3 expose_hidden: true }', [(4, 2, 3), (4, 2), (1, 2, 4), (1, 2, 3)]),
    ('type: "LSTMUnit"', [(1, 2, 3), (1, 2, 11), (1, 2)]),
    ('type: "Filter"', [(4, 2), (3,)]),
], ids=["cont_shape", "no_num_output", "hidden_shape", "unit_gates", "filter_rows"])
def test_bad_bottoms_name_the_layer(body, shapes):
    with pytest.raises(CaffeNetError) as info:
        one_layer_net(body, shapes, n_tops=2 if "LSTMUnit" in body else 1)
    assert "under_test" in str(info.value)
