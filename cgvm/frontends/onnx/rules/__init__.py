"""The translation rules, one per ONNX op, in small tables by family (importing registers them)."""
from . import elementwise, activations, tensor, indexing, reduce, nn, normalization, rnn, control, losses  # noqa: F401
