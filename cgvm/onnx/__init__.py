"""``import cgvm.onnx``: the ONNX frontend (load, export, backend) under a short name."""
import sys as _sys

from ..frontends import onnx as _impl
from ..frontends.onnx import *  # noqa: F401,F403
from ..frontends.onnx import MAX_OPSET, OnnxModel, export, load, supported_ops  # noqa: F401


def __getattr__(name):
    if name == "backend":  # imported on first use: it needs onnx.backend, heavier than onnx itself
        from ..frontends.onnx import backend as _backend

        _sys.modules[f"{__name__}.backend"] = _backend
        return _backend
    raise AttributeError(name)
