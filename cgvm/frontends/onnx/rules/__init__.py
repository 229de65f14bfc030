"""The translation rules, one per ONNX op, in small tables by family (importing registers them)."""
from . import (activations, control, elementwise, indexing, losses, nn, normalization, reduce, resize,  # noqa: F401
               quantize, rnn, sequence, tensor)
from . import attention, random, training  # noqa: F401  (FlexAttention; random ops; preview.training's optimizers)
