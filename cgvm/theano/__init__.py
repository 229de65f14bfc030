"""``import cgvm.theano as theano``: Theano's module layout over cgvm's Theano-style frontend.

The modules Theano scripts import (``theano.tensor``, ``theano.tensor.nnet``,
``theano.tensor.signal.pool``, ``theano.tensor.shared_randomstreams``, ``theano.ifelse``,
``theano.printing``, ``theano.gradient``, ``theano.scan_module``, ``theano.sandbox.rng_mrg``
...) are registered here as aliases of ``cgvm.frontends.theano``'s modules, so that
``import cgvm.theano.tensor as T`` and ``from cgvm.theano.ifelse import ifelse`` work.
"""
import sys
import types

from ..frontends import theano as _impl
from ..frontends.theano import *  # noqa: F401,F403
from ..frontends.theano import (In, Lop, Mode, Out, Rop, clone, config, debugprint, dprint,  # noqa: F401
                                foldl, foldr, function, grad, ifelse as _ifelse_fn, map, pp, pprint, reduce,
                                scan, shared, change_flags)
from ..frontends.theano import (extra_ops, gradient, nlinalg, nnet, printing, random, scalar,  # noqa: F401
                                scan_module, shared_randomstreams, signal, tensor)
from ..frontends.theano import ifelse as _ifelse_module_attr  # noqa: F401
from ..frontends.theano.signal import pool as _pool

_ifelse_module = sys.modules["cgvm.frontends.theano.ifelse"]


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


_rng_mrg = _module(__name__ + ".sandbox.rng_mrg", MRG_RandomStreams=random.MRG_RandomStreams)
_sandbox = _module(__name__ + ".sandbox", rng_mrg=_rng_mrg)
_function_module = sys.modules["cgvm.frontends.theano.function"]
_compile = _module(__name__ + ".compile", function=function, In=In, Out=Out, Mode=Mode, shared=shared,
                   function_module=_function_module, SharedVariable=_impl.SharedVariable,
                   MissingInputError=_impl.MissingInputError, UnusedInputError=_impl.UnusedInputError)

_ALIASES = {
    "tensor": tensor, "tensor.nnet": nnet, "tensor.nnet.nnet": nnet, "tensor.nnet.conv": nnet,
    "tensor.nnet.bn": nnet.bn, "tensor.signal": signal, "tensor.signal.pool": _pool,
    "tensor.shared_randomstreams": shared_randomstreams, "tensor.extra_ops": extra_ops,
    "tensor.nlinalg": nlinalg, "ifelse": _ifelse_module, "printing": printing, "gradient": gradient,
    "scan_module": scan_module, "scan": scan_module, "sandbox": _sandbox, "sandbox.rng_mrg": _rng_mrg,
    "compile": _compile, "compile.function_module": _function_module, "scalar": scalar,
    "tensor.xlogx": tensor.xlogx,
}
for _name, _mod in _ALIASES.items():
    sys.modules[f"{__name__}.{_name}"] = _mod

ifelse = _ifelse_module  # ``theano.ifelse`` is the module; ``from theano.ifelse import ifelse`` the function
sandbox = _sandbox
compile = _compile
__version__ = _impl.__version__
