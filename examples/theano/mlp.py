"""A one-hidden-layer MLP on scikit-learn's digits, Theano-tutorial style (only the imports differ)."""
import numpy as np
from sklearn.datasets import load_digits

import cgvm.theano as theano
import cgvm.theano.tensor as T

rng = np.random.RandomState(1234)
digits = load_digits()
X = (digits.data / 16.0).astype(theano.config.floatX)
Y = digits.target.astype("int32")


def layer(n_in, n_out, name):
    bound = np.sqrt(6.0 / (n_in + n_out))
    W = theano.shared(rng.uniform(-bound, bound, (n_in, n_out)).astype(theano.config.floatX), name="W" + name)
    b = theano.shared(np.zeros(n_out, dtype=theano.config.floatX), name="b" + name)
    return W, b


x, y = T.matrix("x"), T.ivector("y")
W1, b1 = layer(64, 64, "1")
W2, b2 = layer(64, 10, "2")
hidden = T.tanh(T.dot(x, W1) + b1)
p_y = T.nnet.softmax(T.dot(hidden, W2) + b2)
cost = T.mean(T.nnet.categorical_crossentropy(p_y, y)) + 1e-4 * ((W1 ** 2).sum() + (W2 ** 2).sum())
params = [W1, b1, W2, b2]
updates = [(p, p - 0.2 * g) for p, g in zip(params, T.grad(cost, params))]
train = theano.function([x, y], cost, updates=updates)
accuracy = theano.function([x, y], T.mean(T.eq(T.argmax(p_y, axis=1), y)))

for epoch in range(5):
    order = rng.permutation(len(Y))
    losses = [train(X[order[i:i + 64]], Y[order[i:i + 64]]) for i in range(0, len(Y), 64)]
    print(f"epoch {epoch}: loss {np.mean(losses):.4f}  accuracy {float(accuracy(X, Y)):.3f}")
