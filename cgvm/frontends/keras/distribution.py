"""``keras.distribution``: Keras 3's data-parallel API over MPI ranks (one rank = one device).

    import cgvm.keras as keras
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    model.fit(x, y, batch_size=64)          # mpiexec -n 4 python train.py: 16 rows per rank per step

As in Keras, ``batch_size`` is the global batch: each step, rank r trains on its contiguous share
of the same global batch (the shuffle order is rank 0's), gradients are averaged over the ranks
inside the compiled train step (cgvm.distributed.reduce_gradients), and the weights and optimizer
state start from rank 0's, so N ranks train the model one process trains with the same batch size.
When a global batch does not split evenly, each rank's loss is weighted by n_rank * N / n_global
(the ``loss_share`` input of the compiled step) so that the average of the ranks' losses is the
loss of the whole batch. Losses are averaged over the ranks; metrics are summed: a mean metric
(accuracy, MSE, ...) gives its weighted sum and its weight, Precision/Recall/AUC their counts, and
the totals over the ranks make the value, so every logged figure is the one a single process
computes on the global batch. Callbacks and the progress bar run on rank 0 only,
and rank 0's ``stop_training`` is broadcast so every rank stops together. ``evaluate`` splits
each batch the same way; ``predict`` splits the rows and gathers the outputs on every rank.
Without a launcher (one process) a DataParallel distribution changes nothing.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ...errors import CgvmError

_current: Dict[str, Any] = {"distribution": None}


def _group() -> Any:
    import cgvm.distributed as dist

    return dist.init()


def list_devices(device_type: Optional[str] = None) -> List[str]:
    """One device per MPI rank: ``["cpu:0", "cpu:1", ...]`` (``gpu:<rank>`` for device_type "gpu")."""
    kind = (device_type or "cpu").lower()
    return [f"{kind}:{r}" for r in range(_group().size)]


def initialize(job_addresses: Any = None, num_processes: Optional[int] = None, process_id: Optional[int] = None) -> None:
    """Keras' multi-process set-up: here the MPI launcher has done it; the counts given must match it."""
    g = _group()
    if num_processes is not None and int(num_processes) != g.size:
        raise CgvmError(f"keras.distribution.initialize: num_processes={num_processes} but this MPI run has "
                        f"{g.size} ranks; launch with `mpiexec -n {num_processes} ...`")
    if process_id is not None and int(process_id) != g.rank:
        raise CgvmError(f"keras.distribution.initialize: process_id={process_id} but this is MPI rank {g.rank}")


class DataParallel:
    """Replicate the model on every rank and split each global batch over them."""

    def __init__(self, device_mesh: Any = None, devices: Optional[Sequence[str]] = None,
                 auto_shard_dataset: bool = True, **kwargs: Any):
        g = _group()
        self.devices = list(devices) if devices is not None else list_devices()
        if len(self.devices) != g.size:
            raise CgvmError(f"DataParallel over {len(self.devices)} devices, but this run has {g.size} MPI rank(s): "
                            f"cgvm runs one device per rank (mpiexec -n {len(self.devices)} ...)")
        self.device_mesh = device_mesh
        self.batch_dim_name = "batch"
        self.auto_shard_dataset = auto_shard_dataset
        self.group = g

    @contextlib.contextmanager
    def scope(self) -> Iterator["DataParallel"]:
        previous = _current["distribution"]
        set_distribution(self)
        try:
            yield self
        finally:
            set_distribution(previous)

    def __repr__(self) -> str:
        return f"<DataParallel over {len(self.devices)} rank(s)>"


def set_distribution(value: Optional[DataParallel]) -> None:
    if value is not None and not isinstance(value, DataParallel):
        raise CgvmError(f"set_distribution takes a keras.distribution.DataParallel (or None), got {value!r}; "
                        "cgvm supports data parallelism only (no ModelParallel)")
    _current["distribution"] = value


def distribution() -> Optional[DataParallel]:
    return _current["distribution"]


# --------------------------------------------------------------------------- hooks used by training.py

def active_group() -> Any:
    """The process group when a DataParallel distribution over several ranks is set, else None."""
    d = _current["distribution"]
    return d.group if d is not None and d.group.size > 1 else None


def is_root() -> bool:
    g = active_group()
    return g is None or g.rank == 0


def reduce_gradients(grads: Sequence[Any], names: Sequence[str]) -> List[Any]:
    g = active_group()
    if g is None:
        return list(grads)
    import cgvm.distributed as dist

    return dist.reduce_gradients(list(grads), names=list(names), group=g)


def broadcast_weights(workspace: Any, names: Sequence[str]) -> None:
    g = active_group()
    if g is not None:
        import cgvm.distributed as dist

        dist.broadcast_parameters(workspace, list(dict.fromkeys(names)), group=g)


def same_order(order: np.ndarray) -> np.ndarray:
    """Rank 0's shuffle order on every rank (each rank's share is a slice of the same global batch)."""
    g = active_group()
    if g is None:
        return order
    order = np.ascontiguousarray(order, dtype=np.int64)
    return g.broadcast(order, 0)


def local_rows(idx: np.ndarray) -> Tuple[np.ndarray, float]:
    """This rank's rows of the global batch ``idx`` and the factor its sample weights take."""
    g = active_group()
    if g is None:
        return idx, 1.0
    import cgvm.distributed as dist

    if len(idx) < g.size:
        raise CgvmError(f"a global batch of {len(idx)} sample(s) cannot be split over {g.size} ranks; "
                        "use a batch size (and data set) of at least one sample per rank")
    mine = idx[dist.shard_rows(len(idx), g)]
    return mine, len(mine) * g.size / len(idx)


def global_logs(logs: Dict[str, Any], summed: Optional[Mapping[str, Any]] = None,
                counted: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The step's logged values over the ranks, equal to those of one process on the global batch.

    Losses are averaged (each rank's is already weighted by its share of the global batch). The
    ``summed`` mean metrics come as [weighted sum, weight] per rank: added over the ranks, then
    divided (a mean of per-rank means would weigh a rank of 2 rows like one of 3). The ``counted``
    metrics' counts (Precision, Recall, AUC) are added. One allreduce carries them all.
    """
    g = active_group()
    if g is None or not logs:
        return logs
    summed, counted = summed or {}, counted or {}
    parts = [np.asarray(v, np.float64).reshape(-1) for v in logs.values()]
    flat = np.concatenate(parts)
    g.allreduce(flat, "sum")
    out: Dict[str, Any] = {}
    at = 0
    for (name, _), part in zip(logs.items(), parts):
        total = flat[at:at + part.size]
        at += part.size
        if name in summed and total.size == 2:
            out[name] = summed[name].result_from_sums(total)
        elif name in counted or total.size > 1:
            out[name] = total.copy()
        else:
            out[name] = float(total[0]) / g.size
    return out


def root_decides(flag: bool) -> bool:
    """Rank 0's ``flag`` (stop_training: only rank 0 runs the callbacks)."""
    g = active_group()
    if g is None:
        return flag
    return bool(g.broadcast(np.array([1 if flag else 0], np.int64), 0)[0])


def gather_rows(parts: List[np.ndarray]) -> List[np.ndarray]:
    """Every rank's rows of each output, concatenated in rank order (the order of the data)."""
    g = active_group()
    if g is None:
        return parts
    everyone = g.allgather_object(parts)
    return [np.concatenate([theirs[k] for theirs in everyone]) for k in range(len(parts))]
