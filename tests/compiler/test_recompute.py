"""Recomputation (Chen et al. 2016) and the planner on real nets: same results, less memory.

* a training step with recomputation gives the results of the step without it (chains, a
  residual CNN with batch normalization, dropout), and its activation memory for a 100-block
  chain is under 0.25x the planned memory without it;
* explicit drop lists, stateful nodes, graphs without a backward pass;
* the planner changes no result on the Caffe nets of models/ and ../shared/models/caffe.
"""
from pathlib import Path

import numpy as np
import pytest

import cgvm
from cgvm.compiler import run_passes
from cgvm.compiler.cse import eliminate_common_subexpressions
from cgvm.compiler.memory_report import memory_report
from cgvm.compiler.recompute import plan_recompute, recompute
from cgvm.errors import InputError
from cgvm.ir import Graph, TensorType, input_value, param_value, verify
from cgvm.ops import conv as C
from cgvm.ops import elementwise as E
from cgvm.ops import elementwise_math as EM
from cgvm.ops import linalg as L
from cgvm.ops import loss as LS
from cgvm.ops import nn as NN
from cgvm.ops import pool as P
from cgvm.ops import shape as S
from shared_paths import SHARED_CAFFE_MODELS

ROOT = Path(__file__).resolve().parents[2]
SHARED = SHARED_CAFFE_MODELS


def dense_chain(blocks, batch=16, width=8, dropout_every=0, seed=0):
    """(workspace, inputs, loss, params) of tanh(x W + b) blocks under a softmax loss."""
    rng = np.random.default_rng(seed)
    ws = cgvm.Workspace()
    x = input_value(TensorType((batch, width)), "x")
    y = input_value(TensorType((batch,), "int64"), "y")
    params = []
    h = x
    for i in range(blocks):
        ws[f"W{i}"] = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        ws[f"b{i}"] = (0.1 * rng.standard_normal(width)).astype(np.float32)
        w, b = param_value(f"W{i}", TensorType((width, width))), param_value(f"b{i}", TensorType((width,)))
        params += [w, b]
        h = EM.tanh(E.add(L.matmul(h, w), b))
        if dropout_every and i % dropout_every == dropout_every - 1:
            ws[f"seed{i}"] = np.array(1234 + i, dtype=np.int64)
            h = NN.dropout(h, param_value(f"seed{i}", TensorType((), "int64")), ratio=0.25)
    return ws, [x, y], LS.softmax_cross_entropy(h, y), params


def train_step(ws, inputs, loss, params, **options):
    grads = cgvm.grad(loss, params)
    updates = {p: E.sub(p, E.mul(g, 0.1)) for p, g in zip(params, grads)}
    return cgvm.compile(inputs, [loss] + grads, updates=updates, workspace=ws, **options)


def copy_workspace(ws, names):
    out = cgvm.Workspace()
    for n in names:
        out[n] = np.array(ws[n])
    return out


def run_twice(build, args, **options):
    """Results of two steps without and with ``options``, on identical starting weights."""
    ws, inputs, loss, params = build()
    names = list(ws._data)
    plain = train_step(copy_workspace(ws, names), inputs, loss, params)
    other = train_step(copy_workspace(ws, names), inputs, loss, params, **options)
    return [plain(*args) for _ in range(2)], [other(*args) for _ in range(2)], plain, other


def assert_same(a, b, rtol=1e-6, atol=1e-7):
    for step_a, step_b in zip(a, b):
        for u, v in zip(step_a, step_b):
            np.testing.assert_allclose(v, u, rtol=rtol, atol=atol)


def chain_args(batch=16, width=8, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, width)).astype(np.float32), rng.integers(0, width, batch).astype(np.int64)


# ----------------------------------------------------------------------------- same results


def test_chain_with_recomputation_gives_the_same_step():
    plain_results, rec_results, plain, rec = run_twice(lambda: dense_chain(30), chain_args(), recompute="sqrt")
    assert_same(plain_results, rec_results, rtol=0, atol=0)   # the same kernels on the same values
    assert rec.recompute_plan.duplicated_nodes > 0
    assert len(rec.graph.nodes) > len(plain.graph.nodes)
    verify(rec.graph)
    for name in ("W0", "b0", "W29"):
        np.testing.assert_array_equal(rec.workspace[name], plain.workspace[name])


def test_duplicates_are_named_and_would_be_merged_by_cse():
    ws, inputs, loss, params = dense_chain(16)
    graph = run_passes(Graph(inputs, cgvm.grad(loss, params)))
    plan = plan_recompute(graph, "sqrt")
    names = [n.name for n in plan.graph.nodes if n.name and n.name.endswith("/recompute")]
    assert len(names) == plan.duplicated_nodes > 0
    # this is why recomputation runs after CSE: CSE sees the duplicates as common subexpressions
    merged = eliminate_common_subexpressions(plan.graph)
    assert len(merged.nodes) == len(graph.nodes)


def test_activation_memory_of_a_100_block_chain_drops_below_a_quarter():
    ws, inputs, loss, params = dense_chain(100, batch=64, width=16)
    plain = train_step(ws, inputs, loss, params)
    rec = train_step(ws, inputs, loss, params, recompute="sqrt")
    base, low = memory_report(plain), memory_report(rec)
    assert low["activation_peak"] <= 0.25 * base["activation_peak"]
    assert low["recompute_saving"] == pytest.approx(low["activation_peak"] / base["activation_peak"])
    # the budget search found O(sqrt(n)) checkpoints, not one per block and not none
    assert 5 <= low["recompute_checkpoints"] <= 25


def test_dropout_masks_are_kept_not_redrawn():
    build = lambda: dense_chain(12, dropout_every=3)  # noqa: E731
    plain_results, rec_results, _, rec = run_twice(build, chain_args(), recompute="sqrt")
    assert_same(plain_results, rec_results)
    assert not any(n.op.stateful for n in rec.graph.nodes if n.name and n.name.endswith("/recompute"))


def residual_cnn(seed=0):
    """conv-bn-relu blocks with identity shortcuts, pooling, a linear head: a small ResNet."""
    rng = np.random.default_rng(seed)
    ws = cgvm.Workspace()
    x = input_value(TensorType((4, 3, 12, 12)), "x")
    y = input_value(TensorType((4,), "int64"), "y")
    params = []

    def param(name, array, learned=True):
        ws[name] = array.astype(np.float32)
        v = param_value(name, TensorType(array.shape))
        if learned:
            params.append(v)
        return v

    def conv_bn(name, h, cin, cout):
        w = param(f"{name}/w", rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2 / (9 * cin)))
        scale, shift = param(f"{name}/s", np.ones(cout)), param(f"{name}/b", np.zeros(cout))
        mean, var = param(f"{name}/m", np.zeros(cout), False), param(f"{name}/v", np.ones(cout), False)
        return NN.batch_norm(C.conv(h, w, pad=1), mean, var, scale, shift, training=True)[0]

    h = EM.relu(conv_bn("stem", x, 3, 8))
    for i in range(4):
        r = EM.relu(conv_bn(f"b{i}a", h, 8, 8))
        h = EM.relu(E.add(conv_bn(f"b{i}b", r, 8, 8), h))
    h = S.reshape(P.global_avg_pool(P.max_pool(h, kernel=(2,), stride=(2,))), shape=(-1, 8))
    w = param("fc/w", rng.standard_normal((8, 5)) * 0.5)
    logits = L.matmul(h, w)
    return ws, [x, y], LS.softmax_cross_entropy(logits, y), params


def test_residual_cnn_with_batch_norm_gives_the_same_step():
    rng = np.random.default_rng(3)
    args = (rng.standard_normal((4, 3, 12, 12)).astype(np.float32), rng.integers(0, 5, 4).astype(np.int64))
    plain_results, rec_results, plain, rec = run_twice(residual_cnn, args, recompute="sqrt")
    assert_same(plain_results, rec_results, rtol=1e-5, atol=1e-6)
    assert rec.recompute_plan.checkpoints and rec.recompute_plan.dropped
    assert memory_report(rec)["activation_peak"] < memory_report(plain)["activation_peak"]


# ----------------------------------------------------------------------------- explicit lists, edge cases


def test_an_explicit_list_drops_exactly_those_values():
    ws, inputs, loss, params = dense_chain(6)
    h = loss.node.inputs[0]
    chosen = []
    while h.node is not None and len(chosen) < 3:   # walk back: the tanh outputs of the last blocks
        if h.node.op.name == "tanh":
            chosen.append(h)
        h = h.node.inputs[0]
    step = train_step(ws, inputs, loss, params, recompute=chosen[1:])
    plan = step.recompute_plan
    # the passes may fuse or rebuild the nodes: the plan names their values in the compiled graph
    assert len(plan.dropped) == 2 and all(v.type == c.type for v, c in zip(plan.dropped, chosen[1:]))
    assert plan.duplicated_nodes >= len(chosen[1:])     # at least the producer of each dropped value
    names = list(ws._data)
    reference = train_step(copy_workspace(ws, names), inputs, loss, params)
    args = chain_args()
    assert_same([reference(*args)], [step(*args)], rtol=0, atol=0)


def test_explicit_lists_refuse_random_values_and_graphs_without_gradients():
    ws, inputs, loss, params = dense_chain(6, dropout_every=2)
    dropped = next(n.outputs[0] for n in Graph(inputs, [loss]).nodes if n.op.name == "dropout")
    with pytest.raises(InputError, match="stateful"):
        train_step(ws, inputs, loss, params, recompute=[dropped])
    forward = Graph(inputs, [loss])
    assert recompute(forward, "sqrt") is forward          # nothing is read twice: unchanged
    with pytest.raises(InputError, match="gradient seed"):
        plan_recompute(forward, [loss.node.inputs[0]])
    with pytest.raises(ValueError, match="strategy"):
        plan_recompute(forward, "log")


# ----------------------------------------------------------------------------- the planner on Caffe nets


def _caffe_nets():
    fast = [ROOT / "models/lenet/lenet_deploy.prototxt", ROOT / "models/cifar10_quick/cifar10_quick_deploy.prototxt",
            SHARED / "lenet/lenet.prototxt", SHARED / "cifar10_quick/cifar10_quick.prototxt",
            SHARED / "bvlc_alexnet/deploy.prototxt", SHARED / "legacy_input_dim_caffenet/deploy.prototxt"]
    return [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in fast if p.is_file()]


@pytest.mark.no_roundtrip
@pytest.mark.parametrize("path", _caffe_nets())
def test_the_planner_keeps_caffe_net_results(path):
    from cgvm.frontends.caffe import graph_from_prototxt
    from cgvm.frontends.caffe.net import Net

    net = Net(str(path), "TEST", seed=0)
    graph = graph_from_prototxt(str(path), net=net)
    rng = np.random.default_rng(0)
    for p in graph.params:   # deploy nets have constant-zero fillers: give every blob values
        array = net.workspace[p.name]
        net.workspace[p.name] = (rng.standard_normal(array.shape) * 0.05).astype(array.dtype)
    args = [rng.standard_normal(v.shape).astype(np.float32) for v in graph.inputs]
    planned = cgvm.compile(graph.inputs, list(graph.outputs), workspace=net.workspace)
    unplanned = cgvm.compile(graph.inputs, list(graph.outputs), workspace=net.workspace, plan=False, inplace=False)
    # within float32 tolerance: where Winograd's scratch does not fit in the plan, the planned
    # program convolves by im2col (errors of a few 1e-6 of the largest value apart)
    for a, b in zip(planned(*args), unplanned(*args)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    plan = next(iter(planned.memory_plans().values()))
    assert plan.planned_bytes < plan.unplanned_bytes
