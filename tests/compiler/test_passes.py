"""Compiler passes: pruning, constant folding, CSE, the pipeline's debug verification and printing."""
import io

import numpy as np
import pytest

import cgvm
from cgvm.compiler import PIPELINE, pass_names, prune, run_passes
from cgvm.compiler.cse import eliminate_common_subexpressions
from cgvm.compiler.fold import fold_constants
from cgvm.ir import CONST, Graph, TensorType, input_value, param_value
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R


def x_in(n=4):
    return input_value(TensorType((n,), "float64"), "x")


def op_names(graph):
    return [n.op.name for n in graph.nodes]


def test_prune_keeps_only_what_outputs_need():
    x = x_in()
    a = E.exp(x)
    unused = E.tanh(a)  # noqa: F841  (built, never requested)
    y = E.neg(a)
    g = Graph([x], [y])
    assert op_names(g) == ["exp", "neg"]


def test_prune_cuts_at_given_values():
    x = x_in()
    a = E.exp(x)
    y = E.neg(a)
    g = prune(Graph([x], [y]), given=[a])
    assert op_names(g) == ["neg"]
    assert g.inputs[-1] is a


def test_fold_evaluates_constant_subgraphs():
    x = x_in()
    c = E.exp(E.mul(np.float64(2.0) * np.ones(4), 0.5))
    g = fold_constants(Graph([x], [E.add(x, c)]))
    assert op_names(g) == ["add"]
    const = [v for v in g.nodes[0].inputs if v.kind == CONST][0]
    np.testing.assert_allclose(const.data, np.exp(np.ones(4)))


def test_fold_leaves_stateful_ops():
    from cgvm.ops.registry import defop

    if "test_stateful_counter" not in cgvm.ops.all_ops():
        op = defop("test_stateful_counter", stateful=True, infer=lambda t: t[0])
        op.kernel(lambda xp, x, out=None: x + 1)
    op = cgvm.ops.lookup("test_stateful_counter")
    g = fold_constants(Graph([], [op(np.ones(2))]))
    assert op_names(g) == ["test_stateful_counter"]


def test_cse_merges_identical_nodes_and_small_constants():
    x = x_in()
    a1, a2 = E.exp(E.add(x, 1.0)), E.exp(E.add(x, 1.0))
    g = eliminate_common_subexpressions(Graph([x], [E.mul(a1, a2)]))
    assert op_names(g) == ["add", "exp", "mul"]
    f = cgvm.compile([x], E.mul(a1, a2))
    v = np.arange(4.0)
    np.testing.assert_allclose(f(v), np.exp(v + 1) ** 2)


def test_cse_respects_attributes():
    x = input_value(TensorType((2, 3), "float64"), "x")
    g = eliminate_common_subexpressions(Graph([x], [E.add(R.sum(x, axis=0), R.sum(x, axis=1)[:1]
                                                          if False else R.sum(x, axis=(0, 1)))]))
    assert op_names(g).count("sum") == 2


def test_pipeline_lists_passes_and_rejects_unknown():
    assert pass_names()[:3] == ["prune", "fold", "cse"]
    assert all(p.doc for p in PIPELINE)
    with pytest.raises(ValueError, match="unknown pass"):
        run_passes(Graph([x_in()], [x_in()]) if False else Graph([], [E.exp(np.ones(1))]), passes=["nope"])


def test_print_after_shows_ir():
    x = x_in()
    buf = io.StringIO()
    run_passes(Graph([x], [E.neg(E.exp(x))]), print_after=["cse"], out=buf)
    text = buf.getvalue()
    assert "// after cse" in text and "exp(%x)" in text and "test_passes.py" in text


def test_debug_mode_verifies_after_each_pass():
    x = x_in()
    f = cgvm.compile([x], E.exp(x), debug=True)
    np.testing.assert_allclose(f(np.zeros(4)), np.ones(4))


def test_passes_keep_results_equal_to_unoptimized():
    rng = np.random.default_rng(0)
    x = x_in()
    ws = cgvm.Workspace()
    ws["w"] = rng.standard_normal(4)
    w = param_value("w", TensorType((4,), "float64"))
    y = E.mul(E.add(E.mul(x, w), E.exp(np.ones(4))), E.add(E.mul(x, w), E.exp(np.ones(4))))
    full = cgvm.compile([x], y, workspace=ws)
    bare = cgvm.compile([x], y, workspace=ws, passes=[], plan=False)
    v = rng.standard_normal(4)
    np.testing.assert_allclose(full(v), bare(v))
    assert len(full.graph.nodes) < len(bare.graph.nodes)
