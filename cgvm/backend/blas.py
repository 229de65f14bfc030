"""Accumulating matrix products through NumPy's own BLAS: ``c = alpha * a @ b + beta * c``, in place.

NumPy's matmul writes a product but cannot add it to what its output already holds, so an
update such as ``w - lr * x.T @ g`` costs a product into a temporary and then a pass that reads
the temporary and ``w`` again. BLAS gemm scales and adds while it writes each block of the
product (Theano's ``gemm_inplace``).

NumPy does not expose gemm, so its CBLAS ``sgemm``/``dgemm`` is called here through ctypes, in
the very library NumPy's matmul uses (found with threadpoolctl). Another BLAS, such as
SciPy's, would bring a second thread pool: with two threads each, one library's spinning
workers starved the other's and an MLP step took 10.8 ms instead of 3.6 ms.

Integers are passed as 64-bit: on x86-64 and AArch64 an integer argument fills a whole
register or 8-byte stack slot, so LP64 and ILP64 libraries both read the right value. The
binding is checked once on a small product before use. ``accumulate_product`` returns False
where it cannot help (library not found, CuPy arrays, other dtypes, tiny or empty matrices),
and the caller computes the same thing with matmul and ufuncs.
"""
from __future__ import annotations

import ctypes
import os
from typing import Any, Callable, Dict, Optional

import numpy as np

#: products with fewer multiply-adds go through matmul: the ctypes call costs a few microseconds
MIN_MULTIPLY_ADDS = 1 << 16

_SYMBOLS = ("scipy_cblas_{}gemm64_", "cblas_{}gemm64_", "cblas_{}gemm")   # NumPy's wheels, suffixed ILP64, plain
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_routines: Optional[Dict[np.dtype, Callable]] = None


def _numpy_blas_path() -> Optional[str]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    paths = [lib["filepath"] for lib in threadpool_info() if lib.get("user_api") == "blas"]
    numpy_root = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))
    own = [p for p in paths if os.path.basename(os.path.dirname(p)).startswith("numpy")
           and os.path.dirname(os.path.dirname(p)) == numpy_root]
    if len(own) == 1:
        return own[0]
    return paths[0] if len(paths) == 1 else None   # a system or conda BLAS, when it is the only one


def _bind(lib: ctypes.CDLL, kind: str, scalar: Any) -> Optional[Callable]:
    for pattern in _SYMBOLS:
        fn = getattr(lib, pattern.format(kind), None)
        if fn is not None:
            i64, ptr = ctypes.c_int64, ctypes.c_void_p
            fn.argtypes = [i64, i64, i64, i64, i64, i64, scalar, ptr, i64, ptr, i64, scalar, ptr, i64]
            fn.restype = None
            return fn
    return None


def _load() -> Dict[np.dtype, Callable]:
    path = _numpy_blas_path()
    if path is None:
        return {}
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return {}
    routines = {}
    for dtype, kind, scalar in ((np.float32, "s", ctypes.c_float), (np.float64, "d", ctypes.c_double)):
        fn = _bind(lib, kind, scalar)
        if fn is not None and _works(fn, np.dtype(dtype)):
            routines[np.dtype(dtype)] = fn
    return routines


def _gemm(fn: Callable, alpha: float, a: np.ndarray, b: np.ndarray, beta: float, c: np.ndarray) -> None:
    """Row-major CBLAS gemm into C-contiguous ``c``; ``a``, ``b`` C- or Fortran-contiguous."""
    (m, k), n = a.shape, b.shape[1]
    # leading dimensions from the shapes: NumPy lets a length-1 axis have any stride
    ta, lda = (_NO_TRANS, k) if a.flags.c_contiguous else (_TRANS, m)
    tb, ldb = (_NO_TRANS, n) if b.flags.c_contiguous else (_TRANS, k)
    fn(_ROW_MAJOR, ta, tb, m, n, k, alpha, a.ctypes.data, max(lda, 1), b.ctypes.data, max(ldb, 1), beta,
       c.ctypes.data, max(n, 1))


def _works(fn: Callable, dtype: np.dtype) -> bool:
    """One small product with both transposes and beta, against matmul."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 3)).astype(dtype)
    b = np.asfortranarray(rng.standard_normal((3, 4)).astype(dtype))
    c = rng.standard_normal((5, 4)).astype(dtype)
    want = 0.5 * (a @ b) - 2.0 * c
    _gemm(fn, 0.5, a, b, -2.0, c)
    return bool(np.allclose(c, want, rtol=1e-4, atol=1e-5))


def available() -> bool:
    """Whether accumulating products run through BLAS here."""
    global _routines
    if _routines is None:
        _routines = _load()
    return bool(_routines)


def accumulate_product(alpha: float, a: Any, b: Any, beta: float, c: Any) -> bool:
    """``c[...] = alpha * a @ b + beta * c`` for matrices, in place by BLAS gemm; False if not done.

    ``c`` must be C-contiguous; ``a`` and ``b`` of ``c``'s dtype and not overlapping it.
    Operands that are neither C- nor Fortran-contiguous are copied once.
    """
    if not (type(c) is np.ndarray and type(a) is np.ndarray and type(b) is np.ndarray):
        return False
    if c.ndim != 2 or a.ndim != 2 or c.size == 0 or c.size * a.shape[1] < MIN_MULTIPLY_ADDS:
        return False
    if not available():
        return False
    fn = _routines.get(c.dtype)
    if fn is None or a.dtype != c.dtype or b.dtype != c.dtype or not c.flags.c_contiguous or not c.flags.writeable:
        return False
    if not (a.flags.c_contiguous or a.flags.f_contiguous):
        a = np.ascontiguousarray(a)
    if not (b.flags.c_contiguous or b.flags.f_contiguous):
        b = np.ascontiguousarray(b)
    _gemm(fn, alpha, a, b, beta, c)
    return True
