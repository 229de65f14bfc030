"""An Elman RNN written with theano.scan, trained by BPTT to sum a noisy sequence (only the imports differ)."""
import numpy as np

import cgvm.theano as theano
import cgvm.theano.tensor as T

rng = np.random.RandomState(0)
n_in, n_hidden = 1, 16
floatX = theano.config.floatX
W_x = theano.shared((rng.randn(n_in, n_hidden) * 0.3).astype(floatX), name="W_x")
W_h = theano.shared((rng.randn(n_hidden, n_hidden) * 0.1).astype(floatX), name="W_h")
W_o = theano.shared((rng.randn(n_hidden) * 0.1).astype(floatX), name="W_o")

xs = T.matrix("xs")  # (time, n_in)
target = T.scalar("target")
h0 = T.zeros((n_hidden,), dtype=floatX)


def step(x_t, h_prev):
    return T.tanh(T.dot(x_t, W_x) + T.dot(h_prev, W_h))


hs, _ = theano.scan(step, sequences=xs, outputs_info=h0)
prediction = T.dot(hs[-1], W_o)
cost = (prediction - target) ** 2
params = [W_x, W_h, W_o]
grads = T.grad(cost, params)
train = theano.function([xs, target], cost, updates=[(p, p - 0.05 * g) for p, g in zip(params, grads)])

for epoch in range(4):
    losses = []
    for _ in range(50):
        seq = rng.uniform(-0.5, 0.5, (10, n_in)).astype(floatX)
        losses.append(train(seq, np.asarray(seq.sum(), dtype=floatX)))
    print(f"epoch {epoch}: mean squared error {np.mean(losses):.4f}")
