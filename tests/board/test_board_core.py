"""cgvm.board's writer, graph and profiler, read back with TensorBoard's own EventAccumulator."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.compat.proto import config_pb2  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

import cgvm  # noqa: E402
import cgvm.theano as theano  # noqa: E402
import cgvm.theano.tensor as T  # noqa: E402
from cgvm.board import BEFORE_PASSES_TAG, OpProfiler, SummaryWriter, graph_def, op_names  # noqa: E402
from cgvm.ir import TensorType, input_value, param_value  # noqa: E402
from cgvm.ops import conv as C  # noqa: E402
from cgvm.ops import elementwise as E  # noqa: E402
from cgvm.ops import reduce as R  # noqa: E402

RNG = np.random.default_rng(3)


def read(run_dir) -> EventAccumulator:
    ea = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    ea.Reload()
    return ea


def points(ea, tag):
    return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in ea.Tensors(tag)]


def test_scalars_histograms_images_text_read_back(tmp_path):
    w_shared = theano.shared(RNG.standard_normal((5, 7)).astype(np.float32), name="W")
    with SummaryWriter(tmp_path / "run") as w:
        for step in range(6):
            w.add_scalar("loss", np.float32(1.0 / (step + 1)), step)
        w.add_histogram("W", w_shared, 3)
        w.add_histogram("t", cgvm.Tensor(np.arange(10, dtype=np.float32)), 3)
        w.add_image("img", np.linspace(0, 1, 4 * 6 * 3).reshape(4, 6, 3), 1)
        w.add_text("note", "hello **board**", 0)
    ea = read(tmp_path / "run")
    assert points(ea, "loss") == [(s, pytest.approx(1.0 / (s + 1))) for s in range(6)]
    hist = tensor_util.make_ndarray(ea.Tensors("W")[0].tensor_proto)   # [k, 3]: left, right, count
    assert hist[:, 2].sum() == 35 and hist[0, 0] == pytest.approx(w_shared.get_value().min())
    assert hist[-1, 1] == pytest.approx(w_shared.get_value().max())
    img = ea.Tensors("img")[0].tensor_proto.string_val
    assert img[0] == b"6" and img[1] == b"4" and img[2].startswith(b"\x89PNG")
    assert tensor_util.make_ndarray(ea.Tensors("note")[0].tensor_proto).item() == b"hello **board**"
    t = tensor_util.make_ndarray(ea.Tensors("t")[0].tensor_proto)
    assert t[:, 2].sum() == 10 and t[0, 0] == 0.0 and t[-1, 1] == 9.0
    with pytest.raises(TypeError, match="symbolic"):
        SummaryWriter(tmp_path / "x").add_scalar("bad", input_value(TensorType(()), "x"), 0)


def _chain_graph():
    x = input_value(TensorType((None, 8)), "x")
    w = param_value("layer/w", TensorType((8, 8)))
    y = E.tanh(E.add(E.mul(x, 2.0), 1.0))        # a fusible chain
    return x, w, R.sum(E.mul(y, w))


def test_graph_def_has_every_op_with_shapes_dtypes_and_fused_groups(tmp_path):
    ws = cgvm.Workspace()
    ws["layer/w"] = np.ones((8, 8), np.float32)
    x, w, out = _chain_graph()
    f = cgvm.compile([x], out, workspace=ws)
    fused = [n for n in f.graph.nodes if n.op.name == "fused_elementwise"]
    assert fused, "the chain should have been fused"
    gd = graph_def(f.graph)
    by_name = {n.name: n for n in gd.node}
    program = fused[0].attrs["program"]
    group = [n for n in gd.node if n.name.startswith("fused_elementwise/") and n.op != "Const"]
    assert [n.op for n in group] == [step[0] for step in program]   # one op per program step
    assert by_name["x"].op == "Input" and by_name["layer/w"].op == "Parameter"
    assert [d.size for d in by_name["x"].attr["_output_shapes"].list.shape[0].dim] == [-1, 8]
    assert by_name["x"].attr["dtype"].type == 1     # DT_FLOAT
    # every input names a node of the graph; ops are the IR's non-fused nodes plus the fused steps
    names = set(by_name)
    assert all(i.split(":")[0] in names for n in gd.node for i in n.input)
    plain = [n for n in f.graph.nodes if n.op.name != "fused_elementwise"]
    assert len(op_names(gd)) == len(plain) + sum(len(n.attrs["program"]) for n in fused)
    unexpanded = graph_def(f.graph, expand_fused=False)
    assert len(op_names(unexpanded)) == len(f.graph.nodes)

    with SummaryWriter(tmp_path / "g") as sw:
        sw.add_graph(f)
    ea = read(tmp_path / "g")
    got = ea.Graph()
    assert sorted(n.name for n in got.node) == sorted(names)
    before = config_pb2.RunMetadata.FromString(ea.Tensors(BEFORE_PASSES_TAG)[0].tensor_proto.string_val[0])
    src_ops = op_names(before.function_graphs[0].pre_optimization_graph)
    assert len(src_ops) == len(f.source_graph.nodes) == 5
    assert {n.split("/")[-1].rstrip("_0123456789") for n in src_ops} == {"mul", "add", "tanh", "sum"}


def test_conv_bias_act_expands_to_conv_and_activation():
    x = input_value(TensorType((2, 3, 8, 8)), "x")
    k = param_value("c/w", TensorType((4, 3, 3, 3)))
    b = param_value("c/b", TensorType((4,)))
    ws = cgvm.Workspace()
    ws["c/w"], ws["c/b"] = np.ones((4, 3, 3, 3), np.float32), np.zeros(4, np.float32)
    f = cgvm.compile([x], R.sum(E.relu(C.conv(x, k, b))), workspace=ws)
    assert "conv_bias_act" in [n.op.name for n in f.graph.nodes], "conv + relu should fuse into conv_bias_act"
    gd = graph_def(f.graph)
    group = [n for n in gd.node if n.name.startswith("conv_bias_act/")]
    assert [n.op for n in group] == ["conv", "relu"]
    assert group[1].input == [group[0].name] and list(group[0].input) == ["x", "c/w", "c/b"]
    assert [d.size for d in group[1].attr["_output_shapes"].list.shape[0].dim] == [2, 4, 6, 6]


def test_theano_names_become_scopes_and_training_nodes_gradients_and_updates(tmp_path):
    x = T.fmatrix("x")
    W = theano.shared(RNG.standard_normal((3, 4)).astype(np.float32), name="W")
    h = T.tanh(T.dot(x, W))
    h.name = "hidden"
    cost = T.sum(h ** 2)
    cost.name = "cost"
    f = theano.function([x], cost, updates=[(W, W - np.float32(0.1) * T.grad(cost, W))])
    builder = f.write_graph(str(tmp_path / "t"))
    names = [n.name for n in builder.out.node]
    assert any(n.startswith("hidden/") for n in names) and any(n.startswith("cost/") for n in names)
    assert any(n.startswith("gradients/") for n in names) and any(n.startswith("updates/") for n in names)
    # the run's graph: sum(h ** 2) is simplified to one sum_squares(h), in the scope of the cost it is
    assert "W" in names and "hidden/tanh" in names and "cost/sum_squares" in names
    ea = read(tmp_path / "t")
    assert sorted(n.name for n in ea.Graph().node) == sorted(names)


def test_profiler_times_every_instruction_and_restores_the_function(tmp_path):
    ws = cgvm.Workspace()
    ws["layer/w"] = np.ones((8, 8), np.float32)
    x, w, out = _chain_graph()
    f = cgvm.compile([x], out, workspace=ws)
    arg = RNG.standard_normal((8, 8)).astype(np.float32)
    want = f(arg)
    frames_before = dict(f.executable.frames)
    kernels_before = list(f.executable.kernels)
    with OpProfiler(f) as prof:
        f(arg)   # rebuilds the frame with timed kernels, outside any step
        for i in range(3):
            with prof.step(f"step {i}"):
                got = f(arg)
    assert got == pytest.approx(want)
    assert f.executable.kernels == kernels_before and dict(f.executable.frames) == frames_before
    n_calls = f.program.n_calls
    steps = prof.per_step()
    assert [len(s) for s in steps] == [n_calls] * 3
    for (label, s0, s1), recs in zip(prof.steps, steps):
        assert all(s0 <= a <= b <= s1 for _, a, b in recs)
    with SummaryWriter(tmp_path / "p") as sw:
        builder, trace = prof.write(sw, trace_path=str(tmp_path / "p" / "t.trace.json"))
    ea = read(tmp_path / "p")
    meta = config_pb2.RunMetadata.FromString(ea.Tensors("profile")[0].tensor_proto.string_val[0])
    stats = meta.step_stats.dev_stats[0].node_stats
    graph_names = {n.name for n in meta.function_graphs[0].pre_optimization_graph.node}
    assert len(stats) == n_calls and {s.node_name for s in stats} <= graph_names
    events = json.load(open(trace))["traceEvents"]
    assert sum(e.get("cat") == "step" for e in events) == 3
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") != "step"]
    assert len(ops) == 3 * n_calls and {e["name"] for e in ops} <= graph_names
    assert all(e["dur"] >= 0 for e in ops)


def test_missing_tensorboard_says_how_to_install(tmp_path, monkeypatch):
    from cgvm.board import TensorBoardUnavailable

    for name in [m for m in sys.modules if m == "tensorboard" or m.startswith("tensorboard.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(TensorBoardUnavailable, match=r"pip install 'cgvm\[board\]'"):
        SummaryWriter(tmp_path / "r")


def test_compiled_function_writes_its_graph(tmp_path):
    ws = cgvm.Workspace()
    ws["layer/w"] = np.ones((8, 8), np.float32)
    x, w, out = _chain_graph()
    f = cgvm.compile([x], out, workspace=ws)
    builder = f.write_graph(str(tmp_path / "f"), before_passes=False)
    ea = read(tmp_path / "f")
    assert sorted(n.name for n in ea.Graph().node) == sorted(n.name for n in builder.out.node)
    assert BEFORE_PASSES_TAG not in ea.Tags()["tensors"]
    assert {builder.stat_name[id(n)] for n in f.graph.nodes} <= {n.name for n in builder.out.node}


def test_loop_bodies_are_groups_inside_their_node(tmp_path):
    x = T.fvector("x")
    scale = theano.shared(np.float32(3.0), name="scale")
    res, _ = theano.scan(lambda v, acc: acc + v * scale, sequences=[x], outputs_info=[np.float32(0)])
    f = theano.function([x], res[-1])
    assert f(np.arange(4, dtype=np.float32)) == pytest.approx(18.0)
    scans = [n for n in f.graph.nodes if n.op.name == "scan"]
    assert scans
    gd = f.write_graph(str(tmp_path / "s")).out
    names = {n.name: n for n in gd.node}
    assert names["scan/scan"].op == "scan"
    body = scans[0].attrs["body"]
    inner = [n for n in gd.node if n.name.startswith("scan/body/") and n.op not in ("Input", "Parameter", "Const")]
    assert sorted(n.op for n in inner) == sorted(n.op.name for n in body.nodes)
    assert len([n for n in gd.node if n.name.startswith("scan/body/") and n.op == "Input"]) == len(body.inputs)
    assert all(i.split(":")[0] in names for n in gd.node for i in n.input)
