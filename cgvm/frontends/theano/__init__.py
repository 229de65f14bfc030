"""Theano-style frontend: Theano scripts run on cgvm with only the import changed.

    import cgvm.theano as theano
    import cgvm.theano.tensor as T

Symbolic variables record cgvm IR through operator overloading; ``function`` compiles with
cgvm's passes and VM; ``shared`` variables live in the Workspace; ``grad``, ``scan``,
``ifelse``, ``nnet`` and random streams follow Theano 1.0 / PyTensor semantics (see
``shared/reference/theano_api.md``); ``config.floatX`` defaults to ``'float64'`` as in Theano.
"""
from ...errors import MissingInputError, UnusedInputError  # noqa: F401
from . import gradient, ifelse as _ifelse_module, printing, scalar, scan_module, tensor  # noqa: F401
from .config import change_flags, config  # noqa: F401
from .function import Function, In, Mode, Out, function  # noqa: F401
from .gradient import Lop, Rop, grad, hessian, jacobian  # noqa: F401
from .ifelse import ifelse  # noqa: F401
from .printing import debugprint, dprint, pp, pprint  # noqa: F401
from .scan_module import foldl, foldr, map, reduce, scan  # noqa: F401
from .shared import SharedVariable, shared, shared_from_workspace  # noqa: F401
from .var import TensorType, TensorVariable  # noqa: F401

def clone(output, replace=None, strict=True, share_inputs=True):
    """A copy of ``output``'s graph with the variables in ``replace`` swapped (the original is untouched)."""
    from ...ir.builder import rebuild
    from .var import as_tensor_variable, wrap

    single = not isinstance(output, (list, tuple))
    outs = [as_tensor_variable(o).value for o in ([output] if single else output)]
    pairs = list(replace.items()) if isinstance(replace, dict) else list(replace or [])
    new = rebuild(outs, {id(as_tensor_variable(a).value): as_tensor_variable(b).value for a, b in pairs})
    res = [wrap(v) for v in new]
    return res[0] if single else res


__version__ = "1.0.5-cgvm"
