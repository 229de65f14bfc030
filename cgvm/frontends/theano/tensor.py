"""``theano.tensor`` (``T``): variable constructors and the tensor functions, in one namespace.

Constructors take ``(name=None, dtype=None)``; an unprefixed constructor uses ``config.floatX``
(float64 unless set, as in Theano). Prefixes: b int8, w int16, i int32, l int64, f float32, d float64.
``row``/``col`` have a broadcastable (length-1) first/second axis. Plural helpers split a string
into one variable per character (``dmatrices('xy')``) or make N anonymous ones.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

from ...errors import DTypeError
from . import nnet  # noqa: F401  (T.nnet)
from . import sorting as _sorting
from .basic import (abs, abs_, add, all, allclose, and_, any, arccos, arccosh, arcsin, arcsinh,  # noqa: F401
                    arctan, arctan2, arctanh, argmax, argmin, bitwise_and, bitwise_not, bitwise_or, bitwise_xor,
                    cast, ceil, clip, cos, cosh, cumsum, digamma, eq, erf, erfc, erfinv, exp, exp2, expm1, floor,
                    floor_div, gamma, gammaln, ge, gt, int_div, inv, invert, iround, isclose, isinf, isnan,
                    largest, le, log, log1p, log2, log10, logsumexp, lt, max, max_and_argmax, maximum, mean, min,
                    minimum, mod, mul, neg, neq, norm, or_, polygamma, pow, prod, psi, reciprocal, round, sgn,
                    sigmoid, sign, sin, sinh, smallest, softplus, sqr, sqrt, square, std, sub, sum, switch, tan,
                    tanh, tensor_copy, tri_gamma, true_div, trunc, var, where, xor)
from .shapes import (addbroadcast, alloc, arange, batched_dot, batched_tensordot, concatenate,  # noqa: F401
                     cumprod, diagonal, dimshuffle, dot, eye, fill, flatten, horizontal_stack, identity_like, join,
                     ones, ones_like, outer, patternbroadcast, repeat, reshape, second, shape, shape_padaxis,
                     shape_padleft, shape_padright, size, specify_shape, split, squeeze, stack, swapaxes,
                     tensordot, tile, trace, transpose, unbroadcast, vertical_stack, zeros, zeros_like)
from .subtensor import inc_subtensor, set_subtensor, take  # noqa: F401
from .var import DTYPE_PREFIX, TensorConstant, TensorType, TensorVariable, as_tensor_variable, constant  # noqa: F401
from .var import float_x as _float_x

sort = _sorting.sort
argsort = _sorting.argsort
as_tensor = as_tensor_variable
extra_ops = None  # replaced below by the module object
nlinalg = None

_RANK_SHAPES = {
    "scalar": (), "vector": (None,), "row": (1, None), "col": (None, 1), "matrix": (None, None),
    "tensor3": (None,) * 3, "tensor4": (None,) * 4, "tensor5": (None,) * 5, "tensor6": (None,) * 6,
    "tensor7": (None,) * 7,
}


def tensor(*args: Any, dtype: Any = None, broadcastable: Optional[Sequence[bool]] = None,
           name: Optional[str] = None, shape: Optional[Sequence[Optional[int]]] = None) -> TensorVariable:
    """``T.tensor(dtype, broadcastable)`` (Theano) or ``tensor(name, dtype=, shape=)`` (PyTensor)."""
    if args and dtype is not None:  # PyTensor: the positional argument is the name
        name, args = args[0], args[1:]
    positional = dict(zip(("dtype", "broadcastable", "name", "shape"), args))
    dtype = positional.get("dtype", dtype)
    broadcastable = positional.get("broadcastable", broadcastable)
    name = positional.get("name", name)
    shape = positional.get("shape", shape)
    if isinstance(dtype, str) and dtype not in ("floatX",) and broadcastable is None and shape is not None:
        try:
            TensorType(dtype, shape=())
        except Exception:  # PyTensor order: the first argument is the name
            name, dtype = dtype, None
    if shape is None and broadcastable is None:
        shape = ()
    return TensorType(dtype, broadcastable=broadcastable, shape=shape)(name)


def _constructor(kind: str, dtype_fixed: Optional[str]):
    dims = _RANK_SHAPES[kind]

    def make(name: Optional[str] = None, dtype: Any = None, shape: Optional[Sequence[Optional[int]]] = None):
        dt = dtype_fixed or dtype or _float_x()
        return TensorType(dt, shape=dims if shape is None else shape)(name)
    make.__name__ = (dtype_fixed and _PREFIX_OF[dtype_fixed] or "") + kind
    make.__doc__ = f"A symbolic {kind} of dtype {dtype_fixed or 'floatX (or dtype=)'}."
    return make


_PREFIX_OF = {v: k for k, v in DTYPE_PREFIX.items()}


def _plural(single):
    def make(*names: Union[str, int], dtype: Any = None) -> List[TensorVariable]:
        if len(names) == 1 and isinstance(names[0], int):
            return [single(dtype=dtype) if "dtype" in single.__code__.co_varnames else single()
                    for _ in range(names[0])]
        if len(names) == 1 and isinstance(names[0], str):
            chars = names[0]
            parts = chars.split(",") if "," in chars else list(chars)
        else:
            parts = list(names)
        return [single(p.strip(), dtype=dtype) for p in parts]
    return make


_namespace = globals()
for _kind in _RANK_SHAPES:
    _namespace[_kind] = _constructor(_kind, None)
    _namespace[_kind + "s"] = _plural(_namespace[_kind])
    for _prefix, _dt in DTYPE_PREFIX.items():
        _namespace[_prefix + _kind] = _constructor(_kind, _dt)
        _namespace[_prefix + _kind + "s"] = _plural(_namespace[_prefix + _kind])


def _complex_constructor(kind: str, prefix: str):
    def make(*args: Any, **kwargs: Any) -> TensorVariable:
        dt = "complex64" if prefix == "c" else "complex128"
        raise DTypeError(f"T.{prefix}{kind}: complex dtypes ({dt}) are not supported by cgvm; split the real "
                         "and imaginary parts into two real tensors")
    make.__name__ = prefix + kind
    return make


for _kind in _RANK_SHAPES:
    for _prefix in "cz":
        _namespace[_prefix + _kind] = _complex_constructor(_kind, _prefix)
        _namespace[_prefix + _kind + "s"] = _namespace[_prefix + _kind]
_namespace["matrices"] = _namespace["matrixs"]
for _prefix in DTYPE_PREFIX:
    _namespace[_prefix + "matrices"] = _namespace[_prefix + "matrixs"]
_namespace["cmatrices"], _namespace["zmatrices"] = _namespace["cmatrix"], _namespace["zmatrix"]
del _kind, _prefix, _dt


# Theano's sub-namespaces that scripts reach through T
from . import extra_ops  # noqa: E402,F811
from . import xlogx  # noqa: E402,F401
from . import nlinalg  # noqa: E402,F811
from .gradient import grad, jacobian, hessian, Rop, Lop  # noqa: E402,F401
from . import shared_randomstreams  # noqa: E402,F401
from .random import RandomStreams  # noqa: E402,F401

# T.signal.pool.pool_2d, T.nnet.conv2d ...
from . import signal  # noqa: E402,F401
