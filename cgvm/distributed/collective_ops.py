"""The gradient allreduce as two IR ops, so the compiler sees where communication starts and ends.

    flat = allreduce_start(g1, g2, ..., group=0, bucket=k, scale=1/N)   # pack (averaging), start Iallreduce
    g1', g2', ... = allreduce_wait(flat, shapes=...)                   # wait; the gradients are views of flat

``allreduce_start`` copies its gradients into one flat buffer (its output, placed by the memory
planner like any value) and starts a non-blocking in-place sum over the ranks on it; the buffer
stays alive, untouched by any other instruction, until ``allreduce_wait`` reads it, because
the wait is its one reader. The start scales the gradients by 1/N as it packs them (exact for
N a power of two, and no extra pass), and the wait returns them as views of the buffer (a view
op: the planner keeps the buffer until the last of them is read), so a bucket costs one pass
over its gradients (the packing) besides the reduction itself. Both ops are ``stateful``: never
folded, merged by CSE, fused or hoisted. The scheduling facts ``collective="start"``/``"wait"`` let the ``collectives`` pass
(cgvm.compiler.collectives) issue each start right after its last gradient is made and each
wait right before the first update that reads its results, so that backward computation runs
while the bucket travels. Every rank compiles the same graph, so the starts are issued in the
same order everywhere, as MPI requires of non-blocking collectives.

Differentiating through them is not supported (gradients of gradients across ranks).
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import numpy as np

from ..errors import DistributedError, ShapeError
from ..ir import TensorType
from ..ir.attrs import Any_, Bool, Float, Int
from ..ops.registry import OPAQUE, defop

#: group id (an op attribute) -> the process group its kernels talk to
GROUPS: Dict[int, Any] = {}


def register_group(group: Any) -> int:
    """The id ops use to name ``group`` (the same object always gets the same id)."""
    for k, g in GROUPS.items():
        if g is group:
            return k
    k = len(GROUPS)
    GROUPS[k] = group
    return k


def _group(k: int) -> Any:
    g = GROUPS.get(k)
    if g is None:
        raise DistributedError(f"this program reduces over process group {k}, which this process has not opened")
    return g


def _buffer_key(xp: Any, a: Any) -> int:
    """The address of ``a``'s memory: start and wait meet on the buffer, whatever object carries it."""
    return int(a.data.ptr) if hasattr(a, "data") and hasattr(a.data, "ptr") else int(a.ctypes.data)


#: buffer address -> (request, bucket, gradient shapes) of reductions started and not yet waited for
_pending: Dict[int, Tuple[Any, int, Tuple[Tuple[int, ...], ...]]] = {}


def _start_infer(types: List[TensorType], group: int, bucket: int, blocking: bool, scale: float):
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise ShapeError(f"allreduce_start: a bucket holds one dtype, got {sorted(str(d) for d in dtypes)}")
    if not all(t.is_concrete for t in types):   # (Theano-style shared variables): known at run time
        return TensorType((None,), types[0].dtype)
    total = sum(int(np.prod(t.shape, dtype=np.int64)) for t in types)
    return TensorType((total,), types[0].dtype)


allreduce_start = defop(
    "allreduce_start", num_inputs=(1, None), pattern=OPAQUE, infer=_start_infer, stateful=True,
    differentiable=False, attrs={"group": Int(0), "bucket": Int(0), "blocking": Bool(False), "scale": Float(1.0)},
    doc="allreduce_start(g1, ..., gk) -> flat: the gradients, times scale (1/ranks: the mean), packed into "
        "one buffer whose sum over the ranks of the group has been started (non-blocking; blocking=True "
        "reduces at once). Read it only through allreduce_wait.")
allreduce_start.collective = "start"


@allreduce_start.kernel
def _(xp, *grads, group, bucket, blocking, scale, out=None):
    total = sum(g.size for g in grads)
    flat = xp.empty((total,), grads[0].dtype) if out is None else out
    factor = flat.dtype.type(scale)
    at = 0
    for g in grads:   # scaled while packed: the packing pass is made anyway, and 1/2^k is exact
        part = flat[at:at + g.size]
        if scale != 1.0:
            xp.multiply(g.reshape(-1), factor, out=part)
        else:
            part[...] = g.reshape(-1)
        at += g.size
    comm = _group(group)
    for key, (req, k, shapes) in list(_pending.items()):   # drive earlier buckets on (MPI progresses in calls)
        if req is not None and hasattr(req, "Test") and req.Test():
            _pending[key] = (None, k, shapes)
    _pending[_buffer_key(xp, flat)] = (comm.start_allreduce(flat, blocking=blocking), bucket,
                                       tuple(g.shape for g in grads))
    return flat


def _wait_infer(types: List[TensorType], group: int, bucket: int, shapes: Tuple[Tuple[int, ...], ...],
                scale: float):
    (flat,) = types
    known = all(d is not None for s in shapes for d in s)
    total = sum(int(np.prod(s, dtype=np.int64)) for s in shapes) if known else None
    if known and flat.is_concrete and flat.shape != (total,):
        raise ShapeError(f"allreduce_wait: the bucket holds {flat.shape} elements, its shapes need {total}")
    return [TensorType(tuple(s), flat.dtype) for s in shapes]


allreduce_wait = defop(
    "allreduce_wait", num_inputs=1, num_outputs=lambda attrs, n: len(attrs["shapes"]), pattern=OPAQUE,
    infer=_wait_infer, stateful=True, differentiable=False, multi_out=True, view=True,
    attrs={"group": Int(0), "bucket": Int(0), "shapes": Any_(), "scale": Float(1.0)},
    doc="allreduce_wait(flat) -> (g1', ..., gk'): wait for the bucket's sum over the ranks, scale it by "
        "scale in place (1, when allreduce_start scaled the bucket), and give the gradients as views of "
        "it (no unpacking copy: the planner keeps the bucket's buffer alive while they are read).")
allreduce_wait.collective = "wait"


@allreduce_wait.kernel
def _(xp, flat, *, group, bucket, shapes, scale, out=None):
    comm = _group(group)
    req, _, made = _pending.pop(_buffer_key(xp, flat), (None, bucket, shapes))
    comm.finish(req, f"the allreduce of gradient bucket {bucket}")
    shapes = made     # the shapes start packed (the attribute may leave dimensions unknown)
    if scale != 1.0:   # the bucket's one reader is this op: scaled where it lies
        xp.multiply(flat, flat.dtype.type(scale), out=flat)
    results = []
    at = 0
    for shape in shapes:
        n = int(np.prod(shape, dtype=np.int64))
        results.append(flat[at:at + n].reshape(shape))
        at += n
    return results[0] if len(results) == 1 else tuple(results)   # one result: the VM expects a plain array
