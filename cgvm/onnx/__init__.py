"""``import cgvm.onnx``: the ONNX frontend (load, export, backend) under a short name."""
from ..frontends.onnx import *  # noqa: F401,F403
from ..frontends.onnx import MAX_OPSET, OnnxModel, export, load, supported_ops  # noqa: F401

