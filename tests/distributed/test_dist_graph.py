"""The collective ops in one process (a stand-in group of 2 that sums nothing): buckets, their place
in the program, the passes leave them alone, the mean applied; launcher detection and row shards."""
import numpy as np

import cgvm
import cgvm.distributed as dist
from cgvm.distributed import collective_ops as cops
from cgvm.distributed.world import LocalGroup, launcher_environment
from cgvm.ir import TensorType, input_value, param_value
from cgvm.ops import elementwise as E, linalg as L, reduce as R


class EchoGroup(LocalGroup):
    """Two ranks that hold the same data: a sum is the data itself (checks bookkeeping, not MPI)."""

    size = 2

    def __init__(self):
        self.started = []

    def allgather_object(self, obj):
        return [obj, obj]

    def start_allreduce(self, array, blocking=False):
        self.started.append(array.size)
        return None


def _net(ws):
    rng = np.random.default_rng(1)
    shapes = {"w1": (5, 7), "b1": (7,), "w2": (7, 2)}
    for n, s in shapes.items():
        ws[n] = rng.standard_normal(s).astype(np.float32)
    x = input_value(TensorType((None, 5)), "x")
    ps = [param_value(n, TensorType(s)) for n, s in shapes.items()]
    loss = R.sum(E.square(L.matmul(E.tanh(E.add(L.matmul(x, ps[0]), ps[1])), ps[2])))
    return x, ps, loss


def test_buckets_are_filled_last_gradient_first_up_to_the_threshold():
    x, ps, loss = _net(cgvm.Workspace())
    grads = cgvm.autodiff.grad(loss, ps)
    assert dist.plan_buckets(grads, 0) == [[2], [1], [0]]
    assert dist.plan_buckets(grads, 7 * 2 * 4 + 7 * 4) == [[2, 1], [0]]
    assert dist.plan_buckets(grads, 1 << 30) == [[2, 1, 0]]


def test_starts_follow_their_gradients_and_waits_precede_the_updates():
    ws = cgvm.Workspace()
    x, ps, loss = _net(ws)
    group = EchoGroup()
    grads = dist.reduce_gradients(cgvm.autodiff.grad(loss, ps), group=group, bucket_bytes=0)
    plain = cgvm.autodiff.grad(loss, ps)
    step = cgvm.compile([x], loss, workspace=ws, updates={p: E.sub(p, E.mul(g, 0.1)) for p, g in zip(ps, grads)})
    nodes = step.graph.nodes
    kinds = [getattr(n.op, "collective", "") for n in nodes]
    assert kinds.count("start") == 3 and kinds.count("wait") == 3     # not merged, pruned or folded
    for i, n in enumerate(nodes):
        if kinds[i] == "start":    # right after the last of its inputs is made
            made = max(j for j, m in enumerate(nodes[:i]) for o in m.outputs if any(o is v for v in n.inputs))
            assert made == i - 1, step.dis()
        if kinds[i] == "wait":     # right before its first reader
            assert any(v is o for v in nodes[i + 1].inputs for o in n.outputs), step.dis()
    # a start precedes the last backward matmul: communication overlaps computation
    first_start = kinds.index("start")
    assert any(n.op.name in ("matmul", "gemm") for n in nodes[first_start:]), step.dis()
    # the mean over 2 ranks that hold the same gradients halves nothing: w - 0.1 * g, as without MPI
    ref = cgvm.Workspace()
    for n in ("w1", "b1", "w2"):
        ref[n] = np.array(ws[n])
    ref_step = cgvm.compile([x], loss, workspace=ref, updates={p: E.sub(p, E.mul(g, 0.05)) for p, g in zip(ps, plain)})
    xb = np.random.default_rng(2).standard_normal((4, 5)).astype(np.float32)
    step(xb)
    ref_step(xb)
    for n in ("w1", "b1", "w2"):   # scale 1/2 of a sum that echoes one rank's gradient: g/2
        np.testing.assert_allclose(ws[n], ref[n], rtol=1e-6, atol=1e-7)
    assert sorted(group.started[-3:]) == [7, 7 * 2, 5 * 7]   # (the suite may also run the graph unoptimized)
    assert not cops._pending


def test_one_process_adds_nothing_to_the_graph():
    x, ps, loss = _net(cgvm.Workspace())
    grads = cgvm.autodiff.grad(loss, ps)
    assert dist.reduce_gradients(grads) == list(grads)
    assert dist.size() == 1 and dist.rank() == 0


def test_launcher_environments_are_recognised():
    assert launcher_environment({}) is None
    assert launcher_environment({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1"}) == \
        {"launcher": "mpich", "rank": 1, "size": 4, "local_rank": 1, "variables": "PMI_RANK/PMI_SIZE"}
    assert launcher_environment({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8",
                                 "OMPI_COMM_WORLD_LOCAL_RANK": "1"})["local_rank"] == 1
    assert launcher_environment({"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0"})["launcher"] == "slurm"
    assert launcher_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None   # a plain batch job


def test_srun_tasks_and_mpiexec_inside_an_allocation_are_told_apart():
    step = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_NUM_TASKS": "4"}
    # srun --mpi=pmi2: Slurm's PMI-2 plugin sets PMI_FD/PMI_RANK/PMI_SIZE beside the task's SLURM_*
    srun = {**step, "PMI_FD": "5", "PMI_JOBID": "77.0", "PMI_RANK": "2", "PMI_SIZE": "4", "SLURM_PROCID": "2",
            "SLURM_LOCALID": "0"}
    assert launcher_environment(srun) == {"launcher": "slurm", "rank": 2, "size": 4, "local_rank": 0,
                                          "variables": "PMI_RANK/PMI_SIZE"}
    # mpiexec in a batch script: MPICH's ranks inherit the batch step's SLURM_PROCID 0
    hydra = {**step, "PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0"}
    assert launcher_environment(hydra)["launcher"] == "mpich" and launcher_environment(hydra)["local_rank"] == 2
    # srun --mpi=pmix
    pmix = {**step, "PMIX_RANK": "3", "PMIX_SIZE": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1"}
    assert launcher_environment(pmix)["launcher"] == "slurm" and launcher_environment(pmix)["local_rank"] == 1
    # srun with no PMI plugin: Slurm's variables alone
    assert launcher_environment({**step, "SLURM_PROCID": "1", "SLURM_LOCALID": "1"}) == \
        {"launcher": "slurm", "rank": 1, "size": 4, "local_rank": 1, "variables": "SLURM_PROCID/SLURM_NTASKS"}


def test_row_shards_cover_a_global_batch_once():
    for n in (8, 9, 2):
        rows = []
        for r in range(3):
            g = LocalGroup()
            g.rank, g.size = r, 3
            s = dist.shard_rows(n, g)
            rows += list(range(n))[s]
        assert rows == list(range(n))


def test_a_launched_run_without_mpi4py_says_how_to_install_it(monkeypatch):
    import sys

    import pytest

    from cgvm.distributed import world
    from cgvm.errors import DistributedError

    monkeypatch.setitem(sys.modules, "mpi4py", None)     # import mpi4py fails as if not installed
    monkeypatch.setattr(world, "_group", None)
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "2")
    with pytest.raises(DistributedError, match=r"pip install 'cgvm\[mpi\]'"):
        world.init()
    monkeypatch.delenv("PMI_RANK")
    monkeypatch.delenv("PMI_SIZE")
    assert world.init().size == 1          # a plain launch needs no MPI at all
    monkeypatch.setattr(world, "_group", None)


def test_caffe_solver_count_outside_mpi_tells_how_to_launch(tmp_path, monkeypatch):
    import pytest

    import cgvm.caffe as caffe
    from cgvm.distributed import world

    monkeypatch.setattr(world, "_group", None)
    caffe.set_solver_count(2)
    try:
        (tmp_path / "net.prototxt").write_text('layer { name: "d" type: "Input" top: "x" input_param { shape { '
                                               'dim: 2 dim: 3 } } }\n')
        (tmp_path / "s.prototxt").write_text(f'net: "{tmp_path / "net.prototxt"}"\nbase_lr: 0.1\nlr_policy: "fixed"\n')
        with pytest.raises(Exception, match=r"mpiexec -n 2"):
            caffe.get_solver(str(tmp_path / "s.prototxt"), log=False)
    finally:
        caffe.set_solver_count(1)
        monkeypatch.setattr(world, "_group", None)
    assert caffe.solver_count() == 1 and caffe.solver_rank() == 0 and isinstance(caffe.has_nccl(), bool)
