"""Generated Python: the one helper through which cgvm writes and runs Python source.

The VM lowers each frame to a generated function (cgvm.vm.threaded), a compiled function gets a
call path made for its arity (cgvm.compiled_function), scan a loop for its arity (cgvm.ops.control), a
fused elementwise chain its own kernel (cgvm.ops.fused). Each builds source lines and calls
``define``; the function keeps its source as ``__cgvm_source__`` for reading and debugging, and
tracebacks name it by ``origin``. Imports nothing of cgvm, so every layer may use it.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Sequence


def define(name: str, lines: Sequence[str], env: Dict[str, Any], origin: str) -> Callable:
    """The function ``name`` defined by source ``lines`` (line 1 is line 1 of the source) with
    globals ``env``; tracebacks show ``<cgvm ORIGIN>`` as its file."""
    source = "\n".join(lines)
    exec(compile(source, f"<cgvm {origin}>", "exec"), env)
    fn = env[name]
    try:
        fn.__cgvm_source__ = source
    except AttributeError:   # a callable that takes no attributes (not a plain function)
        pass
    return fn
