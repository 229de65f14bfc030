"""The translation rules, one per ONNX op, in small tables by family (importing registers them)."""
from . import (activations, attention, control, elementwise, indexing, losses, nn, normalization,  # noqa: F401
               quantize, random, reduce, resize, rnn, sequence, signal, tensor, training, vision)
