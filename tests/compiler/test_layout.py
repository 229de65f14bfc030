"""Transposes sink through elementwise ops and cancel (channels-last frontends run in NCHW)."""
import numpy as np

import cgvm
from cgvm.compiler.layout import sink_transposes
from cgvm.ir import Graph, TensorType, input_value
from cgvm.ops import elementwise as E
from cgvm.ops import shape as S

NCHW_TO_NHWC = (0, 2, 3, 1)
NHWC_TO_NCHW = (0, 3, 1, 2)


def test_inverse_transposes_around_elementwise_ops_cancel():
    x = input_value(TensorType((None, 3, 4, 5)), "x")
    g = input_value(TensorType((None, 3, 4, 5)), "g")
    y = S.transpose(E.relu(S.transpose(x, perm=NCHW_TO_NHWC)), perm=NHWC_TO_NCHW)
    gy = S.transpose(E.relu_grad(S.transpose(g, perm=NCHW_TO_NHWC), S.transpose(x, perm=NCHW_TO_NHWC)),
                     perm=NHWC_TO_NCHW)
    out = sink_transposes(Graph([x, g], [E.mul(y, 2.0), gy]))
    assert [n.op.name for n in out.nodes].count("transpose") == 0
    assert all(n.source and "test_layout.py" in n.source for n in out.nodes)


def test_results_unchanged_and_partial_chains_keep_one_transpose():
    x = input_value(TensorType((None, 3, 4, 5)), "x")
    y = E.tanh(E.mul(S.transpose(x, perm=NCHW_TO_NHWC), 0.5))      # stays channels-last at the end
    f = cgvm.compile([x], y, passes=[p for p in cgvm.compiler.pass_names() if p != "fuse"])
    bare = cgvm.compile([x], y, passes=[])
    assert [n.op.name for n in f.graph.nodes] == ["mul", "tanh", "transpose"]
    v = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    np.testing.assert_allclose(f(v), bare(v), rtol=1e-6)
    assert f(v).shape == (2, 4, 5, 3)


def test_mismatched_perms_or_broadcast_operands_are_left_alone():
    x = input_value(TensorType((2, 3, 4)), "x")
    b = input_value(TensorType((3,)), "b")   # a per-channel bias: broadcasting would change meaning
    y = E.add(S.transpose(x, perm=(0, 2, 1)), b)
    out = sink_transposes(Graph([x, b], [y]))
    assert [n.op.name for n in out.nodes] == ["transpose", "add"]
