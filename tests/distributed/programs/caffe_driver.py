"""pycaffe under MPI, as Caffe's python/train.py drives its solvers: set_solver_count/rank, NCCL, bcast,
then steps. Writes each rank's weights to OUT_rank<r>.npz. Usage: caffe_driver.py SOLVER OUT ITERS [RESUME]
CGVM_TEST_FAULT=kill:R:ITER kills rank R (SIGKILL) when it reaches iteration ITER."""
import os
import signal
import sys

import numpy as np

import cgvm.caffe as caffe
import cgvm.distributed as dist

solver_file, out, iters = sys.argv[1], sys.argv[2], int(sys.argv[3])
resume = sys.argv[4] if len(sys.argv) > 4 else None
g = dist.init()
caffe.set_solver_count(g.size)
caffe.set_solver_rank(g.rank)
caffe.set_multiprocess(True)
solver = caffe.get_solver(solver_file, log=False)
if resume:
    solver.restore(resume)
nccl = caffe.NCCL(solver, caffe.NCCL.new_uid())
nccl.bcast()
solver.add_callback(nccl)
if solver.param.layer_wise_reduce:
    solver.net.after_backward(nccl)   # as python/train.py
fault = os.environ.get("CGVM_TEST_FAULT", "")
kill_rank, kill_iter = (int(v) for v in fault.split(":")[1:]) if fault else (-1, -1)
while solver.iter < iters:
    if g.rank == kill_rank and solver.iter == kill_iter:
        os.kill(os.getpid(), signal.SIGKILL)
    solver.step(1)
np.savez(f"{out}_rank{g.rank}.npz", **{f"{name}/{i}": np.asarray(b.data)
                                       for name, blobs in solver.net.params.items() for i, b in enumerate(blobs)})
print(f"rank {g.rank}: solver_count {caffe.solver_count()} solver_rank {caffe.solver_rank()} "
      f"has_nccl {caffe.has_nccl()}")
