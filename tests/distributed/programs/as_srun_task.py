"""Run PROGRAM [ARGS] in the environment `srun --mpi=pmi2 -N1 -n N` gives a task, from the one mpiexec gives
a rank: usage (under mpiexec) as_srun_task.py PROGRAM [ARGS...].

Slurm's PMI-2 plugin gives each task PMI_FD, PMI_JOBID, PMI_RANK and PMI_SIZE (the PMI connection stays
mpiexec's here: there is no slurmstepd) and srun the task's SLURM_* variables (task id, task count,
node-local id, the step's node list, ...). What only MPICH's mpiexec sets (MPI_LOCALRANKID,
MPI_LOCALNRANKS, PMI_HOSTNAME, HYDI_CONTROL_FD) is removed, so the program sees what a task of a
one-node Slurm step sees."""
import os
import runpy
import socket
import sys

rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
host = socket.gethostname()
for name in ("MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_HOSTNAME", "HYDI_CONTROL_FD",
             "GFORTRAN_UNBUFFERED_PRECONNECTED"):
    os.environ.pop(name, None)
os.environ.update({
    "PMI_JOBID": "4242.0",
    "SLURM_JOB_ID": "4242", "SLURM_JOBID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
    "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank), "SLURM_NODEID": "0",
    "SLURM_GTIDS": ",".join(map(str, range(size))),
    "SLURM_NTASKS": str(size), "SLURM_NPROCS": str(size), "SLURM_STEP_NUM_TASKS": str(size),
    "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_STEP_NUM_NODES": "1",
    "SLURM_NODELIST": host, "SLURM_JOB_NODELIST": host, "SLURM_STEP_NODELIST": host,
    "SLURM_TASKS_PER_NODE": str(size), "SLURM_STEP_TASKS_PER_NODE": str(size),
    "SLURM_CPUS_ON_NODE": str(os.cpu_count() or 1), "SLURMD_NODENAME": host, "SLURM_TOPOLOGY_ADDR": host,
    "SLURM_TOPOLOGY_ADDR_PATTERN": "node", "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1",
    "SLURM_SRUN_COMM_HOST": "127.0.0.1",
    "SLURM_SUBMIT_DIR": os.getcwd(), "SLURM_SUBMIT_HOST": host, "SLURM_TASK_PID": str(os.getpid()),
    "SLURM_CLUSTER_NAME": "test", "SLURM_JOB_NAME": "cgvm", "SLURM_MPI_TYPE": "pmi2",
})
program = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
runpy.run_path(program, run_name="__main__")
