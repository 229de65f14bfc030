"""Keras-style frontend: layers, Sequential / functional / subclassed models, training, .keras/.h5 files.

    import cgvm.keras as keras
    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, epochs=5)

Layers accept and return symbolic tensors that expose ``__cgvm_value__()``, so they compose with
cgvm Values and the other frontends' variables in one graph.
"""
from . import (activations, backend, callbacks, constraints, distribution, initializers, layers, losses, metrics, ops,
               optimizers, regularizers)
from .backend import KerasTensor, Variable
from .layers import Input, InputLayer, Layer
from .models import Functional, Model, Sequential, clone_model
from .saving import load_model, model_from_json

__all__ = ["activations", "backend", "callbacks", "constraints", "distribution", "initializers", "layers", "losses", "metrics", "ops",
           "optimizers", "regularizers", "KerasTensor", "Variable", "Input", "InputLayer", "Layer", "Functional",
           "Model", "Sequential", "clone_model", "load_model", "model_from_json"]
