"""Slurm without a Slurm: 2 ranks started by the venv's mpiexec (MPICH's PMI) with each rank's
environment rewritten to what `srun --mpi=pmi2` gives a task (programs/as_srun_task.py: Slurm's
PMI_* and SLURM_*, none of mpiexec's own markers). cgvm must take rank, size and local rank from
it, name the launcher "slurm", reduce and train as under mpiexec; a task whose MPI is not connected
to Slurm's process manager must fail at once instead of training alone. What a real srun adds
(slurmstepd's PMI-2 server, several nodes) is not exercised here; see docs/distributed.md."""
import numpy as np

from dist_launch import program, run_ranks


def test_srun_tasks_get_their_slurm_identity_and_reduce(tmp_path):
    r = run_ranks(2, [program("as_srun_task.py"), program("slurm_task.py")], cwd=tmp_path)
    assert r.returncode == 0, r.output
    for k in (0, 1):
        assert f"task {k} of 2 (local {k}, slurm step 4242.0 on " in r.output, r.output
    assert "2 ranks (slurm)" in r.output
    r = run_ranks(2, [program("as_srun_task.py"), program("collectives.py")], cwd=tmp_path)
    assert r.returncode == 0 and "rank 0 ok" in r.output and "rank 1 ok" in r.output, r.output


def test_srun_tasks_train_as_mpiexec_ranks_do(tmp_path):
    args = ["16", "30"]
    srun = run_ranks(2, [program("as_srun_task.py"), program("core_mlp.py"), str(tmp_path / "srun")] + args,
                     cwd=tmp_path)
    assert srun.returncode == 0, srun.output
    mpiexec = run_ranks(2, [program("core_mlp.py"), str(tmp_path / "mpiexec")] + args, cwd=tmp_path)
    assert mpiexec.returncode == 0, mpiexec.output
    for rank in (0, 1):
        with np.load(tmp_path / f"srun_rank{rank}.npz") as a, np.load(tmp_path / "mpiexec_rank0.npz") as b:
            for k in b.files:
                assert np.array_equal(a[k], b[k]), f"rank {rank} {k}: srun-style run differs from mpiexec's"


def test_a_slurm_task_that_mpi_cannot_see_fails_at_once(tmp_path):
    # srun without a PMI plugin the MPI library speaks: MPI starts each task alone (a singleton)
    task = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2",
            "SLURM_STEP_NUM_TASKS": "2", "SLURM_LOCALID": "1", "SLURM_STEP_NODELIST": "localhost"}
    r = run_ranks(None, [program("slurm_task.py")], cwd=tmp_path, env=task, timeout=60)
    assert r.returncode != 0
    assert "rank 1 of 2 according to the slurm launcher (SLURM_PROCID/SLURM_NTASKS), but MPI sees rank 0 of 1" \
        in r.output, r.output
    assert "srun --mpi=pmi2" in r.output
    assert r.seconds < 30
