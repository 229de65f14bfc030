"""Under Slurm's task environment (as_srun_task.py, or a real srun): cgvm.distributed's rank, size and
local rank are the task's SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID, the launcher is named "slurm",
and collectives work; prints one line per rank."""
import os

import numpy as np

import cgvm.distributed as dist

g = dist.init(require=True)
want = (int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"]), int(os.environ["SLURM_LOCALID"]))
assert (dist.rank(), dist.size(), dist.local_rank()) == want, ((dist.rank(), dist.size(), dist.local_rank()), want)
assert g.launcher == "slurm", g.launcher
a = np.full(4, float(g.rank + 1), np.float32)
dist.allreduce(a, "sum")
assert np.all(a == g.size * (g.size + 1) / 2), a
ids = dist.allgather(np.array([int(os.environ["SLURM_PROCID"])], np.int64))
assert ids.ravel().tolist() == list(range(g.size)), ids
print(f"task {g.rank} of {g.size} (local {g.local_rank}, {g.launcher} step "
      f"{os.environ['SLURM_JOB_ID']}.{os.environ['SLURM_STEP_ID']} on {os.environ['SLURM_STEP_NODELIST']}) ok",
      flush=True)
