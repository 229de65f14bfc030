"""Data-parallel training over MPI (mpi4py) and, for CuPy buffers, NCCL: ``pip install 'cgvm[mpi]'``.

    mpiexec -n 4 python train.py            # or: srun -n 4 python train.py (Slurm)

    import cgvm.distributed as dist
    dist.init()                              # size 1 without a launcher; no MPI needed then
    dist.rank(), dist.size(), dist.local_rank()
    dist.allreduce(array, "mean"); dist.broadcast(array, root=0); dist.allgather(array); dist.barrier()
    grads = dist.reduce_gradients(cgvm.autodiff.grad(loss, params))   # collectives in the graph
    dist.broadcast_parameters(workspace)

Frontends use the same pieces: the Caffe solver under ``mpiexec``, Keras' ``DataParallel``
distribution, Theano-style ``dist.reduce_gradients`` on ``T.grad``'s result. See docs/distributed.md.
"""
from __future__ import annotations

from typing import Any

from .gradients import (DEFAULT_BUCKET_BYTES, broadcast_parameters, check_same_everywhere, data_parallel_grad,
                        insert_reductions, plan_buckets, reduce_gradients, shard_rows)
from .world import INSTALL_HINT, exit_code, fail, group, init, is_distributed, launcher_environment

__all__ = ["init", "group", "rank", "size", "local_rank", "is_distributed", "allreduce", "broadcast", "allgather",
           "barrier", "reduce_gradients", "broadcast_parameters", "data_parallel_grad", "shard_rows",
           "check_same_everywhere", "plan_buckets", "insert_reductions", "DEFAULT_BUCKET_BYTES", "INSTALL_HINT",
           "fail", "exit_code", "launcher_environment"]


def rank() -> int:
    """This process's rank (0 without a launcher)."""
    return group().rank


def size() -> int:
    """The number of ranks (1 without a launcher)."""
    return group().size


def local_rank() -> int:
    """This process's rank among those on its host (picks its GPU)."""
    return group().local_rank


def _data(array: Any) -> Any:
    """A Workspace entry or DLPack Tensor as the array it wraps (no copy)."""
    inner = getattr(array, "array", None)
    return inner if inner is not None and not hasattr(array, "__array_interface__") else array


def allreduce(array: Any, op: str = "sum") -> Any:
    """``array`` reduced over the ranks in place (``op``: sum, mean, max, min); returns it."""
    return group().allreduce(_data(array), op)


def broadcast(array: Any, root: int = 0) -> Any:
    """Rank ``root``'s ``array`` copied into ``array`` on every rank, in place; returns it."""
    return group().broadcast(_data(array), root)


def allgather(array: Any) -> Any:
    """Every rank's ``array``, stacked along a new first axis in rank order."""
    return group().allgather(_data(array))


def barrier() -> None:
    """Wait until every rank gets here."""
    group().barrier()
