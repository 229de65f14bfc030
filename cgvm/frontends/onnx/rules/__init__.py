"""The translation rules, one per ONNX op, in small tables by family (importing registers them)."""
from . import (activations, control, elementwise, indexing, losses, nn, normalization, reduce, resize,  # noqa: F401
               quantize, rnn, sequence, tensor)
from . import signal, vision  # noqa: F401,E402  (DFT, STFT, windows, MelWeightMatrix; GridSample, NonMaxSuppression, ...)
