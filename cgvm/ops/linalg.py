"""Linear algebra: matmul/dot (batched), gemm with transposes, tensordot, outer."""
from __future__ import annotations
