"""The process group: who we are (rank, size, local rank) and MPI collectives on array buffers.

``init()`` reads the launcher's environment: under ``mpiexec``/``mpirun`` (MPICH's PMI_*, Open MPI's
OMPI_*, PMIx) or ``srun`` (SLURM_*) it initialises MPI through mpi4py; launched plainly it is one
process of size 1 and needs no MPI at all. Collectives act on NumPy arrays (and anything with the
buffer protocol, Workspace entries included) in place, without copies or pickling; CuPy arrays
go through NCCL (cgvm.distributed.nccl) when the group was opened with ``device="gpu"``.

Once MPI is up, an uncaught exception on any rank prints ``rank R of N failed: ...`` and aborts
every rank (MPI_Abort), so no rank is left waiting in a collective for a peer that is gone.
"""
from __future__ import annotations

import atexit
import os
import signal
import socket
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ..errors import DistributedError

INSTALL_HINT = "pip install 'cgvm[mpi]' (mpi4py and the mpich wheel, which ships mpiexec)"

#: environment variables a launcher sets for each process: (rank, size, local rank) names
_LAUNCHERS = (
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("pmix", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
)

#: seconds a rank waits for a collective before it declares its peers lost (CGVM_DIST_TIMEOUT)
DEFAULT_TIMEOUT = 1800.0


def launcher_environment(env: Optional[Dict[str, str]] = None) -> Optional[Dict[str, Any]]:
    """``{"launcher", "rank", "size", "local_rank", "variables"}`` from the environment a launcher set, or None.

    A launcher that starts one process (``mpiexec -n 1``, a one-task Slurm step) counts: MPI is
    then initialised too, so a one-rank run exercises the same code as N ranks. A task started by
    ``srun --mpi=pmi2`` (or ``--mpi=pmix``) carries both Slurm's SLURM_PROCID and the PMI rank; it is
    reported as "slurm". ``mpiexec`` run inside a Slurm allocation is "mpich": its ranks inherit
    the batch step's SLURM_* (the same SLURM_PROCID on every rank), which must not be read as theirs.
    """
    env = os.environ if env is None else env
    for name, rank, size, local in _LAUNCHERS:
        if rank in env and size in env:
            try:
                found = {"launcher": name, "rank": int(env[rank]), "size": int(env[size]),
                         "local_rank": int(env.get(local, env[rank])), "variables": f"{rank}/{size}"}
            except ValueError:
                continue
            if name == "slurm" and found["size"] <= 1 and "PMI_RANK" not in env:
                continue   # a Slurm allocation running one plain process is not an MPI job
            if name != "slurm" and _srun_task(env, found):
                found.update(launcher="slurm", local_rank=int(env["SLURM_LOCALID"]))
            return found
    return None


def _srun_task(env: Dict[str, str], found: Dict[str, Any]) -> bool:
    """Whether srun started this process as one task of a step (with a PMI plugin), not mpiexec:
    the step's task id and count are the PMI rank and size, and no mpiexec marker is there."""
    if found["launcher"] not in ("mpich", "pmix") or "MPI_LOCALRANKID" in env or "SLURM_STEP_ID" not in env:
        return False
    tasks = env.get("SLURM_STEP_NUM_TASKS", env.get("SLURM_NTASKS"))
    return (env.get("SLURM_PROCID") == str(found["rank"]) and tasks == str(found["size"])
            and env.get("SLURM_LOCALID", "").isdigit())


def _import_mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise DistributedError(f"distributed training needs mpi4py and an MPI library: {INSTALL_HINT} "
                               f"({e})") from None
    return MPI


class LocalGroup:
    """One process alone: every collective is the identity (what cgvm does without a launcher)."""

    rank = 0
    size = 1
    local_rank = 0
    launcher = None
    device = "cpu"

    def allreduce(self, array: Any, op: str = "sum") -> Any:
        _check_op(op)
        return array

    def broadcast(self, array: Any, root: int = 0) -> Any:
        return array

    def allgather(self, array: Any) -> Any:
        a = np.asarray(array)
        return a.reshape((1,) + a.shape).copy()

    def allgather_object(self, obj: Any) -> List[Any]:
        return [obj]

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        return obj

    def barrier(self) -> None:
        return None

    def start_allreduce(self, array: Any, blocking: bool = False) -> Any:
        return None

    def finish(self, handle: Any, what: str = "") -> None:
        return None

    def abort(self, code: int = 1) -> None:
        os._exit(code)


class MPIGroup:
    """COMM_WORLD of mpi4py, collectives on buffers (upper-case mpi4py calls: no pickling)."""

    device = "cpu"

    def __init__(self, comm: Any = None, launcher: Optional[str] = None):
        MPI = _import_mpi()
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.local_rank = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank).Get_rank()
        self.launcher = launcher
        self.timeout = float(os.environ.get("CGVM_DIST_TIMEOUT", DEFAULT_TIMEOUT))
        #: (host, pid) of every rank: a launcher reports a dead process by pid, we say which rank it was
        self.peers = self.comm.allgather((socket.gethostname(), os.getpid()))
        if self.rank == 0 and self.size > 1 and os.environ.get("CGVM_DIST_QUIET", "0") in ("", "0"):
            # MPICH reports a rank killed by a signal by its pid alone: this line says which rank it was
            table = ", ".join(f"rank {r} = pid {pid} on {host}" for r, (host, pid) in enumerate(self.peers))
            sys.stderr.write(f"cgvm.distributed: {self.size} ranks ({launcher or 'mpi'}): {table}\n")
            sys.stderr.flush()
        self._ops = {"sum": MPI.SUM, "mean": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}

    # -- blocking collectives, in place ---------------------------------------------
    def allreduce(self, array: Any, op: str = "sum") -> Any:
        """Reduce ``array`` over every rank, in place (``op``: sum, mean, max, min); returns it."""
        _check_op(op)
        buf = _writable_buffer(array, "allreduce")
        self.finish(self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self._ops[op]), "allreduce")
        if op == "mean":
            np.multiply(buf, np.asarray(1.0 / self.size, buf.dtype), out=buf, casting="unsafe")
        return array

    def broadcast(self, array: Any, root: int = 0) -> Any:
        """Rank ``root``'s ``array`` into every rank's ``array`` (same shape and dtype), in place."""
        buf = _writable_buffer(array, "broadcast")
        self.finish(self.comm.Ibcast(buf, root=root), "broadcast")
        return array

    def allgather(self, array: Any) -> np.ndarray:
        """Every rank's ``array`` stacked along a new first axis (rank order)."""
        a = np.ascontiguousarray(array)
        out = np.empty((self.size,) + a.shape, a.dtype)
        self.finish(self.comm.Iallgather(a, out), "allgather")
        return out

    def allgather_object(self, obj: Any) -> List[Any]:
        """Small Python objects from every rank (pickled: for signatures and settings, not tensors)."""
        return self.comm.allgather(obj)

    def bcast_object(self, obj: Any, root: int = 0) -> Any:
        """Rank ``root``'s small Python object on every rank (pickled: NCCL's unique id, settings)."""
        return self.comm.bcast(obj, root=root)

    def barrier(self) -> None:
        self.finish(self.comm.Ibarrier(), "barrier")

    # -- non-blocking ----------------------------------------------------------------
    def start_allreduce(self, array: Any, blocking: bool = False) -> Any:
        """Start summing ``array`` in place over the ranks; the handle goes to ``finish``."""
        if blocking:
            self.comm.Allreduce(self.MPI.IN_PLACE, array, op=self.MPI.SUM)
            return None
        return self.comm.Iallreduce(self.MPI.IN_PLACE, array, op=self.MPI.SUM)

    def finish(self, request: Any, what: str = "collective") -> None:
        """Wait for ``request``, polling so that a lost peer gives an error instead of a hang."""
        if request is None or request.Test():
            return
        start = time.monotonic()
        deadline = start + self.timeout
        while not request.Test():
            # MPI moves the data inside these calls: poll back to back for a while (yielding the core
            # between polls), then every 0.1 ms, checking the deadline
            if time.monotonic() - start < 0.05:
                time.sleep(0)
            else:
                time.sleep(0.0001)
                if time.monotonic() > deadline:
                    raise DistributedError(
                        f"rank {self.rank} of {self.size}: {what} did not complete within {self.timeout:g} s "
                        "(CGVM_DIST_TIMEOUT); a peer rank has stopped or is running a different program")

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)


def _check_op(op: str) -> None:
    if op not in ("sum", "mean", "max", "min"):
        raise DistributedError(f"unknown reduction {op!r}; use 'sum', 'mean', 'max' or 'min'")


def _writable_buffer(array: Any, what: str) -> np.ndarray:
    """``array`` itself as a contiguous writable NumPy array (no copy), or a clear error."""
    if not isinstance(array, np.ndarray):
        try:
            array = np.asarray(memoryview(array))
        except TypeError:
            raise DistributedError(f"{what}: expected a NumPy array or a buffer, got {type(array).__name__} "
                                   "(CuPy arrays need the GPU group: cgvm.distributed.init(device='gpu'))") from None
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise DistributedError(f"{what} works in place and needs a contiguous writable array; "
                               f"got one with flags {array.flags.c_contiguous=}, {array.flags.writeable=}")
    return array


# --------------------------------------------------------------------------- the current group

_group: Any = None
_hooks_installed = False


def default_device() -> str:
    """"gpu" where CGVM_BACKEND names the GPU backend (any of its spellings: cupy, gpu, cuda), else "cpu"."""
    return "gpu" if os.environ.get("CGVM_BACKEND", "").strip().lower() in ("cupy", "gpu", "cuda") else "cpu"


def init(*, device: Optional[str] = None, require: bool = False) -> Any:
    """The process group of this run, initialising MPI on first use when a launcher started us.

    ``require=True`` raises (with the install command) when no MPI launcher is found or mpi4py
    is missing; otherwise a plain launch gives a group of one process.
    ``device="gpu"``: gradients on CuPy arrays are reduced with NCCL (unique id sent over MPI); the
    default is "gpu" when ``CGVM_BACKEND=cupy`` selects the GPU backend, else "cpu".
    """
    global _group
    if device is None:
        device = default_device()
    if device not in ("cpu", "gpu"):
        raise DistributedError(f"device must be 'cpu' or 'gpu', got {device!r}")
    if _group is not None and (device == "cpu" or _group.device == device):
        return _group
    if isinstance(_group, MPIGroup):   # the CPU group exists: NCCL joins it
        from .nccl import NCCLGroup

        _group = NCCLGroup(_group)
        return _group
    found = launcher_environment()
    if found is None and not require:
        _group = LocalGroup()
        return _group
    if found is None:
        _import_mpi()     # missing: the install hint first
        raise DistributedError("this process was not started by an MPI launcher; run it as `mpiexec -n N python "
                               "...` (or `srun -n N ...` under Slurm)")
    base = MPIGroup(launcher=found["launcher"])
    if (base.rank, base.size) != (found["rank"], found["size"]):
        hint = ("under Slurm start the tasks with `srun --mpi=pmi2 ...` (or --mpi=pmix, whichever the MPI "
                "library supports), or run `mpiexec -n N ...` inside the allocation" if found["launcher"] == "slurm"
                else "start every rank with the launcher of the MPI library mpi4py uses")
        raise DistributedError(
            f"this process is rank {found['rank']} of {found['size']} according to the {found['launcher']} launcher "
            f"({found['variables']}), but MPI sees rank {base.rank} of {base.size}: the MPI library is not "
            f"connected to the launcher's process manager, and training alone would silently not be data-parallel; "
            f"{hint}")
    _group = base
    if base.size > 1:   # before NCCL: a rank that cannot open its communicator stops the others
        _install_fault_hooks(base)
    if device == "gpu":
        from .nccl import NCCLGroup

        _group = NCCLGroup(base)
    return _group


def group() -> Any:
    """The current group (initialising it as ``init()`` does)."""
    return _group if _group is not None else init()


def is_distributed() -> bool:
    return group().size > 1


def _install_fault_hooks(g: Any) -> None:
    """An uncaught exception on one rank aborts all of them, naming the rank and the error."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    previous: Callable[..., Any] = sys.excepthook

    def excepthook(kind, value, tb):
        fail(f"{kind.__name__}: {value}", "".join(traceback.format_exception(kind, value, tb)))
        previous(kind, value, tb)

    sys.excepthook = excepthook
    atexit.register(_check_exit)
    if hasattr(g, "peers") or hasattr(getattr(g, "mpi", None), "peers"):
        signal.signal(signal.SIGTERM, _on_terminate)


def _gone_peers(g: Any) -> List[str]:
    """Ranks on this host whose process has exited (or is a zombie), as 'rank R (pid P on H)'."""
    peers = getattr(g, "peers", None) or getattr(getattr(g, "mpi", None), "peers", None) or []
    here = socket.gethostname()
    gone = []
    for r, (host, pid) in enumerate(peers):
        if host != here or pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                dead = f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except OSError:
            dead = True
        if dead:
            gone.append(f"rank {r} (pid {pid} on {host})")
    return gone


def _on_terminate(signum: int, frame: Any) -> None:
    """The launcher stops the survivors when a rank dies: say which rank it was, then exit."""
    g = _group
    gone = _gone_peers(g) if g is not None else []
    peers = getattr(g, "peers", None) or getattr(getattr(g, "mpi", None), "peers", None) or []
    table = ", ".join(f"rank {r} = pid {pid} on {host}" for r, (host, pid) in enumerate(peers))
    rank = g.rank if g is not None else "?"
    size = g.size if g is not None else "?"
    what = f"rank(s) that died: {', '.join(gone)}" if gone else f"a peer failed ({table})"
    sys.stderr.write(f"cgvm.distributed: rank {rank} of {size} stopped by the launcher (signal {signum}); "
                     f"{what}\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def fail(reason: str, details: str = "", code: int = 1) -> None:
    """Print ``rank R of N failed: reason`` and abort every rank (no return when distributed)."""
    g = _group
    if g is None or g.size <= 1 or getattr(g, "_aborting", False):
        return
    g._aborting = True
    if details and not details.endswith("\n"):
        details += "\n"
    # one write: the launcher merges every rank's stderr, and ranks failing together must not
    # interleave inside each other's lines
    sys.stderr.flush()
    _write_all(2, (details + f"cgvm.distributed: rank {g.rank} of {g.size} failed: {reason}; aborting all "
                             f"ranks\n").encode("utf-8", "replace"))
    # MPI_Abort tears the job down at once, and the launcher may drop output it has not forwarded
    # yet: give it a moment to pass the message on (seen with MPICH's hydra under load)
    time.sleep(0.2)
    g.abort(code)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except OSError:
            return


_exit_status: Dict[str, Any] = {"code": 0}


def exit_code(code: int) -> int:
    """Record the code this process will exit with (entry points call it), so that a failing rank
    aborts the others at exit instead of leaving them in a collective (MPI_Finalize would wait)."""
    _exit_status["code"] = int(code or 0)
    return code


def _check_exit() -> None:
    code = _exit_status["code"]
    if code:
        fail(f"exited with status {code}", code=code)
