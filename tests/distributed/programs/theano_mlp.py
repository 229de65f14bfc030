"""Theano-style data parallelism: usage theano_mlp.py OUT GLOBAL_BATCH STEPS; writes OUT_rank<r>.npz."""
import sys

import numpy as np

import cgvm.distributed as dist
import cgvm.theano as theano
import cgvm.theano.tensor as T
from cgvm.frontends.theano.distributed import broadcast_shared, data_parallel_grad

out, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
g = dist.init()
rng = np.random.default_rng(3)
X = rng.standard_normal((batch * 8, 6)).astype("float32")
Y = (X @ rng.standard_normal((6, 1)) > 0).astype("float32").ravel()
init = np.random.default_rng(40 + g.rank)
w = theano.shared(init.standard_normal((6, 8)).astype("float32") * 0.5, name="w")
v = theano.shared(init.standard_normal(8).astype("float32") * 0.5, name="v")
broadcast_shared([w, v])
x, y = T.matrix("x"), T.vector("y")
p = T.nnet.sigmoid(T.dot(T.tanh(T.dot(x, w)), v))
cost = T.nnet.binary_crossentropy(p, y).mean()
gw, gv = data_parallel_grad(cost, [w, v])
train = theano.function([x, y], cost, updates=[(w, w - 0.5 * gw), (v, v - 0.5 * gv)])
rows = dist.shard_rows(batch)
for i in range(steps):
    s = (i * batch) % len(X)
    train(X[s:s + batch][rows], Y[s:s + batch][rows])
np.savez(f"{out}_rank{g.rank}.npz", w=w.get_value(), v=v.get_value())
