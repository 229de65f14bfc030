"""Keras-style fit under keras.distribution.DataParallel: usage keras_fit.py OUT GLOBAL_BATCH EPOCHS N_SAMPLES.
Writes this rank's weights (OUT_rank<r>.npz), the History, evaluate() and predict() results."""
import json
import sys

import numpy as np

import cgvm.keras as keras

out, batch, epochs, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
keras.distribution.set_distribution(keras.distribution.DataParallel())
g = keras.distribution.distribution().group
rng = np.random.default_rng(0)
x = rng.standard_normal((n, 10)).astype(np.float32)
y = (x[:, :3].sum(axis=1) > 0).astype(np.int64) + (x[:, 3] > 1).astype(np.int64)
keras.utils.set_random_seed(10 + g.rank)     # different initial weights per rank: rank 0's must win
np.random.seed(5)                            # the shuffle order (rank 0's is used everywhere)
model = keras.Sequential([keras.Input((10,)), keras.layers.Dense(12, activation="tanh"),
                          keras.layers.Dense(3, activation="softmax")])
model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "sparse_categorical_crossentropy", metrics=["accuracy"])


class Count(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        self.calls = getattr(self, "calls", 0) + 1


count = Count()
history = model.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, callbacks=[count])
evaluation = model.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
predictions = model.predict(x, batch_size=batch, verbose=0)
np.savez(f"{out}_rank{g.rank}.npz", predictions=predictions,
         **{f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())})
with open(f"{out}_rank{g.rank}.json", "w") as f:
    json.dump({"history": history.history, "evaluate": evaluation, "callback_calls": getattr(count, "calls", 0)}, f)
