"""A Keras-style MLP on scikit-learn's digits, trained by cgvm: ``python examples/keras/mnist_mlp.py``."""
import numpy as np
from sklearn.datasets import load_digits

import cgvm.keras as keras
from cgvm.keras import layers

digits = load_digits()
x = (digits.data / 16.0).astype(np.float32)
y = digits.target.astype(np.int64)
model = keras.Sequential([keras.Input((64,)), layers.Dense(64, activation="relu"), layers.Dropout(0.2),
                          layers.Dense(10, activation="softmax")], name="digits_mlp")
model.summary()
model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, epochs=5, batch_size=64, validation_split=0.2)
print("test loss, accuracy:", model.evaluate(x[-300:], y[-300:], verbose=0))
model.save("digits_mlp.keras")  # under the working directory
print("reloaded predicts the same:",
      np.allclose(keras.load_model("digits_mlp.keras").predict(x[:8], verbose=0), model.predict(x[:8], verbose=0)))
