"""Caffe's multi-solver training on MPI ranks: the solver side of ``mpiexec -n N cgvm train``.

As in Caffe's multi-GPU training (``caffe train -gpu 0,1``; python/train.py with ``caffe.NCCL``),
each of the N solvers runs the net's batch on its share of the global batch (data_shard.py),
and the gradients are averaged over the solvers inside the compiled step (cgvm.distributed:
bucketed non-blocking allreduces started as backward makes each bucket, waited for before the
update; the bucket size is ``CGVM_BUCKET_BYTES``). So N ranks of batch b train the model one
process of batch N*b trains. Rank 0 (Caffe's root solver) alone logs, tests and snapshots;
weights and histories are broadcast from it before the first step, so every rank starts from
the same model (restored or freshly filled) and, updating it with the same averaged gradients,
holds the same weights after every step.

pycaffe's ``NCCL(solver, uid)`` / ``bcast()`` / ``new_uid()`` and ``has_nccl()`` are here too:
under MPI the "unique id" is not needed (mpiexec is the rendezvous) and ``NCCL`` wraps the
same machinery; on the GPU backend device gradients go through NCCL (cgvm.distributed.nccl).
"""
from __future__ import annotations

from typing import Any, List, Tuple

import numpy as np

from cgvm.frontends.caffe import data_shard
from cgvm.frontends.caffe.errors import CaffeError


def group() -> Any:
    """The MPI process group matching solver_count/solver_rank, or a clear error."""
    count, rank = data_shard.solver_count(), data_shard.solver_rank()
    import cgvm.distributed as dist

    from cgvm.frontends.caffe.pycaffe import _mode

    try:
        g = dist.init(require=count > 1, device="gpu" if _mode["backend"] == "cupy" else None)
    except Exception as e:   # no launcher, or mpi4py missing: say how to launch / install
        raise CaffeError(f"solver_count is {count}: multi-solver training runs one process per solver under MPI "
                         f"(`mpiexec -n {count} ...`); {e}") from None
    if count > 1 and (g.size != count or g.rank != rank):
        raise CaffeError(f"solver_count {count} / solver_rank {rank} do not match this MPI run (rank {g.rank} of "
                         f"{g.size}); launch with `mpiexec -n {count} ...` and give each process its rank")
    return g


def join_mpi_run() -> bool:
    """Under an MPI launcher with several ranks, become solver ``rank`` of ``size`` (what the CLI does
    before building the solver); True on the root solver."""
    import cgvm.distributed as dist

    found = dist.launcher_environment()
    if found is not None and found["size"] > 1:
        g = dist.init(require=True)
        data_shard.set_solver_count(g.size)
        data_shard.set_solver_rank(g.rank)
        data_shard.set_multiprocess(True)
    return is_root()


def is_parallel() -> bool:
    return data_shard.solver_count() > 1


def is_root() -> bool:
    return data_shard.solver_rank() == 0


def shared_seed(seed: Any) -> Any:
    """With several solvers and no random_seed, one seed drawn on rank 0 for all (the ranks must read
    and shuffle the data alike); else ``seed`` unchanged."""
    if not is_parallel() or seed is not None:
        return seed
    g = group()
    mine = np.array([np.random.SeedSequence().generate_state(1)[0] & 0x7FFFFFFF], np.int64)
    return int(g.broadcast(mine, 0)[0])


def reduce_entries(solver: Any, entries: List[Tuple[Any, Any, Any, Any]]) -> List[Tuple[Any, Any, Any, Any]]:
    """(param, weight, gradient, histories) with each gradient replaced by its mean over the solvers."""
    if not is_parallel():
        return entries
    import cgvm.distributed as dist

    net = solver.net
    shapes = [(info.name, [list(s) for s in info.data.top_shapes()]) for info in net.layer_infos
              if info.data is not None and hasattr(info.data, "top_shapes")]
    signature = {"solver": solver.type_name, "iter_size": int(solver.param.iter_size), "data": shapes}
    # layer_wise_reduce: false is Caffe's one reduction after the whole backward pass: one bucket
    one_bucket = None if solver.param.layer_wise_reduce else 1 << 62
    grads = dist.reduce_gradients([g for _, _, g, _ in entries], names=[p.name for p, _, _, _ in entries],
                                  group=group(), signature=signature, bucket_bytes=one_bucket)
    return [(p, w, g, h) for (p, w, _, h), g in zip(entries, grads)]


def broadcast_state(solver: Any) -> None:
    """Rank 0's weights and solver histories on every rank (before the first step, after a restore)."""
    if not is_parallel():
        return
    import cgvm.distributed as dist

    names = [p.name for p in solver.net.learnable_params]
    names += [e for p in solver.net.learnable_params for e in solver._histories[p.name]]
    dist.broadcast_parameters(solver.workspace, list(dict.fromkeys(names)), group=group())


def has_nccl() -> bool:
    """Whether device gradients can be reduced with NCCL here (CuPy with its NCCL bindings)."""
    try:
        from cupy.cuda import nccl
    except Exception:
        return False
    return bool(getattr(nccl, "available", True))   # a CuPy built without NCCL says so here


class NCCL:
    """pycaffe's ``caffe.NCCL(solver, uid)``: makes ``solver`` one of ``solver_count`` data-parallel solvers.

    ``bcast()`` sends rank 0's weights to every solver; ``solver.add_callback(nccl)`` and
    ``solver.net.after_backward(nccl)`` are accepted as in Caffe's python/train.py (the reduction
    itself is compiled into the solver's step: layer by layer as backward makes the gradients,
    or in one bucket after it with ``layer_wise_reduce: false``).
    """

    def __init__(self, solver: Any, uid: Any = None):
        self.solver = solver
        self.uid = uid
        g = group()
        if g.size > 1 and not (getattr(solver, "_solver_count", 1) == g.size):
            raise CaffeError(f"caffe.NCCL: this is rank {g.rank} of {g.size}, but the solver was built for "
                             f"{getattr(solver, '_solver_count', 1)} solver(s); call caffe.set_solver_count({g.size}) "
                             f"and caffe.set_solver_rank({g.rank}) before creating the solver (as Caffe's "
                             "python/train.py does), so that its data layers read this rank's share")
        if solver._step_fn is not None:         # compiled before: compile again with the reduction
            solver._step_fn = None

    @staticmethod
    def new_uid() -> str:
        """A token for pycaffe's signature; under MPI the ranks meet through mpiexec instead."""
        return "mpi"

    def bcast(self) -> None:
        broadcast_state(self.solver)

    # Caffe's callback interface: the work is in the compiled step, so these do nothing more
    def on_start(self) -> None:
        return None

    def on_gradients_ready(self) -> None:
        return None

    def run(self, layer: int = -1) -> None:
        return None
