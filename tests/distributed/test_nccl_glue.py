"""cgvm.distributed.nccl without a GPU: NCCLGroup driven on 2 MPI ranks by a fake CuPy/NCCL
(programs/fake_cupy.py), checking the unique-id broadcast, the NCCL calls per collective and per
gradient bucket, the stream and event ordering, and the reduced values (programs/nccl_fake.py)."""
from dist_launch import program, run_ranks


def test_nccl_group_glue_on_two_ranks_with_a_fake_cupy(tmp_path):
    r = run_ranks(2, [program("nccl_fake.py")], cwd=tmp_path)
    assert r.returncode == 0, r.output
    assert "rank 0 nccl glue ok" in r.output and "rank 1 nccl glue ok" in r.output, r.output
