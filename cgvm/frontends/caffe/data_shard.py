"""Caffe's solver_count / solver_rank, and each rank's share of every global batch of a data layer.

With N solvers (``mpiexec -n N cgvm train``, or pycaffe's ``set_solver_count``), a TRAIN-phase
data layer of ``batch_size: b`` is built for the global batch of N*b records and told to keep
records rank, rank+N, rank+2N, ... of it (Caffe's DataLayer::Skip interleaving; the layers'
``take_share``, data_common.BatchShare). It moves its read position, shuffles and random draws
(crop offsets, mirror coins) over the whole global batch exactly as one process of batch N*b
would, since every rank draws from the same seed, but reads, decodes and transforms only its
own records. So N ranks of batch b see, together, exactly the batch one process of N*b sees, at
1/N of the data work each, and the read position (kept in snapshots) is the same on every rank:
a snapshot resumes with any rank count. TEST-phase layers are not split: only rank 0 tests, as
in Caffe.
"""
from __future__ import annotations

from typing import Any, Callable

from cgvm.frontends.caffe import caffe_pb2

_solvers = {"count": 1, "rank": 0, "multiprocess": False}

#: where each data layer type keeps its batch size
BATCH_FIELDS = {"Data": "data_param", "HDF5Data": "hdf5_data_param", "ImageData": "image_data_param",
                "WindowData": "window_data_param"}


def solver_count() -> int:
    return _solvers["count"]


def solver_rank() -> int:
    return _solvers["rank"]


def set_solver_count(count: int) -> None:
    if int(count) < 1:
        raise ValueError(f"solver_count must be >= 1, got {count}")
    _solvers["count"] = int(count)


def set_solver_rank(rank: int) -> None:
    if int(rank) < 0:
        raise ValueError(f"solver_rank must be >= 0, got {rank}")
    _solvers["rank"] = int(rank)


def set_multiprocess(multiprocess: bool) -> None:
    _solvers["multiprocess"] = bool(multiprocess)


def multiprocess() -> bool:
    return _solvers["multiprocess"]


def sharded(type_name: str, factory: Callable[..., Any]) -> Callable[..., Any]:
    """``factory`` that, with several solvers, builds TRAIN layers for the global batch and splits it."""
    field = BATCH_FIELDS.get(type_name)
    if field is None:
        return factory

    def build(layer: caffe_pb2.LayerParameter, phase: int, ctx: Any = None) -> Any:
        count, rank = solver_count(), solver_rank()
        if count <= 1 or phase != caffe_pb2.TRAIN:
            return factory(layer, phase, ctx)
        whole = caffe_pb2.LayerParameter()
        whole.CopyFrom(layer)
        param = getattr(whole, field)
        param.batch_size = int(getattr(layer, field).batch_size) * count
        built = factory(whole, phase, ctx)
        built.take_share(count, rank)
        return built

    build.__doc__ = factory.__doc__
    return build
