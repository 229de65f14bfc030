"""``cgvm.compile``: graph -> passes -> bytecode -> an Executable over a Workspace.

    f = cgvm.compile([x], [y], updates={w: w - lr * gw})
    y_value = f(x_value)

The compiled function itself, ``Function``, and the runtime that compiles scan bodies and cond
branches, ``SubgraphRuntime``, live in cgvm.compiled_function; they are re-exported here so that
``from cgvm.compiled import Function`` keeps working.
"""
from __future__ import annotations

from typing import Any, Sequence, Union

from .compiled_function import Function, SubgraphRuntime
from .ir.graph import Value


def compile(inputs: Sequence[Value], outputs: Union[Value, Sequence[Value]], **kwargs: Any) -> Function:
    """Compile ``outputs`` as a function of ``inputs``; parameters are read from the workspace."""
    return Function(inputs, outputs, **kwargs)


__all__ = ["compile", "Function", "SubgraphRuntime"]
