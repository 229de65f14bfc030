"""Cases for the ops users rarely write themselves: what the compiler's fusion passes produce
(fused_elementwise, gemm_bias_act, conv_bias_act), scan's plumbing for BPTT (shift_in/out/back,
first_of, place_first, reverse, pad_steps_like, steps_like), control flow built directly (scan,
cond), contiguous, grad_clip and random_draw. Each against plain NumPy; tests/ops/test_op_coverage.py
checks that every registered op has a case in some table of tests/ops."""
import numpy as np
import pytest

from cgvm.ir import Graph, TensorType, input_value
from cgvm.ops import control as C
from cgvm.ops import elementwise as E
from cgvm.ops import fused as F
from cgvm.ops import grad_control as gc
from cgvm.ops import random as rnd
from cgvm.ops import scan_plumbing as sp
from cgvm.ops import shape as S
from harness import Case, check_case, check_grad
from test_conv import ref_conv

rng = np.random.default_rng(3)


def r(*shape):
    return rng.standard_normal(shape)


def _shift_in(init, stack):
    return np.concatenate([init[None], stack[:-1]])


def _shift_out(g):
    return np.concatenate([g[1:], np.zeros_like(g[:1])])


def _shift_back(g):
    return np.concatenate([np.zeros_like(g[:1]), g[:-1]])


def _place_first(g, like):
    out = np.zeros(like.shape, g.dtype)
    out[0] = g
    return out


def _pad_to(g, like):
    out = np.zeros((like.shape[0],) + g.shape[1:], g.dtype)
    out[:g.shape[0]] = g
    return out


def _rnn_body():
    xt, hp, w = (input_value(TensorType((3,), "float64"), n) for n in ("xt", "hp", "w"))
    ht = E.tanh(E.add(E.mul(xt, w), hp))
    return Graph([xt, hp, w], [ht], name="rnn")


def _rnn_reference(xs, h0, w):
    h, hs = h0, []
    for t in range(xs.shape[0]):
        h = np.tanh(xs[t] * w + h)
        hs.append(h)
    return h, np.stack(hs)


def _cond(p, a):
    then_g = Graph([i := input_value(TensorType((3,), "float64"), "a")], [E.mul(i, i)], name="square")
    else_g = Graph([j := input_value(TensorType((3,), "float64"), "a")], [E.neg(j)], name="negate")
    return C.cond(p, a, then_graph=then_g, else_graph=else_g)


def _draw(state, a):
    shape = S.shape_of(a)
    return rnd.random_draw(state, shape, a, a, dist="uniform", dtype="float64", static_shape=(4,))


def _act(name, z):
    return {"none": z, "relu": np.maximum(z, 0), "tanh": np.tanh(z), "sigmoid": 1 / (1 + np.exp(-z))}[name]


STATE = np.array([11, 4], dtype=np.int64)

CASES = [
    Case("shift_in", sp.shift_in, [r(3), r(4, 3)], _shift_in),
    Case("shift_out", sp.shift_out, [r(4, 3)], _shift_out),
    Case("shift_back", sp.shift_back, [r(4, 3)], _shift_back),
    Case("first_of", sp.first_of, [r(4, 3)], lambda x: x[0]),
    Case("place_first", sp.place_first, [r(3), r(4, 3)], _place_first, grad_inputs=[0]),
    Case("reverse", sp.reverse, [r(4, 3)], lambda x: x[::-1]),
    Case("pad_steps_like", sp.pad_steps_like, [r(2, 3), r(5, 3)], _pad_to, grad_inputs=[0]),
    Case("steps_like", sp.steps_like, [r(5, 3), r(2, 3)], lambda x, like: x[:like.shape[0]], grad_inputs=[0]),
    Case("contiguous_of_transpose", lambda x: S.contiguous(S.transpose(x)), [r(3, 4)], lambda x: x.T),
    Case("grad_clip_wide", lambda x: gc.grad_clip(x, lower=-100.0, upper=100.0), [r(3, 4)], lambda x: x),
    Case("scan_rnn", lambda xs, h0, w: C.scan(xs, h0, w, body=_rnn_body(), n_seqs=1, n_carry=1),
         [r(4, 3), r(3), r(3)], _rnn_reference, rtol=1e-10),
    Case("scan_rnn_backwards", lambda xs, h0, w: C.scan(xs, h0, w, body=_rnn_body(), n_seqs=1, n_carry=1,
                                                        go_backwards=True),
         [r(4, 3), r(3), r(3)], lambda xs, h0, w: _rnn_reference(xs[::-1], h0, w), rtol=1e-10),
    Case("cond_then", _cond, [np.array(True), r(3)], lambda p, a: a * a, grad_inputs=[1]),
    Case("cond_else", _cond, [np.array(False), r(3)], lambda p, a: -a, grad_inputs=[1]),
    Case("random_draw_degenerate_uniform", _draw, [STATE, r(4)],
         lambda state, a: (a.copy(), np.array([11, 5], dtype=np.int64)), grad=False),
    Case("fused_elementwise", lambda a, b: F.fused_elementwise(
        a, b, program=(("multiply", (0, 1)), ("tanh", (F.ACC,)), ("add", (F.ACC, F.lit(0.5, "float64")))),
        dtype="float64"), [r(3, 4), r(4)], lambda a, b: np.tanh(a * b) + 0.5, grad=False),
    *[Case(f"gemm_bias_act_{act}", lambda a, b, c, act=act: F.gemm_bias_act(a, b, c, act=act),
           [r(3, 4), r(4, 5), r(5)], lambda a, b, c, act=act: _act(act, a @ b + c), grad=False)
      for act in ("none", "relu", "tanh", "sigmoid")],
    Case("gemm_bias_act_transposed", lambda a, b, c: F.gemm_bias_act(a, b, c, act="relu", trans_a=True, trans_b=True),
         [r(4, 3), r(5, 4), r(5)], lambda a, b, c: np.maximum(a.T @ b.T + c, 0), grad=False),
    Case("conv_bias_act_relu", lambda x, w, b: F.conv_bias_act(x, w, b, act="relu", pad=(1,)),
         [r(2, 3, 5, 5), r(4, 3, 3, 3), r(4)], lambda x, w, b: np.maximum(ref_conv(x, w, b, pad=1), 0), grad=False),
    Case("conv_bias_act_tanh_strided", lambda x, w: F.conv_bias_act(x, w, act="tanh", stride=(2,)),
         [r(1, 2, 7, 7), r(3, 2, 3, 3)], lambda x, w: np.tanh(ref_conv(x, w, stride=2)), grad=False),
]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_values_and_gradients(case, backend):
    check_case(case, backend)
    if case.grad and backend == "numpy":   # gradients are checked in float64 on the CPU
        check_grad(case)
