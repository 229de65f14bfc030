"""Logistic regression on scikit-learn's digits, as in the Theano tutorial (only the imports differ).

With Theano: ``import theano`` and ``import theano.tensor as T``.
"""
import numpy as np
from sklearn.datasets import load_digits

import cgvm.theano as theano
import cgvm.theano.tensor as T

digits = load_digits()
data_x = theano.shared((digits.data / 16.0).astype(theano.config.floatX), borrow=True)
data_y = theano.shared(digits.target.astype("int32"), borrow=True)
batch = 100

x, y, index = T.matrix("x"), T.ivector("y"), T.lscalar("index")
W = theano.shared(np.zeros((64, 10), dtype=theano.config.floatX), name="W")
b = theano.shared(np.zeros(10, dtype=theano.config.floatX), name="b")
p_y_given_x = T.nnet.softmax(T.dot(x, W) + b)
y_pred = T.argmax(p_y_given_x, axis=1)
cost = -T.mean(T.log(p_y_given_x)[T.arange(y.shape[0]), y])
g_W, g_b = T.grad(cost, [W, b])
train = theano.function([index], cost, updates=[(W, W - 0.5 * g_W), (b, b - 0.5 * g_b)],
                        givens={x: data_x[index * batch:(index + 1) * batch],
                                y: data_y[index * batch:(index + 1) * batch]})
error = theano.function([], T.mean(T.neq(y_pred, y)), givens={x: data_x, y: data_y})

for epoch in range(5):
    losses = [train(i) for i in range(len(digits.target) // batch)]
    print(f"epoch {epoch}: loss {np.mean(losses):.4f}  error {float(error()):.3f}")
