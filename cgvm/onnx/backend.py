"""``cgvm.onnx.backend``: cgvm as an onnx.backend.base backend (prepare, run_model, run_node, supports_device)."""
from ..frontends.onnx.backend import *  # noqa: F401,F403
from ..frontends.onnx.backend import (CgvmBackend, CgvmRep, is_compatible, prepare, run_model,  # noqa: F401
                                      run_node, supports_device)
