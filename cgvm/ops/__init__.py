"""The op library: every op declared once (type rule, kernel, gradient, pattern, in-place) by family."""
from . import (control, conv, creation, elementwise, indexing, linalg, loss, nn,  # noqa: F401  (registers ops)
               join, pool, reduce, selection, shape)
from . import grad_control, random, sorting  # noqa: F401  (ops the Theano frontend needs)
from . import fused  # noqa: F401  (ops the fusion passes produce)
from . import detection  # noqa: F401  (SSD's DetectionOutput, for the Caffe frontend's fork layers)
from . import tensor_math  # noqa: F401  (ops the ONNX frontend needs: bit_shift, cumprod, einsum, det)
from . import sampling  # noqa: F401  (grid_sample: ONNX GridSample, PyTorch grid_sample)
from . import spectral  # noqa: F401  (dft: ONNX DFT and STFT, numpy.fft)
from . import image  # noqa: F401  (decode_image: ONNX ImageDecoder, with Pillow)
from . import text  # noqa: F401  (tfidf_vectorize: ONNX TfIdfVectorizer on integer tokens)
from . import roi  # noqa: F401  (roi_align: ONNX RoiAlign)
from .registry import BROADCAST, ELEMWISE, INJECTIVE, OPAQUE, REDUCE, OpDef, all_ops, defop, lookup

# The kernel libraries moved to cgvm.ops.kernels, and the BLAS binding to cgvm.backend.blas; their
# old module names stay importable for one release (other branches and user code may use them).
import sys as _sys

from ..backend import blas as _blas
from .kernels import conv_batchlast as _cb, conv_im2col as _ci, conv_winograd as _cw, pool_tiled as _pt
from .kernels import pool_windows as _pw, scratch as _sc

for _old, _module in {"conv_batchlast": _cb, "conv_im2col": _ci, "conv_winograd": _cw, "pool_tiled": _pt,
                      "pool_windows": _pw, "scratch": _sc, "blas": _blas}.items():
    _sys.modules[f"{__name__}.{_old}"] = _module
    globals()[_old] = _module
del _old, _module
