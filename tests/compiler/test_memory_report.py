"""memory_report (simulated live bytes), training-graph planning and scheduling, `cgvm info --memory`.

* the simulation agrees with what NumPy really allocates during a call (tracemalloc);
* inference peaks stay within weights + the two largest live activations;
* in a training step forward activations die at their last backward use: the planned memory of an
  MLP and of a CNN step is at most half the unplanned total, thanks to the schedule pass;
* the Caffe hook `graph_from_prototxt` and the `cgvm info --memory` command.
"""
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import cgvm
from cgvm.cli import main as cli_main
from cgvm.compiler import pass_names, run_passes
from cgvm.compiler.memory_report import format_report, memory_report, training_graph
from cgvm.compiler.schedule import schedule_for_memory
from cgvm.errors import CgvmError, ShapeError
from cgvm.ir import Graph, TensorType, input_value, param_value, save_graph
from cgvm.ops import conv as C
from cgvm.ops import elementwise as E
from cgvm.ops import elementwise_math as EM
from cgvm.ops import linalg as L
from cgvm.ops import loss as LS
from cgvm.ops import pool as P
from cgvm.ops import reduce as R
from cgvm.ops import shape as S
from shared_paths import SHARED_CAFFE_MODELS

ROOT = Path(__file__).resolve().parents[2]
ALEXNET = SHARED_CAFFE_MODELS / "bvlc_alexnet" / "deploy.prototxt"


def mlp(sizes=(64, 256, 256, 256, 10), batch=None, seed=0):
    rng = np.random.default_rng(seed)
    ws = cgvm.Workspace()
    x = input_value(TensorType((batch, sizes[0])), "x")
    y = input_value(TensorType((batch,), "int64"), "y")
    params, h = [], x
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        ws[f"W{i}"] = (rng.standard_normal((a, b)) * np.sqrt(2 / a)).astype(np.float32)
        ws[f"b{i}"] = np.zeros(b, np.float32)
        w, bias = param_value(f"W{i}", TensorType((a, b))), param_value(f"b{i}", TensorType((b,)))
        params += [w, bias]
        h = E.add(L.matmul(h, w), bias)
        if i < len(sizes) - 2:
            h = EM.relu(h)
    return ws, x, y, h, params


def sgd_step(ws, x, y, logits, params, **options):
    loss = LS.softmax_cross_entropy(logits, y)
    grads = cgvm.grad(loss, params)
    return cgvm.compile([x, y], loss, workspace=ws, updates={p: E.sub(p, E.mul(g, 0.01)) for p, g in
                                                             zip(params, grads)}, **options)


def small_cnn(batch=8, seed=0):
    rng = np.random.default_rng(seed)
    ws = cgvm.Workspace()
    x = input_value(TensorType((batch, 3, 16, 16)), "x")
    y = input_value(TensorType((batch,), "int64"), "y")
    params, h, cin = [], x, 3
    for i, cout in enumerate((8, 8, 16, 16)):
        ws[f"k{i}"] = (rng.standard_normal((cout, cin, 3, 3)) * np.sqrt(2 / (9 * cin))).astype(np.float32)
        ws[f"c{i}"] = np.zeros(cout, np.float32)
        k, c = param_value(f"k{i}", TensorType((cout, cin, 3, 3))), param_value(f"c{i}", TensorType((cout,)))
        params += [k, c]
        h = EM.relu(C.conv(h, k, c, pad=1))
        if i % 2:
            h = P.max_pool(h, kernel=(2,), stride=(2,))
        cin = cout
    h = S.reshape(h, shape=(-1, 16 * 4 * 4))
    ws["fc"] = (rng.standard_normal((256, 10)) * 0.05).astype(np.float32)
    fc = param_value("fc", TensorType((256, 10)))
    return ws, x, y, L.matmul(h, fc), params + [fc]


def data(batch, features, classes=10, seed=1):
    rng = np.random.default_rng(seed)
    shape = (batch,) + tuple(features)
    return rng.standard_normal(shape).astype(np.float32), rng.integers(0, classes, batch).astype(np.int64)


def copy_workspace(ws):
    out = cgvm.Workspace()
    for name in ws._data:
        out[name] = np.array(ws[name])
    return out


# ----------------------------------------------------------------------------- the simulation


def test_simulated_allocations_match_tracemalloc():
    ws, x, y, logits, params = mlp(batch=128)
    step = sgd_step(ws, x, y, logits, params)
    args = data(128, (64,))
    held = [ws[p.name] for p in params]  # a user holding the old weights: no recycling, updates are new arrays
    step(*args)                       # planned buffers are allocated here, before the traced call
    held += [ws[p.name] for p in params]
    tracemalloc.start()
    step(*args)
    _, traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del held
    rep = memory_report(step)
    dynamic = rep["peak"] - rep["weights"] - rep["constants"] - rep["inputs"] - rep["planned"]
    assert dynamic >= rep["outputs"]  # the updated weights are new arrays
    assert abs(traced - dynamic) <= 0.05 * dynamic + 64 * 1024


def test_report_fields_are_consistent():
    ws, x, y, logits, params = mlp()
    rep = memory_report(cgvm.compile([x], logits, workspace=ws), {"x": (32, 64)})
    weights = sum(ws[p.name].nbytes for p in params)
    assert rep["weights"] == weights and rep["inputs"] == 32 * 64 * 4
    assert rep["planned"] < rep["unplanned"] and rep["liveness_peak"] < rep["unplanned"]
    assert rep["peak"] == (rep["weights"] + rep["constants"] + rep["inputs"] + rep["planned"]
                           + rep["outputs"] + rep["dynamic_peak"])
    lines = format_report(rep)
    assert lines[0].startswith("memory: peak") and "unplanned" in lines[1]
    with pytest.raises(ShapeError, match="unknown dimensions"):
        memory_report(cgvm.compile([x], logits, workspace=ws))   # batch unknown and not given
    with pytest.raises(CgvmError, match="graphs"):
        memory_report(cgvm.compile([x], logits, workspace=ws), {"x": (2, 64)}, train=True)


def test_inference_peak_is_weights_plus_two_live_activations():
    ws, x, y, logits, params = mlp(sizes=(256,) + (512,) * 8 + (10,))
    rep = memory_report(cgvm.compile([x], logits, workspace=ws), [(64, 256)])
    # ping-pong between two activation buffers (relu in place), and the last small product
    assert rep["planned"] <= 2 * 64 * 512 * 4 + 64 * 10 * 4
    assert rep["peak"] <= 1.1 * (rep["weights"] + rep["two_largest_live"])
    assert rep["unplanned"] >= 8 * rep["planned"] / 2


# ----------------------------------------------------------------------------- training graphs


@pytest.mark.parametrize("build,features", [(lambda: mlp(batch=64), (64,)), (lambda: small_cnn(), (3, 16, 16))],
                         ids=["mlp", "cnn"])
def test_training_steps_plan_at_most_half_the_unplanned_total(build, features):
    ws, x, y, logits, params = build()
    names = list(ws._data)
    fresh = copy_workspace(ws)
    planned = sgd_step(ws, x, y, logits, params)
    unplanned = sgd_step(fresh, x, y, logits, params, plan=False, inplace=False)
    rep = memory_report(planned)
    assert rep["activation_peak"] <= 0.5 * rep["unplanned"]
    args = data(x.shape[0], features)
    for _ in range(2):
        np.testing.assert_allclose(planned(*args), unplanned(*args), rtol=1e-5)
    for n in names:
        np.testing.assert_allclose(ws[n], fresh[n], rtol=1e-5, atol=1e-6)


def test_the_schedule_lets_gradients_die_layer_by_layer():
    ws, x, y, logits, params = mlp(sizes=(64,) + (128,) * 12 + (10,), batch=256)
    other = copy_workspace(ws)
    scheduled = sgd_step(ws, x, y, logits, params)
    depth_first = sgd_step(other, x, y, logits, params, passes=[p for p in pass_names() if p != "schedule"])
    a, b = memory_report(scheduled), memory_report(depth_first)
    # depth-first keeps every activation gradient alive until the weight gradients at the end
    assert a["activation_peak"] < 0.7 * b["activation_peak"]
    args = data(256, (64,))
    np.testing.assert_allclose(scheduled(*args), depth_first(*args), rtol=1e-6)
    np.testing.assert_allclose(ws["W0"], other["W0"], rtol=1e-6)


def test_schedule_leaves_inference_graphs_alone():
    ws, x, y, logits, params = mlp()
    graph = run_passes(Graph([x], [logits]))
    assert schedule_for_memory(graph) is graph


def test_report_of_a_graph_trains_and_recomputes():
    ws, x, y, logits, params = mlp(sizes=(32,) + (64,) * 16 + (10,))
    graph = Graph([x, y], [LS.softmax_cross_entropy(logits, y)])
    train = training_graph(graph)
    assert len(train.outputs) == 1 + len(params)
    plain = memory_report(graph, {"x": (128, 32), "y": (128,)}, train=True)
    rep = memory_report(graph, {"x": (128, 32), "y": (128,)}, train=True, recompute="sqrt")
    assert rep["activation_peak_without_recompute"] == plain["activation_peak"]
    assert rep["recompute_saving"] < 0.6 and rep["recomputed_nodes"] > 0
    with pytest.raises(CgvmError, match="no scalar float output"):
        training_graph(Graph([x], [logits]))


# ----------------------------------------------------------------------------- Caffe hook and CLI


@pytest.mark.skipif(not ALEXNET.is_file(), reason="shared/models/caffe not present")
def test_graph_from_prototxt_has_the_nets_inputs_params_and_outputs():
    from cgvm.frontends.caffe import graph_from_prototxt

    graph = graph_from_prototxt(str(ALEXNET))
    assert [(v.name, tuple(v.shape)) for v in graph.inputs] == [("data", (10, 3, 227, 227))]
    assert len(graph.outputs) == 1 and tuple(graph.outputs[0].shape) == (10, 1000)
    assert {p.name for p in graph.params} >= {"conv1/0", "conv1/1", "fc8/0", "fc8/1"}
    rep = memory_report(graph)
    assert rep["weights"] == 4 * 60965224                  # AlexNet's 61M parameters
    assert rep["peak"] <= 1.1 * (rep["weights"] + rep["two_largest_live"])


def test_cli_info_memory(tmp_path, capsys):
    assert cli_main(["info", "--memory", str(ROOT / "models/lenet/lenet_deploy.prototxt")]) == 0
    text = capsys.readouterr().out
    assert "memory: peak" in text and "planned" in text and "unplanned" in text
    ws, x, y, logits, params = mlp(sizes=(16,) + (32,) * 12 + (4,), batch=64)
    path = tmp_path / "mlp.cgvm"
    save_graph(Graph([x, y], [LS.softmax_cross_entropy(logits, y)], name="mlp"), str(path))
    assert cli_main(["info", "--memory", "--train", "--recompute", "sqrt", str(path)]) == 0
    text = capsys.readouterr().out
    assert "recomputation: activations" in text and "checkpoints" in text


# ----------------------------------------------------------------------------- random graphs


def random_graph(rng, n_nodes=40):
    """A random DAG of elementwise, view, reduction and matmul ops with fan-out, over (8, 8) values."""
    x = input_value(TensorType((8, 8)), "x")
    values = [x]
    for _ in range(n_nodes):
        pick = rng.integers(0, 8)
        a = values[rng.integers(max(0, len(values) - 6), len(values))]     # mostly recent values: long chains
        b = values[rng.integers(0, len(values))]                            # sometimes old ones: long lifetimes
        if pick == 0:
            v = E.add(a, b)
        elif pick == 1:
            v = E.mul(a, 0.5)
        elif pick == 2:
            v = EM.tanh(a)
        elif pick == 3:
            v = S.transpose(a, perm=(1, 0))
        elif pick == 4:
            v = S.reshape(S.reshape(a, shape=(64,)), shape=(8, 8))
        elif pick == 5:
            v = L.matmul(a, b)
        elif pick == 6:
            v = E.sub(a, S.squeeze(S.expand_dims(E.mul(b, 0.1), axis=0), axis=0))
        else:
            v = EM.relu(E.sub(a, b))
        values.append(v)
    outputs = [values[-1]] + [values[i] for i in rng.choice(len(values) - 1, 2, replace=False) if i > 0]
    return x, outputs


@pytest.mark.parametrize("seed", range(12))
def test_planned_buffers_never_clobber_live_values(seed):
    rng = np.random.default_rng(seed)
    x, outputs = random_graph(rng)
    planned = cgvm.compile([x], outputs)
    unplanned = cgvm.compile([x], outputs, plan=False, inplace=False)
    arg = rng.standard_normal((8, 8)).astype(np.float32)
    for _ in range(2):
        for a, b in zip(planned(arg), unplanned(arg)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("seed", range(12))
def test_both_allocators_keep_blocks_alive_together_apart(seed):
    from cgvm.compiler import generate
    from cgvm.compiler.memory import _arena, _lifetimes, _whole_storages, infer_slot_types

    x, outputs = random_graph(np.random.default_rng(seed), n_nodes=60)
    program = generate(run_passes(Graph([x], outputs)))
    types = infer_slot_types(program, {program.input_slots[0]: TensorType((8, 8))})
    blocks = _lifetimes(program, types, True).blocks
    assert len(blocks) > 3
    for where, sizes in (_arena(blocks), _whole_storages(blocks, 16)):
        for i, a in enumerate(blocks):
            sa, oa = where[i]
            assert oa + a.nbytes <= sizes[sa]
            for j, b in enumerate(blocks[:i]):
                sb, ob = where[j]
                if sa == sb and a.start <= b.end and b.start <= a.end:   # alive at one instruction, one storage
                    assert oa + a.nbytes <= ob or ob + b.nbytes <= oa, (a, b, where[i], where[j])


def test_a_freed_large_block_holds_several_small_values():
    """ResNet's stem: a large activation, pooled, then blocks that keep three small values alive."""
    x = input_value(TensorType((2, 8, 32, 32)), "x")
    stem = E.mul(x, 2.0)                                   # 64 KiB
    h = P.max_pool(stem, kernel=(2,), stride=(2,))         # 16 KiB, while the stem is still alive
    for _ in range(3):
        a = EM.tanh(h)
        b = E.mul(a, 0.5)                                  # h, a and b alive together
        h = E.add(E.add(b, a), h)
    f = cgvm.compile([x], R.sum(h))
    arg = np.random.default_rng(0).standard_normal((2, 8, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(f(arg), cgvm.compile([x], R.sum(h), plan=False)(arg), rtol=1e-5)
    (plan,) = f.memory_plans().values()
    assert plan.planned_bytes == 64 * 1024 + 16 * 1024    # whole buffers would need 64 + 3 x 16 KiB
