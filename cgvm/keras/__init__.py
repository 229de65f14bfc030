"""``import cgvm.keras as keras``: the Keras-style frontend under Keras' own module names."""
import sys as _sys

from ..frontends import keras as _impl
from ..frontends.keras import *  # noqa: F401,F403
from ..frontends.keras import (activations, backend, callbacks, constraints, distribution, initializers, layers,
                               losses, metrics, models, ops, optimizers, regularizers, saving)
from ..frontends.keras.initializers import set_random_seed as _set_random_seed
from ..frontends.keras.serialization import register_keras_serializable


class utils:  # noqa: N801 - Keras' module name
    set_random_seed = staticmethod(_set_random_seed)
    register_keras_serializable = staticmethod(register_keras_serializable)


for _name in ("activations", "backend", "callbacks", "constraints", "distribution", "initializers", "layers",
              "losses", "metrics", "models", "ops", "optimizers", "regularizers", "saving"):
    _sys.modules[f"{__name__}.{_name}"] = getattr(_impl, _name)

saving.register_keras_serializable = register_keras_serializable
models.load_model = saving.load_model
models.model_from_json = saving.model_from_json
