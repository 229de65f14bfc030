"""``theano.tensor.signal``: pooling."""
from . import pool  # noqa: F401
