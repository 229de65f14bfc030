"""ONNX If / Loop / Scan on cgvm's control ops: run-time conditions, trip counts and lengths on one
compiled program, against ONNX Runtime and PyTorch; gradients through them against numeric ones;
cgvm's cond and scan exported as ONNX If and Loop, checked and run in ONNX Runtime."""
from __future__ import annotations

import io

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

import cgvm  # noqa: E402
import cgvm.onnx  # noqa: E402
from cgvm.ir import TensorType, input_value  # noqa: E402
from cgvm.ops import elementwise as E, reduce as R  # noqa: E402

rng = np.random.default_rng(0)


def numeric_grad(fn, inputs, k, eps):
    """Central differences of the scalar ``fn(inputs)`` with respect to ``inputs[k]``."""
    x = inputs[k]
    g = np.zeros_like(x)
    for j in range(x.size):
        old = x.flat[j]
        x.flat[j] = old + eps
        plus = fn(inputs)
        x.flat[j] = old - eps
        minus = fn(inputs)
        x.flat[j] = old
        g.flat[j] = (plus - minus) / (2 * eps)
    return g


def vi(name, shape, dt=np.float32):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)


def model_of(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "m", inputs, outputs, initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset < 15 else 10
    onnx.checker.check_model(m, full_check=True)
    return m


def run_ort(model, *arrays):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), arrays)})


def assert_one_program(m):
    """The model was compiled once for its input shapes and never read an input's value as static
    (which would recompile it for every new value)."""
    entries = list(m._cache.values())
    assert len(entries) == 1 and entries[0][0] == {}, [sorted(e[0]) for e in entries]


def node_names(fn):
    return {n.op.name for n in fn.graph.nodes}


# --------------------------------------------------------------------------- models

def if_model(dt=np.float32):
    """y = x * W if c else tanh(x - W) + sum(x): W is an initializer both branches capture."""
    W = numpy_helper.from_array(rng.standard_normal(3).astype(dt), "W")
    then = helper.make_graph([helper.make_node("Mul", ["x", "W"], ["t"])], "then", [], [vi("t", [3], dt)])
    els = helper.make_graph([helper.make_node("Sub", ["x", "W"], ["e0"]), helper.make_node("Tanh", ["e0"], ["e1"]),
                             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                             helper.make_node("Add", ["e1", "s"], ["e"])], "else", [], [vi("e", [3], dt)])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els)
    return model_of([node], [vi("x", [3], dt), vi("c", [], np.bool_)], [vi("y", [3], dt)], [W])


def loop_model(dt=np.float32, trip=True):
    """h <- tanh(h * W) + 0.5 while sum(h) < limit, at most M times (M left out: a while loop);
    outputs the final h, every h, and iter * 1.0 per step (the body reads the iteration number)."""
    W = numpy_helper.from_array((0.5 + rng.random(2)).astype(dt), "W")
    half = numpy_helper.from_array(np.asarray(0.5, dt), "half")
    body = helper.make_graph(
        [helper.make_node("Mul", ["h_in", "W"], ["hw"]), helper.make_node("Tanh", ["hw"], ["th"]),
         helper.make_node("Add", ["th", "half"], ["h_out"]),
         helper.make_node("ReduceSum", ["h_out"], ["s"], keepdims=0),
         helper.make_node("Less", ["s", "limit"], ["cond_out"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=helper.np_dtype_to_tensor_dtype(np.dtype(dt))),
         helper.make_node("Identity", ["h_out"], ["h_scan"])],
        "body", [vi("i", [], np.int64), vi("cond_in", [], np.bool_), vi("h_in", [2], dt)],
        [vi("cond_out", [], np.bool_), vi("h_out", [2], dt), vi("h_scan", [2], dt), vi("i_f", [], dt)],
        initializer=[half])
    node = helper.make_node("Loop", ["M" if trip else "", "c0", "x"], ["h", "hs", "its"], body=body)
    ins = ([vi("M", [], np.int64)] if trip else []) + [vi("c0", [], np.bool_), vi("x", [2], dt), vi("limit", [], dt)]
    return model_of([node], ins, [vi("h", [2], dt), vi("hs", [None, 2], dt), vi("its", [None], dt)], [W])


def scan_model(dt=np.float32):
    """Scan (opset 11) over axis 1 of X backwards: s <- s + x_t * W, y_t = s * s, stacked on axis 1
    in reverse."""
    W = numpy_helper.from_array(rng.standard_normal(2).astype(dt), "W")
    body = helper.make_graph(
        [helper.make_node("Mul", ["x_t", "W"], ["xw"]), helper.make_node("Add", ["s_in", "xw"], ["s_out"]),
         helper.make_node("Mul", ["s_out", "s_out"], ["y_t"])],
        "body", [vi("s_in", [2], dt), vi("x_t", [2], dt)], [vi("s_out", [2], dt), vi("y_t", [2], dt)])
    node = helper.make_node("Scan", ["s0", "X"], ["s", "Y"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1],
                            scan_output_directions=[1])
    return model_of([node], [vi("s0", [2], dt), vi("X", [2, None], dt)], [vi("s", [2], dt), vi("Y", [2, None], dt)],
                    [W], opset=11)


def scan8_model():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Neg", ["s_out"], ["y_t"])],
        "body", [vi("s_in", [2]), vi("x_t", [2])], [vi("s_out", [2]), vi("y_t", [2])])
    node = helper.make_node("Scan", ["", "s0", "X"], ["s", "Y"], body=body, num_scan_inputs=1, directions=[1])
    return model_of([node], [vi("s0", [3, 2]), vi("X", [3, 4, 2])], [vi("s", [3, 2]), vi("Y", [3, 4, 2])], opset=8)


# --------------------------------------------------------------------------- If

def test_if_with_a_run_time_condition_is_one_cond_program():
    proto = if_model()
    m = cgvm.onnx.load(proto, workspace=cgvm.Workspace())
    fn = m.compile()
    assert "cond" in node_names(fn)
    for c in (True, False, True):
        x = rng.standard_normal(3).astype(np.float32)
        want = run_ort(proto, x, np.array(c))[0]
        np.testing.assert_allclose(fn(x, np.array(c))[0], want, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(m.run([x, np.array(c)])[0], want, rtol=1e-6, atol=1e-6)
    assert_one_program(m)       # one specialization serves both conditions


@pytest.mark.parametrize("c", [True, False])
def test_gradient_through_an_imported_if(c):
    check_param_gradient(if_model(np.float64), lambda x: [x, np.array(c)], 3, out=0)


# --------------------------------------------------------------------------- Loop

LOOP_CASES = [(5, True, 1e9), (50, True, 1.2), (0, True, 1e9), (5, False, 1e9), (1, True, -5.0)]


def test_loop_with_run_time_trip_count_and_condition_is_one_scan_program():
    proto = loop_model()
    m = cgvm.onnx.load(proto, workspace=cgvm.Workspace())
    fn = m.compile()
    assert "scan" in node_names(fn)
    for trip, c0, limit in LOOP_CASES:
        args = [np.array(trip, np.int64), np.array(c0), rng.standard_normal(2).astype(np.float32),
                np.array(limit, np.float32)]
        want = run_ort(proto, *args)
        for got in (fn(*args), m.run(args)):
            assert [np.asarray(g).shape for g in got] == [w.shape for w in want]
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    assert_one_program(m)


def test_while_loop_without_a_trip_count():
    proto = loop_model(trip=False)
    m = cgvm.onnx.load(proto, workspace=cgvm.Workspace())
    for limit in (0.2, 1.0, 1.5):   # below the fixed point of h: every loop ends
        args = [np.array(True), np.full(2, -0.5, np.float32), np.array(limit, np.float32)]
        want = run_ort(proto, *args)
        got = m.run(args)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    assert_one_program(m)


@pytest.mark.parametrize("limit", [1e9, 1.5])
def test_gradient_through_an_imported_loop(limit):
    check_param_gradient(loop_model(np.float64), lambda x: [np.array(6, np.int64), np.array(True), x,
                                                            np.array(limit)], 2, out=1)


def test_fine_tuning_through_an_imported_loop_lowers_the_loss():
    ws = cgvm.Workspace()
    m = cgvm.onnx.load(loop_model(), workspace=ws)
    syms = [input_value(TensorType((), "int64"), "M"), input_value(TensorType((), "bool"), "c0"),
            input_value(TensorType((2,), "float32"), "x"), input_value(TensorType((), "float32"), "limit")]
    h = m.symbolic(*syms)[0]
    loss = R.sum(E.mul(E.sub(h, 0.9), E.sub(h, 0.9)))
    W = m.params["W"]
    (gW,) = cgvm.grad(loss, [W])
    step = cgvm.compile(syms, loss, workspace=ws, updates={W: E.sub(W, E.mul(gW, 0.5))})
    args = [np.array(4, np.int64), np.array(True), np.array([0.1, -0.2], np.float32), np.array(1e9, np.float32)]
    losses = [float(step(*args)) for _ in range(20)]
    assert losses[-1] < 0.5 * losses[0]


# --------------------------------------------------------------------------- Scan

def test_scan_with_axes_and_directions_matches_onnxruntime():
    proto = scan_model()
    m = cgvm.onnx.load(proto, workspace=cgvm.Workspace())
    for T in (4, 1, 7):
        args = [rng.standard_normal(2).astype(np.float32), rng.standard_normal((2, T)).astype(np.float32)]
        for g, w in zip(m.run(args), run_ort(proto, *args)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    fn = m.compile()
    assert "scan" in node_names(fn)


def test_batched_scan8_matches_onnxruntime():
    proto = scan8_model()
    m = cgvm.onnx.load(proto, workspace=cgvm.Workspace())
    args = [rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal((3, 4, 2)).astype(np.float32)]
    for g, w in zip(m.run(args), run_ort(proto, *args)):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_gradient_through_an_imported_scan():
    check_param_gradient(scan_model(np.float64), lambda x: [x[:2], x.reshape(2, 3)], 6, out=1)


def check_param_gradient(proto, make_inputs, n, out):
    """d sum(out^2) / d W by cgvm.grad through the imported model against central differences."""
    ws = cgvm.Workspace()
    m = cgvm.onnx.load(proto, workspace=ws)
    inputs = make_inputs(rng.standard_normal(n))
    syms = [input_value(TensorType(a.shape, a.dtype), f"in{k}") for k, a in enumerate(inputs)]
    y = m.symbolic(*syms)[out]
    loss = R.sum(E.mul(y, y))
    W = m.params["W"]
    f = cgvm.compile(syms, loss, workspace=ws)
    g = cgvm.compile(syms, cgvm.grad(loss, [W]), workspace=ws)
    w0 = np.array(ws["W"])

    def at(v):
        ws["W"] = v[0]
        return float(f(*inputs))

    num = numeric_grad(at, [w0.copy()], 0, 1e-6)
    ws["W"] = w0
    np.testing.assert_allclose(g(*inputs)[0], num, rtol=1e-5, atol=1e-8)
    assert np.abs(num).max() > 1e-3     # the gradient is not trivially zero


# --------------------------------------------------------------------------- PyTorch

def test_torchscript_control_flow_exports_and_imports():
    torch = pytest.importorskip("torch")

    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, n):
            h = x
            for _ in range(int(n)):
                h = torch.tanh(self.lin(h))
            if bool(h.sum() > 0):
                y = h * 2.0
            else:
                y = -h
            return y

    torch.manual_seed(0)
    module = torch.jit.script(Gated().eval())
    x0, n0 = torch.randn(2, 4), torch.tensor(2)
    buf = io.BytesIO()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x0, n0), buf, dynamo=False, input_names=["x", "n"], output_names=["y"],
                          opset_version=17)
    proto = onnx.load_from_string(buf.getvalue())
    ops = {nd.op_type for nd in proto.graph.node}
    assert {"Loop", "If"} <= ops
    m = cgvm.onnx.load(proto, workspace=cgvm.Workspace())
    for n in (2, 0, 5, 1):
        for sign in (1.0, -1.0):
            x = sign * torch.randn(2, 4).abs()
            want = module(x, torch.tensor(n)).detach().numpy()
            got = m.run([x.numpy(), np.array(n, np.int64)])[0]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert_one_program(m)       # every trip count and branch on one compiled program


# --------------------------------------------------------------------------- export

def test_theano_scan_and_ifelse_export_as_loop_and_if():
    import cgvm.theano as theano
    import cgvm.theano.tensor as T
    from cgvm.theano.ifelse import ifelse

    X = T.matrix("X")
    c = T.scalar("c")
    w = theano.shared(rng.standard_normal(3), name="w")
    hs, _ = theano.scan(lambda x_t, h: T.tanh(x_t * w + h), sequences=X, outputs_info=T.zeros((3,)))
    backwards, _ = theano.scan(lambda x_t, h: h * 0.5 + x_t, sequences=X, outputs_info=T.zeros((3,)),
                               go_backwards=True)
    y = ifelse(T.gt(c, 0), hs[-1] * 2.0, backwards[-1] - w)
    f = theano.function([X, c], [y, hs, backwards])
    exported = cgvm.onnx.export(f)        # checked with full_check inside
    ops = {nd.op_type for nd in exported.graph.node}
    assert {"Loop", "If"} <= ops
    for T_, cv in ((4, 1.0), (1, -1.0), (6, -1.0)):
        args = [rng.standard_normal((T_, 3)), np.array(cv)]
        for got, want in zip(run_ort(exported, *args), f(*args)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)


def test_core_while_scan_exports_as_loop_with_a_condition():
    from cgvm.ir import Graph
    from cgvm.ops import control as C

    h, limit = input_value(TensorType((2,), "float32"), "h"), input_value(TensorType((), "float32"), "limit")
    new = E.mul(h, 2.0)
    body = Graph([h, limit], [new, E.gt(R.sum(new), limit)], name="double")
    H0, L0 = input_value(TensorType((2,), "float32"), "H0"), input_value(TensorType((), "float32"), "L0")
    bound = input_value(TensorType((), "int64"), "bound")
    final, stack = C.scan(H0, L0, bound, body=body, n_carry=1, has_until=True, dyn_steps=True)
    fn = cgvm.compile([H0, L0, bound], [final, stack])
    exported = cgvm.onnx.export(fn)
    for limit_v, b in ((100.0, 50), (1e6, 3), (5.0, 0)):
        args = [np.array([0.5, 1.0], np.float32), np.array(limit_v, np.float32), np.array(b, np.int64)]
        for got, want in zip(run_ort(exported, *args), fn(*args)):
            np.testing.assert_allclose(got, want)
        # and back: the exported Loop imports onto scan again
        back = cgvm.onnx.load(exported, workspace=cgvm.Workspace())
        for got, want in zip(back.run(args), fn(*args)):
            np.testing.assert_allclose(got, want)
