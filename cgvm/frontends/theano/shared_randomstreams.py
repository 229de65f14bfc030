"""``theano.tensor.shared_randomstreams``: RandomStreams with its state in the Workspace."""
from .random import RandomStreams  # noqa: F401
