"""Data parallelism in the graph: gradients averaged over the ranks in buckets, weights from rank 0.

    grads = cgvm.autodiff.grad(loss, params)
    grads = cgvm.distributed.reduce_gradients(grads)           # the mean over the ranks
    step = cgvm.compile([x, y], loss, updates={p: p - lr * g for p, g in zip(params, grads)})
    cgvm.distributed.broadcast_parameters(workspace)           # rank 0's weights everywhere

Gradients are packed, last layer first (the order backward makes them), into buckets of at
least ``bucket_bytes`` (Horovod's tensor fusion; ``CGVM_BUCKET_BYTES``, default 4 MiB; 0 puts
each gradient in a bucket of its own). Each bucket is one ``allreduce_start``/``allreduce_wait``
pair (cgvm.distributed.collective_ops). With one process nothing is added to the graph.

Before the first step the ranks compare what they are about to reduce (names, shapes, dtypes,
bucket layout): a rank that built a different net fails at once with the difference named,
instead of summing unrelated buffers or waiting forever.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, List, Optional, Sequence

import numpy as np

from ..errors import DistributedError
from ..ir import Value
from . import collective_ops as cops
from .world import group as current_group

DEFAULT_BUCKET_BYTES = 4 << 20


def bucket_bytes_setting(bucket_bytes: Optional[int] = None) -> int:
    """``bucket_bytes`` if given, else ``CGVM_BUCKET_BYTES``, else 4 MiB."""
    if bucket_bytes is not None:
        value = int(bucket_bytes)
    else:
        value = int(os.environ.get("CGVM_BUCKET_BYTES", DEFAULT_BUCKET_BYTES))
    if value < 0:
        raise DistributedError(f"the gradient bucket size must be >= 0 bytes, got {value}")
    return value


def plan_buckets(grads: Sequence[Optional[Value]], bucket_bytes: int) -> List[List[int]]:
    """Indices of ``grads`` per bucket: last gradient first, one dtype per bucket, each bucket
    closed once it holds ``bucket_bytes``."""
    buckets: List[List[int]] = []
    open_by_dtype: dict = {}
    for i in reversed(range(len(grads))):
        g = grads[i]
        if g is None:
            continue
        key = str(g.dtype)
        current = open_by_dtype.get(key)
        if current is None:
            current = open_by_dtype[key] = [[], 0]
            buckets.append(current[0])
        current[0].append(i)
        current[1] += g.type.nbytes if g.type.is_concrete else bucket_bytes   # unknown: a bucket of its own
        if current[1] >= bucket_bytes:
            del open_by_dtype[key]
    return [b for b in buckets if b]


def reduce_gradients(grads: Sequence[Optional[Value]], *, average: bool = True, bucket_bytes: Optional[int] = None,
                     overlap: Optional[bool] = None, group: Any = None, names: Optional[Sequence[str]] = None,
                     signature: Any = None) -> List[Optional[Value]]:
    """``grads`` summed (``average``: averaged) over the ranks, as graph values (None stays None).

    ``overlap=False`` (or ``CGVM_ALLREDUCE_OVERLAP=0``) reduces each bucket with a blocking allreduce
    where it would have started (for measuring what overlap buys). ``names`` label the gradients in mismatch errors;
    ``signature`` is anything else the ranks must agree on (input shapes, solver settings).
    """
    g = current_group() if group is None else group
    grads = list(grads)
    if g.size <= 1:
        return grads
    limit = bucket_bytes_setting(bucket_bytes)
    if overlap is None:
        overlap = os.environ.get("CGVM_ALLREDUCE_OVERLAP", "1") not in ("0", "false", "no")
    buckets = plan_buckets(grads, limit)
    labels = list(names) if names is not None else [v.name if v is not None and v.name else f"gradient {i}"
                                                    for i, v in enumerate(grads)]
    mine = {"gradients": [(labels[i], tuple(v.shape), str(v.dtype)) for i, v in enumerate(grads) if v is not None],
            "buckets": buckets, "bucket_bytes": limit, "average": bool(average), "extra": signature}
    check_same_everywhere(mine, "the gradients to reduce", g)
    return insert_reductions(grads, buckets, g, scale=1.0 / g.size if average else 1.0, blocking=not overlap)


def insert_reductions(grads: Sequence[Optional[Value]], buckets: Sequence[Sequence[int]], group: Any, *,
                      scale: float, blocking: bool = False) -> List[Optional[Value]]:
    """``grads`` with each bucket (indices, from ``plan_buckets``) replaced by its
    ``allreduce_start``/``allreduce_wait`` pair over ``group``, times ``scale``: the graph
    ``reduce_gradients`` builds, without its checks and whatever the group's size (a one-rank
    group still runs the ops: the GPU test drives NCCL through them on one device)."""
    gid = cops.register_group(group)
    out: List[Optional[Value]] = list(grads)
    for k, members in enumerate(buckets):
        flat = cops.allreduce_start(*[grads[i] for i in members], group=gid, bucket=k, blocking=blocking,
                                    scale=scale, name=f"allreduce_bucket{k}")
        reduced = cops.allreduce_wait(flat, group=gid, bucket=k, shapes=[tuple(grads[i].shape) for i in members],
                                      name=f"reduced_bucket{k}")
        reduced = reduced if isinstance(reduced, (list, tuple)) else [reduced]
        for i, r in zip(members, reduced):
            out[i] = r
    return out


def check_same_everywhere(mine: Any, what: str, group: Any = None) -> None:
    """Fail on every rank, naming the ranks and the first difference, unless all ranks hold ``mine``."""
    g = current_group() if group is None else group
    if g.size <= 1:
        return
    everyone = g.allgather_object(mine)
    bad = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
    if not bad:
        return
    r = bad[0]
    detail = _first_difference(everyone[0], everyone[r])
    raise DistributedError(f"rank {g.rank} of {g.size}: ranks disagree on {what}: rank {r} differs from rank 0"
                           f"{' (and ranks ' + ', '.join(map(str, bad[1:])) + ')' if len(bad) > 1 else ''}: "
                           f"{detail}. Every rank must run the same net with the same shapes and dtypes")


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{path}{k}")
    if isinstance(a, list) and isinstance(b, list):   # entries are tuples: reported whole
        if len(a) != len(b):
            return f"{path or 'value'}: rank 0 has {len(a)} entries, the other {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path or 'value'}: rank 0 has {a!r}, the other {b!r}"


def broadcast_parameters(workspace: Any, names: Optional[Iterable[str]] = None, *, root: int = 0,
                         group: Any = None) -> List[str]:
    """Rank ``root``'s values of the workspace entries ``names`` (default: all) on every rank, in place.

    The ranks first check they hold the same entries with the same shapes and dtypes. Returns
    the names broadcast, in the (sorted) order used.
    """
    g = current_group() if group is None else group
    chosen = sorted(workspace.keys() if names is None else names)
    if g.size <= 1:
        return chosen
    arrays = [workspace[n] for n in chosen]
    check_same_everywhere([(n, tuple(a.shape), str(a.dtype)) for n, a in zip(chosen, arrays)],
                          "the parameters to broadcast", g)
    for name, a in zip(chosen, arrays):
        if isinstance(a, np.ndarray) and not (a.flags.c_contiguous and a.flags.writeable):
            a = np.ascontiguousarray(a).copy()
            g.broadcast(a, root)
            workspace.set(name, a)
        else:
            g.broadcast(a, root)
    return chosen


def data_parallel_grad(cost: Value, params: Sequence[Value], **options: Any) -> List[Optional[Value]]:
    """``cgvm.autodiff.grad(cost, params)`` averaged over the ranks (``reduce_gradients`` options)."""
    from ..autodiff import grad

    grads = grad(cost, list(params))
    return reduce_gradients(list(grads) if isinstance(grads, (list, tuple)) else [grads],
                            names=[p.name for p in params], **options)


def shard_rows(n: int, group: Any = None) -> slice:
    """This rank's rows of a global batch of ``n``: contiguous, sizes differing by at most one."""
    g = current_group() if group is None else group
    base, extra = divmod(n, g.size)
    start = g.rank * base + min(g.rank, extra)
    return slice(start, start + base + (1 if g.rank < extra else 0))
