"""A Keras-style MLP on scikit-learn's digits, trained by cgvm: ``python examples/keras/mnist_mlp.py``.

The trained model is saved as ``digits_mlp.keras`` in the working directory (``--out`` to put it
elsewhere) and loaded back.
"""
import argparse

import numpy as np
from sklearn.datasets import load_digits

import cgvm.keras as keras
from cgvm.keras import layers

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--out", default="digits_mlp.keras", help="where to save the model (.keras)")
parser.add_argument("--epochs", type=int, default=5)
args = parser.parse_args()

digits = load_digits()
x = (digits.data / 16.0).astype(np.float32)
y = digits.target.astype(np.int64)
model = keras.Sequential([keras.Input((64,)), layers.Dense(64, activation="relu"), layers.Dropout(0.2),
                          layers.Dense(10, activation="softmax")], name="digits_mlp")
model.summary()
model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, epochs=args.epochs, batch_size=64, validation_split=0.2)
print("test loss, accuracy:", model.evaluate(x[-300:], y[-300:], verbose=0))
model.save(args.out)
print(f"saved {args.out}; reloaded predicts the same:",
      np.allclose(keras.load_model(args.out).predict(x[:8], verbose=0), model.predict(x[:8], verbose=0)))
