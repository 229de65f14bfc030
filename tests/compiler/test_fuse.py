"""Fusion: elementwise chains as one fused_elementwise kernel; GEMM/conv + bias + activation epilogues.

Each rewrite is checked twice: the optimized graph's ops (before/after), and its results against
the unoptimized program (``passes=[]``) within float32 tolerance.
"""
import re
from pathlib import Path

import numpy as np
import pytest

import cgvm
from cgvm.compiler import pass_names
from cgvm.compiler.fuse import fuse_elementwise
from cgvm.errors import CgvmError
from cgvm.ir import Graph, TensorType, input_value, param_value
from cgvm.ops import conv as C
from cgvm.ops import elementwise as E
from cgvm.ops import fused as F
from cgvm.ops import linalg as L
from cgvm.ops import reduce as R
from cgvm.vm import eval_graph
from shared_paths import SHARED_CAFFE_MODELS

RNG = np.random.default_rng(0)
TOL = dict(rtol=1e-5, atol=1e-6)


def ops(f):
    return [n.op.name for n in f.graph.nodes]


def pair(inputs, outputs, passes=None, **kw):
    """(optimized, unoptimized) compilations of the same outputs."""
    return cgvm.compile(inputs, outputs, passes=passes, **kw), cgvm.compile(inputs, outputs, passes=[], **kw)


def check_same(f, bare, *args, **tol):
    got, want = f(*args), bare(*args)
    for g, w in zip(got if isinstance(got, list) else [got], want if isinstance(want, list) else [want]):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, **(tol or TOL))


def vec(n, dtype=np.float32):
    return np.linspace(-1.5, 1.5, n).astype(dtype)


def chain(x, n):
    y = x
    for i in range(n):
        y = [lambda v: E.add(v, 0.5), lambda v: E.mul(v, 0.9), E.tanh, lambda v: E.sub(v, 0.25)][i % 4](y)
    return y


# --------------------------------------------------------------------------- elementwise chains

def test_chain_becomes_one_kernel_in_one_buffer():
    x = input_value(TensorType((None,)), "x")
    f, bare = pair([x], chain(x, 100))
    assert len(ops(bare)) == 100 and ops(f) == ["fused_elementwise"]
    node = f.graph.nodes[0]
    # runs of add/sub/mul by literals fold to one multiply and one add: 76 ufunc calls for 100 ops
    assert len(node.attrs["program"]) == 76
    assert node.attrs["shape_from_first"]
    for n in (1, 7, 10_000):
        check_same(f, bare, vec(n))


def test_long_scalar_chain_runs_on_python_floats_and_matches():
    x = input_value(TensorType((1,)), "x")
    f, bare = pair([x], chain(x, 1000))
    assert ops(f) == ["fused_elementwise"]
    check_same(f, bare, np.array([0.3], np.float32))
    out = f(np.array([0.3], np.float32))
    assert isinstance(out, np.ndarray) and out.shape == (1,) and out.dtype == np.float32


@pytest.mark.parametrize("shape", [(), (1,), (1, 1)])
def test_one_element_results_are_arrays_of_the_right_rank(shape):
    x = input_value(TensorType(shape), "x")
    f, bare = pair([x], E.exp(E.mul(E.add(x, 1.0), 0.5)))
    v = np.full(shape, 0.25, np.float32)
    assert ops(f) == ["fused_elementwise"]
    out = f(v)
    assert isinstance(out, np.ndarray) and out.shape == shape
    check_same(f, bare, v)


def test_special_values_match_numpy_in_the_one_element_path():
    x = input_value(TensorType((1,)), "x")
    d = input_value(TensorType((1,)), "d")
    f, bare = pair([x, d], E.log(E.div(E.add(x, 1.0), d)))
    with np.errstate(all="ignore"):
        for xv, dv in ((1.0, 0.0), (-2.0, 1.0), (0.0, 1.0), (-1.0, 0.0), (np.nan, 1.0), (1e30, 1e-30)):
            a, b = np.array([xv], np.float32), np.array([dv], np.float32)
            np.testing.assert_array_equal(f(a, b), bare(a, b))


def test_tree_materializes_side_branches_and_shared_values_are_not_recomputed():
    a = input_value(TensorType((None,)), "a")
    b = input_value(TensorType((None,)), "b")
    shared = E.exp(a)                                         # read twice: computed once, kept
    left = E.add(E.mul(shared, 2.0), 1.0)
    right = E.add(E.mul(b, 3.0), shared)
    f, bare = pair([a, b], E.tanh(E.add(left, right)))
    assert ops(f).count("exp") == 1 and ops(f).count("fused_elementwise") == 2
    check_same(f, bare, vec(9), vec(9)[::-1].copy())


def test_graph_outputs_and_values_read_twice_end_a_chain():
    x = input_value(TensorType((None,)), "x")
    y1 = E.tanh(E.mul(x, 2.0))
    y2 = E.add(E.mul(y1, 3.0), 1.0)
    f, bare = pair([x], [y1, y2])
    assert ops(f) == ["fused_elementwise", "fused_elementwise"]
    check_same(f, bare, vec(5))


def test_input_zero_is_only_read_first_so_the_output_may_overwrite_it():
    x = input_value(TensorType((None,)), "x")
    t = E.exp(x)
    y = E.add(E.mul(E.tanh(t), t), 1.0)    # t is read by the first and the second step
    f, bare = pair([x], R.sum(y))
    fused = [n for n in f.graph.nodes if n.op.name == "fused_elementwise"][0]
    program = fused.attrs["program"]
    assert 0 in program[0][1] and all(0 not in operands for _, operands in program[1:])
    check_same(f, bare, vec(1000))
    f(vec(1000))
    plan = next(iter(f.memory_plans().values()))
    assert plan.inplace   # the fused node took over a buffer that died there


def test_broadcast_bias_with_unknown_batch():
    x = input_value(TensorType((None, 3)), "x")
    b = input_value(TensorType((3,)), "b")
    f, bare = pair([x, b], E.relu(E.mul(E.add(x, b), 2.0)))
    assert ops(f) == ["fused_elementwise"]
    assert f.graph.nodes[0].attrs["shape_from_first"]
    for n in (1, 4):
        check_same(f, bare, RNG.standard_normal((n, 3)).astype(np.float32), vec(3))


def test_operand_that_may_widen_the_result_allocates_the_output_first():
    x = input_value(TensorType((None, 3)), "x")
    y = input_value(TensorType((None, 3)), "y")   # either may be the one with batch 1
    f, bare = pair([x, y], E.mul(E.tanh(E.add(x, 1.0)), y))
    assert ops(f) == ["fused_elementwise"] and not f.graph.nodes[0].attrs["shape_from_first"]
    check_same(f, bare, RNG.standard_normal((1, 3)).astype(np.float32),
               RNG.standard_normal((4, 3)).astype(np.float32))


def test_integer_chains_are_exact_and_not_reassociated():
    x = input_value(TensorType((None,), "int32"), "x")
    f, bare = pair([x], E.mul(E.sub(E.add(x, 7), 3), 5))
    assert ops(f) == ["fused_elementwise"]
    assert [name for name, _ in f.graph.nodes[0].attrs["program"]] == ["add", "subtract", "multiply"]
    v = np.arange(-5, 5, dtype=np.int32)
    np.testing.assert_array_equal(f(v), bare(v))


def test_cancelling_constants_are_not_reassociated():
    x = input_value(TensorType((None,)), "x")
    big = float(2 ** 23)
    f, bare = pair([x], E.mul(E.sub(E.add(E.tanh(x), big), big), 3.0))   # rounds tanh(x) to an integer
    assert len(f.graph.nodes[0].attrs["program"]) == 4
    np.testing.assert_array_equal(f(vec(11)), bare(vec(11)))


def test_activations_with_several_steps_and_clip_fuse():
    x = input_value(TensorType((None,)), "x")
    y = E.clip(E.sigmoid(E.mul(E.rsqrt(E.add(E.abs(x), 1.0)), 3.0)), lo=0.1, hi=0.9)
    f, bare = pair([x], E.relu(E.sub(y, 0.5)))
    assert ops(f) == ["fused_elementwise"]
    check_same(f, bare, vec(50))


def test_dtype_changes_end_a_chain():
    x = input_value(TensorType((None,)), "x")
    mask = E.gt(E.mul(x, 2.0), 0.5)                   # bool: not on the float chain
    f, bare = pair([x], E.mul(E.add(x, 1.0), E.cast(mask, dtype="float32")))
    assert "gt" in ops(f) or any(n.attrs.get("dtype") is not None and n.attrs["dtype"].name == "bool"
                                 for n in f.graph.nodes if n.op.name == "fused_elementwise")
    check_same(f, bare, vec(8))


def test_the_reference_interpreter_runs_fused_nodes():
    x = input_value(TensorType((None,)), "x")
    g = fuse_elementwise(Graph([x], [chain(x, 12)]))
    assert [n.op.name for n in g.nodes] == ["fused_elementwise"]
    bare = cgvm.compile([x], chain(x, 12), passes=[])
    np.testing.assert_allclose(eval_graph(g, [vec(6)])[0], bare(vec(6)), **TOL)


def test_fusion_can_be_left_out():
    x = input_value(TensorType((None,)), "x")
    f = cgvm.compile([x], chain(x, 8), passes=[p for p in pass_names() if p != "fuse"])
    assert "fused_elementwise" not in ops(f)


def test_bad_programs_are_refused_where_they_are_built():
    x = input_value(TensorType((3,)), "x")
    with pytest.raises(CgvmError, match="test_fuse.py"):
        F.fused_elementwise(x, program=(("no_such_ufunc", (0,)),), dtype="float32")
    with pytest.raises(CgvmError, match="input 0 must be read by the first step only"):
        F.fused_elementwise(x, program=(("exp", (0,)), ("add", ("acc", 0))), dtype="float32")
    with pytest.raises(CgvmError, match="takes 2 operands"):
        F.fused_elementwise(x, program=(("add", (0,)),), dtype="float32")


def test_hand_written_program_with_literals():
    x = input_value(TensorType((None,)), "x")
    y = input_value(TensorType((None,)), "y")
    prog = (("multiply", (0, F.lit(2.0, "float32"))), ("add", ("acc", 1)), ("maximum", ("acc", F.lit(0, "float32"))))
    f = cgvm.compile([x, y], F.fused_elementwise(x, y, program=prog, dtype="float32"))
    a, b = vec(7), vec(7)[::-1].copy()
    np.testing.assert_allclose(f(a, b), np.maximum(2 * a + b, 0), **TOL)


def test_cuda_source_for_a_program():
    prog = (("add", (0, F.lit(0.5, "float32"))), ("tanh", ("acc",)), ("maximum", ("acc", 1)))
    body = F.cuda_operation(prog, "float32")
    assert body.splitlines() == [
        "float acc;",
        "acc = (float)(((float)x0) + ((float)0.5));",
        "acc = (float)(tanh(((float)acc)));",
        "acc = (float)(((((float)acc) > ((float)x1) || ((float)acc) != ((float)acc)) ? ((float)acc) : ((float)x1)));",
        "y = acc;"]
    compare = F.cuda_operation((("greater", (0, F.lit(0.0, "float32"))),), "bool")
    assert "acc = (bool)(x0 > ((float)0.0));" in compare      # comparisons read their operands as they are
    assert F.cuda_operation((("floor_divide", (0, 1)),), "int32") is None       # no CUDA form: ufunc path
    assert F.cuda_operation((("exp", (0,)),), "float16") is None


# --------------------------------------------------------------------------- epilogues

def dense(x, w, b):
    return E.add(L.matmul(x, w), b)


@pytest.mark.parametrize("act", ["relu", "tanh", "sigmoid"])
def test_matmul_bias_activation_is_one_op(act):
    x = input_value(TensorType((None, 6)), "x")
    w = RNG.standard_normal((6, 4)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    f, bare = pair([x], getattr(E, act)(dense(x, w, b)))
    assert ops(bare) == ["matmul", "add", act] and ops(f) == ["gemm_bias_act"]
    assert f.graph.nodes[0].attrs["act"] == act
    check_same(f, bare, RNG.standard_normal((5, 6)).astype(np.float32))


def test_bias_first_operand_and_no_activation():
    x = input_value(TensorType((None, 6)), "x")
    w = RNG.standard_normal((6, 4)).astype(np.float32)
    b = RNG.standard_normal((1, 4)).astype(np.float32)
    f, bare = pair([x], E.add(b, L.matmul(x, w)))
    assert ops(f) == ["gemm_bias_act"] and f.graph.nodes[0].attrs["act"] == "none"
    check_same(f, bare, RNG.standard_normal((3, 6)).astype(np.float32))


def test_gemm_op_with_transposes_takes_the_activation():
    a = input_value(TensorType((6, 3)), "a")
    w = RNG.standard_normal((4, 6)).astype(np.float32)
    c = RNG.standard_normal(4).astype(np.float32)
    f, bare = pair([a], E.relu(L.gemm(a, w, c, trans_a=True, trans_b=True)))
    assert ops(f) == ["gemm_bias_act"]
    assert f.graph.nodes[0].attrs["trans_a"] and f.graph.nodes[0].attrs["trans_b"]
    check_same(f, bare, RNG.standard_normal((6, 3)).astype(np.float32))


def test_a_bias_that_widens_the_product_is_not_fused():
    x = input_value(TensorType((None, 6)), "x")
    w = RNG.standard_normal((6, 1)).astype(np.float32)
    b = RNG.standard_normal((5, 4)).astype(np.float32)          # (n, 1) + (5, 4) broadcasts the product
    f, bare = pair([x], E.add(L.matmul(x, w), b))
    assert "gemm_bias_act" not in ops(f)
    check_same(f, bare, RNG.standard_normal((5, 6)).astype(np.float32))


def test_training_graph_fuses_the_layer_and_shape_only_readers_follow():
    """relu's gradient reads relu's output, and sum_to_like(g, matmul) reads only the product's
    shape: the whole layer is still one op, and sum_to_like reads its result instead."""
    ws = cgvm.Workspace()
    ws["w"] = RNG.standard_normal((6, 4)).astype(np.float32)
    ws["b"] = RNG.standard_normal(4).astype(np.float32)
    x = input_value(TensorType((None, 6)), "x")
    w, b = param_value("w", TensorType((6, 4))), param_value("b", TensorType((4,)))
    loss = R.sum(E.square(E.relu(dense(x, w, b))))
    gw, gb = cgvm.grad(loss, [w, b])
    f, bare = pair([x], [loss, gw, gb], workspace=ws)
    assert "matmul" in ops(bare) and "sum_to_like" in ops(bare)
    assert ops(f).count("gemm_bias_act") == 1 and "relu" not in ops(f)
    assert [n.attrs["act"] for n in f.graph.nodes if n.op.name == "gemm_bias_act"] == ["relu"]
    check_same(f, bare, RNG.standard_normal((5, 6)).astype(np.float32), rtol=1e-5, atol=1e-5)


def test_conv_relu_is_one_op_and_a_bias_add_rides_in_the_conv():
    x = input_value(TensorType((None, 2, 6, 6)), "x")
    w = RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)
    b = RNG.standard_normal((3, 1, 1)).astype(np.float32)
    f, bare = pair([x], E.relu(E.add(C.conv(x, w, pad=1), b)))
    assert ops(bare) == ["conv", "add", "relu"] and ops(f) == ["conv_bias_act"]
    assert len(f.graph.nodes[0].inputs) == 3
    check_same(f, bare, RNG.standard_normal((2, 2, 6, 6)).astype(np.float32), rtol=1e-5, atol=1e-5)


def test_conv_read_twice_keeps_its_activation_separate():
    x = input_value(TensorType((None, 2, 5, 5)), "x")
    w = RNG.standard_normal((2, 2, 3, 3)).astype(np.float32)
    y = C.conv(x, w, pad=1)
    f, bare = pair([x], E.add(E.relu(y), y))
    assert "conv_bias_act" not in ops(f)
    check_same(f, bare, RNG.standard_normal((1, 2, 5, 5)).astype(np.float32), rtol=1e-5, atol=1e-5)


def test_fused_graphs_serialize_and_load_back():
    from cgvm.ir.serialize import graph_from_proto, graph_to_proto

    x = input_value(TensorType((None, 3)), "x")
    w = RNG.standard_normal((3, 2)).astype(np.float32)
    g = cgvm.compile([x], E.tanh(E.sub(E.relu(dense(x, w, np.ones(2, np.float32))), 0.5))).graph
    assert {n.op.name for n in g.nodes} == {"gemm_bias_act", "fused_elementwise"}
    back = graph_from_proto(graph_to_proto(g))
    assert [n.op.name for n in back.nodes] == [n.op.name for n in g.nodes]
    assert [n.attrs for n in back.nodes] == [n.attrs for n in g.nodes]
    v = RNG.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(eval_graph(back, [v])[0], eval_graph(g, [v])[0], **TOL)


# --------------------------------------------------------------------------- whole models

MODEL_DIRS = [Path(__file__).resolve().parents[2] / "models", SHARED_CAFFE_MODELS]
DEPLOY_NETS = sorted(str(p) for d in MODEL_DIRS if d.is_dir() for p in d.glob("*/*.prototxt")
                     if "solver" not in p.name and "train" not in p.name and "autoencoder" not in p.name)

RESNET_BLOCK = """name: "resnet_block"
layer { name: "data" type: "Input" top: "data" input_param { shape: { dim: 2 dim: 8 dim: 12 dim: 12 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 bias_term: false
                            weight_filler { type: "msra" } } }
layer { name: "bn1" type: "BatchNorm" bottom: "conv1" top: "conv1" batch_norm_param { use_global_stats: true } }
layer { name: "scale1" type: "Scale" bottom: "conv1" top: "conv1"
        scale_param { bias_term: true filler { type: "uniform" min: 0.5 max: 1.5 }
                      bias_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
        convolution_param { num_output: 8 kernel_size: 3 pad: 1 weight_filler { type: "msra" } } }
layer { name: "sum" type: "Eltwise" bottom: "conv2" bottom: "data" top: "sum" }
layer { name: "relu2" type: "ReLU" bottom: "sum" top: "sum" }
layer { name: "pool" type: "Pooling" bottom: "sum" top: "pool" pooling_param { pool: AVE global_pooling: true } }
layer { name: "fc" type: "InnerProduct" bottom: "pool" top: "fc" inner_product_param { num_output: 5 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def _small_batch(text):
    """The prototxt with its input batch cut to 2 (the nets declare 10 to 10000)."""
    text = re.sub(r"(shape\s*:?\s*\{\s*dim:\s*)\d+", r"\g<1>2", text)
    return re.sub(r"(input_dim:\s*)\d+", r"\g<1>2", text, count=1)


def _check_net(text, filename):
    from cgvm.frontends.caffe.graph_export import graph_from_prototxt
    from cgvm.frontends.caffe.net import Net

    net = Net(text, "TEST", filename=filename, seed=0)
    if "BatchNorm" in text:   # moving-average sums and a scale factor as a trained net has them
        for name in list(net.workspace.keys()):
            value = net.workspace[name]
            if value.ndim == 1 and value.shape[0] == 8 and "bn1" in name:
                net.workspace[name] = np.abs(RNG.standard_normal(8)).astype(np.float32) + 0.5
            elif value.shape == (1,) and "bn1" in name:
                net.workspace[name] = np.array([2.0], np.float32)
    g = graph_from_prototxt(filename, "TEST", net=net)
    f, bare = pair(list(g.inputs), list(g.outputs), workspace=net.workspace)
    args = [RNG.standard_normal([d for d in v.shape]).astype(np.float32) for v in g.inputs]
    for got, want in zip(f(*args), bare(*args)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return f, bare


@pytest.mark.parametrize("path", DEPLOY_NETS, ids=lambda p: "/".join(Path(p).parts[-2:]))
def test_every_model_gives_the_unoptimized_results(path):
    _check_net(_small_batch(Path(path).read_text()), path)


def test_resnet_block_folds_batch_norm_and_scale_through_the_caffe_frontend():
    f, bare = _check_net(RESNET_BLOCK, "resnet_block.prototxt")
    assert "batch_norm" in ops(bare) and "batch_norm" not in ops(f) and "conv" in ops(f)
    (first,) = [n for n in f.graph.nodes if n.op.name == "conv_bias_act"]
    assert first.attrs["act"] == "relu" and "layer 'relu1'" in first.source
    residual = f.graph.nodes[ops(f).index("conv") + 1]        # conv2 + data, then relu: one kernel
    assert residual.op.name == "fused_elementwise" and "layer 'relu2'" in residual.source
    assert all("test_fuse.py" not in (n.source or "") for n in f.graph.nodes)


def test_an_error_inside_a_fused_chain_names_every_op_and_its_line():
    x, y = input_value(TensorType((None,)), "x"), input_value(TensorType((None,)), "y")
    s = E.add(x, y)
    t = E.mul(s, 2.0)
    u = E.tanh(t)
    lines = [s.source, t.source, u.source]
    assert len(set(lines)) == 3   # three different lines of this file
    f = cgvm.compile([x, y], u)
    (fused,) = [n for n in f.graph.nodes if n.op.name == "fused_elementwise"]
    with pytest.raises(CgvmError) as err:
        f(np.ones(3, np.float32), np.ones(4, np.float32))   # the lengths only disagree at run time
    message = str(err.value)
    for name, line in zip(("add", "mul", "tanh"), lines):
        assert f"{name} ({line})" in message


def test_a_fused_chain_written_on_one_line_keeps_that_line():
    x = input_value(TensorType((3,)), "x")
    u = E.tanh(E.mul(E.add(x, 1.0), 2.0))
    f = cgvm.compile([x], u)
    (fused,) = [n for n in f.graph.nodes if n.op.name == "fused_elementwise"]
    assert fused.source == u.source
