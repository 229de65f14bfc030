"""Keras-style metrics under keras.distribution.DataParallel: usage keras_metrics.py OUT GLOBAL_BATCH EPOCHS N.
A binary classifier with uneven sample weights and accuracy, Precision, Recall, AUC and MSE metrics;
writes the History (validation included), evaluate(), train_on_batch() and test_on_batch() results
and this rank's weights (OUT_rank<r>.json / .npz)."""
import json
import sys

import numpy as np

import cgvm.keras as keras

out, batch, epochs, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
keras.distribution.set_distribution(keras.distribution.DataParallel())
g = keras.distribution.distribution().group
rng = np.random.default_rng(1)
x = rng.standard_normal((n, 6)).astype(np.float32)
y = (x[:, :1] + 0.5 * x[:, 1:2] > 0.2).astype(np.float32)
weights = rng.uniform(0.2, 2.0, n).astype(np.float32)   # uneven: a mean of the ranks' means would be off
xv, yv = x[: n // 3] * 1.1, y[: n // 3]
keras.utils.set_random_seed(10 + g.rank)     # different initial weights per rank: rank 0's must win
np.random.seed(5)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                          keras.layers.Dense(1, activation="sigmoid")])
model.compile(keras.optimizers.SGD(0.2), "binary_crossentropy",
              metrics=["accuracy", keras.metrics.Precision(), keras.metrics.Recall(thresholds=[0.3, 0.7]),
                       keras.metrics.AUC(num_thresholds=25), "mse"])
history = model.fit(x, y, sample_weight=weights, batch_size=batch, epochs=epochs, verbose=0,
                    validation_data=(xv, yv), shuffle=True)
evaluation = model.evaluate(x, y, sample_weight=weights, batch_size=batch, verbose=0, return_dict=True)
tested = model.test_on_batch(x[:13], y[:13], sample_weight=weights[:13], return_dict=True)
trained = model.train_on_batch(x[:13], y[:13], sample_weight=weights[:13], return_dict=True)
np.savez(f"{out}_rank{g.rank}.npz", **{f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())})


def plain(logs):
    return {k: (np.asarray(v).tolist()) for k, v in logs.items()}


with open(f"{out}_rank{g.rank}.json", "w") as f:
    json.dump({"history": plain(history.history), "evaluate": plain(evaluation), "test_on_batch": plain(tested),
               "train_on_batch": plain(trained)}, f)
