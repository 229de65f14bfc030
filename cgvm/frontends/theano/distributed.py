"""Data-parallel Theano-style training: gradients averaged over the MPI ranks inside the function.

    import cgvm.theano as theano, cgvm.theano.tensor as T
    from cgvm.frontends.theano.distributed import data_parallel_grad, broadcast_shared

    grads = data_parallel_grad(cost, params)           # T.grad, then the mean over the ranks
    train = theano.function([x, y], cost, updates=[(p, p - lr * g) for p, g in zip(params, grads)])
    broadcast_shared(params)                            # rank 0's initial values everywhere

Under ``mpiexec -n N`` each rank calls ``train`` on its share of the global batch
(``cgvm.distributed.shard_rows``); N ranks of batch b then train as one process of batch N*b
(for costs that are means over the batch). With one process nothing changes.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

from ... import distributed as _dist
from .gradient import grad
from .var import as_tensor_variable, wrap


def reduce_gradients(grads: Sequence[Any], **options: Any) -> List[Optional[Any]]:
    """Theano variables ``grads`` averaged over the ranks (cgvm.distributed.reduce_gradients options)."""
    values = [None if g is None else as_tensor_variable(g).value for g in grads]
    reduced = _dist.reduce_gradients(values, **options)
    return [None if r is None else wrap(r) for r in reduced]


def data_parallel_grad(cost: Any, wrt: Sequence[Any], **options: Any) -> List[Optional[Any]]:
    """``T.grad(cost, wrt)`` averaged over the ranks."""
    grads = grad(cost, list(wrt))
    names = [getattr(w, "name", None) or f"wrt {i}" for i, w in enumerate(wrt)]
    return reduce_gradients(grads, names=names, **options)


def broadcast_shared(variables: Sequence[Any], root: int = 0) -> None:
    """Rank ``root``'s values of the shared variables on every rank (in place in their workspace)."""
    groups: dict = {}
    for v in variables:
        groups.setdefault(id(v.workspace), (v.workspace, []))[1].append(v.key)
    for workspace, names in groups.values():
        _dist.broadcast_parameters(workspace, names, root=root)
