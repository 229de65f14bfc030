"""Kernel scratch planned as memory: layouts carved from a block, the planner's placement in free
memory, conv's choice of method by the block it gets, and the VM running with it."""
import tracemalloc

import numpy as np
import pytest

import cgvm
from cgvm.compiler import generate, infer_slot_types, plan_memory
from cgvm.compiler import memory as M
from cgvm.compiler.memory_report import format_report, memory_report
from cgvm.ir import Graph, TensorType, input_value, param_value
from cgvm.ops import conv as CV
from cgvm.ops.kernels import conv_im2col as IM
from cgvm.ops.kernels import conv_winograd as WG
from cgvm.ops import elementwise as E
from cgvm.ops.kernels.scratch import ALIGN, aligned_empty, layout_bytes, take

rng = np.random.default_rng(5)


def reference_conv(x, w, b, stride, pad, groups=1):
    """Direct NumPy loop over output positions (float64), for 2-D convolutions."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    og = o // groups
    y = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * stride:i * stride + kh, j * stride:j * stride + kw]
            for gi in range(groups):
                part = patch[:, gi * cg:(gi + 1) * cg].reshape(n, -1)
                y[:, gi * og:(gi + 1) * og, i, j] = part @ w[gi * og:(gi + 1) * og].reshape(og, -1).T
    return y + (0 if b is None else b.reshape(1, -1, 1, 1))


# ----------------------------------------------------------------------------- layouts

def test_take_carves_aligned_disjoint_views_of_the_block():
    layout = [("a", (3, 5), np.float32), ("b", (7,), np.float64), ("c", (2, 2), np.int64)]
    block = np.empty(layout_bytes(layout), np.uint8)
    arrays = take(np, block, layout)
    starts = []
    for name, shape, dtype in layout:
        a = arrays[name]
        assert a.shape == shape and a.dtype == dtype and np.shares_memory(a, block)
        starts.append(a.__array_interface__["data"][0] - block.__array_interface__["data"][0])
        a[...] = len(starts)
    assert all(s % ALIGN == 0 for s in starts)
    for i, (name, _, _) in enumerate(layout):   # writing one never touched another
        assert np.all(arrays[name] == i + 1)
    assert layout_bytes(layout) == 64 + 64 + 64


def test_take_allocates_without_a_block_or_with_one_too_small():
    layout = [("a", (100,), np.float32)]
    for block in (None, np.empty(399, np.uint8)):
        a = take(np, block, layout)["a"]
        assert a.shape == (100,) and (block is None or not np.shares_memory(a, block))


def test_aligned_empty_and_the_planned_buffers_start_at_cache_lines():
    for shape, dtype in (((3, 7), np.float32), ((5,), np.float64), ((2, 3, 4), np.int8)):
        for _ in range(8):    # NumPy's own allocations land on 16-byte boundaries
            a = aligned_empty(np, shape, dtype)
            assert a.shape == shape and a.dtype == dtype and a.ctypes.data % ALIGN == 0
    graph, ws = _conv_chain(size=16)
    fn = cgvm.compile(graph.inputs, graph.outputs[0], workspace=ws)
    fn(np.ones((8, 32, 16, 16), np.float32))
    buffers = next(iter(fn.executable.frames.values())).buffers
    assert buffers and all(b.ctypes.data % ALIGN == 0 for b in buffers)


# ----------------------------------------------------------------------------- conv's methods

CASES = {
    "winograd": dict(kind="winograd", x=(4, 32, 12, 12), w=(32, 32, 3, 3), stride=1, pad=1),
    "im2col-pad": dict(kind="im2col", x=(3, 4, 9, 9), w=(6, 4, 3, 3), stride=2, pad=1),
    "im2col-groups": dict(kind="im2col", x=(2, 6, 12, 12), w=(4, 3, 3, 3), stride=1, pad=0, groups=2),
    # 144 rows: the bias is added to the output, not carried in the GEMM
    "im2col-many-rows": dict(kind="im2col", x=(2, 16, 10, 10), w=(8, 16, 3, 3), stride=2, pad=1),
    "batch-last": dict(kind="batch_last", x=(16, 5, 8, 8), w=(7, 5, 3, 3), stride=1, pad=1),
    "pointwise": dict(kind="pointwise", x=(2, 8, 5, 5), w=(3, 8, 1, 1), stride=1, pad=0),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
@pytest.mark.parametrize("with_block", [True, False], ids=["block", "none"])
def test_conv_forward_in_its_scratch_matches_a_direct_loop(case, with_block):
    spec = CASES[case]
    groups = spec.get("groups", 1)
    x = rng.standard_normal(spec["x"]).astype(np.float32)
    w = (rng.standard_normal(spec["w"]) / np.sqrt(np.prod(spec["w"][1:]))).astype(np.float32)
    b = rng.standard_normal(spec["w"][0]).astype(np.float32)
    geo = CV.ConvGeometry(2, (spec["stride"],), (spec["pad"],), (1,), groups)
    kind = IM.forward_methods(x.shape, w.shape, x.dtype, geo)[0][0]
    assert kind == spec["kind"]
    need = IM.conv_forward_scratch([TensorType(x.shape), TensorType(w.shape), TensorType(b.shape)],
                                   (spec["stride"],), (spec["pad"],), (1,), groups)
    # garbage in the block: a kernel must not rely on zeroed scratch
    block = np.full(need[0], 0x7F, np.uint8) if with_block and need else None
    got = IM.conv_forward(np, x, w, b, geo, scratch=block)
    np.testing.assert_allclose(got, reference_conv(x, w, b, spec["stride"], spec["pad"], groups), rtol=2e-4, atol=2e-5)


def reference_conv_grads(x, w, g, stride, pad, groups=1):
    """(dx, dw) of sum(g * conv(x, w)) by the same loop over output positions (float64)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    og = o // groups
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    dxp, dw = np.zeros_like(xp), np.zeros(w.shape)
    for i in range(g.shape[2]):
        for j in range(g.shape[3]):
            rows, cols = slice(i * stride, i * stride + kh), slice(j * stride, j * stride + kw)
            for gi in range(groups):
                chans, outs = slice(gi * cg, (gi + 1) * cg), slice(gi * og, (gi + 1) * og)
                gij = g[:, outs, i, j].astype(np.float64)                                  # (n, og)
                dw[outs] += np.einsum("no,nckl->ockl", gij, xp[:, chans, rows, cols])
                dxp[:, chans, rows, cols] += np.einsum("no,ockl->nckl", gij, w[outs].astype(np.float64))
    return dxp[:, :, pad:pad + h, pad:pad + wd], dw


GRAD_CASES = {
    # columns of 2 samples a chunk, 3 samples: a last, partial chunk
    "padded-chunks": dict(x=(3, 4, 9, 9), w=(6, 4, 3, 3), stride=1, pad=1, budget=2 * 4 * 9 * 81 * 4),
    "strided-groups": dict(x=(2, 6, 11, 11), w=(4, 3, 3, 3), stride=2, pad=1, groups=2),
    "unpadded": dict(x=(2, 3, 30, 30), w=(5, 3, 5, 5), stride=1, pad=0),
}


@pytest.mark.parametrize("case", list(GRAD_CASES), ids=list(GRAD_CASES))
@pytest.mark.parametrize("with_block", [True, False], ids=["block", "none"])
def test_conv_gradients_in_their_scratch_match_a_direct_loop(monkeypatch, case, with_block):
    spec = GRAD_CASES[case]
    if "budget" in spec:
        monkeypatch.setattr(IM, "COLUMN_BUDGET_BYTES", spec["budget"])
        assert len(IM.sample_chunks(3, 4 * 9 * 81 * 4)) == 2
    groups = spec.get("groups", 1)
    x = rng.standard_normal(spec["x"]).astype(np.float32)
    w = rng.standard_normal(spec["w"]).astype(np.float32)
    geo = CV.ConvGeometry(2, (spec["stride"],), (spec["pad"],), (1,), groups)
    g = rng.standard_normal((x.shape[0], w.shape[0]) + geo.out_sizes(x.shape[2:], w.shape[2:])).astype(np.float32)
    attrs = dict(stride=(spec["stride"],), pad=(spec["pad"],), dilation=(1,), groups=groups)
    tx, tw, tg = TensorType(x.shape), TensorType(w.shape), TensorType(g.shape)
    need_dx = IM.conv_grad_scratch("input", [tg, tw, tx], **attrs)
    need_dw = IM.conv_grad_scratch("weight", [tx, tg, tw], **attrs)
    assert need_dx > 0 and need_dw > 0       # these sizes take the im2col kernels
    block = (lambda nbytes: np.full(nbytes, 0x7F, np.uint8)) if with_block else (lambda nbytes: None)
    dx = IM.conv_backward_input(np, g, w, x.shape[2:], geo, scratch=block(need_dx))
    dw = IM.conv_backward_weight(np, x, g, w.shape[2:], geo, scratch=block(need_dw))
    want_dx, want_dw = reference_conv_grads(x, w, g, spec["stride"], spec["pad"], groups)
    np.testing.assert_allclose(dx, want_dx, rtol=2e-4, atol=2e-4)
    np.testing.assert_allclose(dw, want_dw, rtol=2e-4, atol=2e-4)


def test_conv_forward_runs_the_first_method_whose_temporaries_fit(monkeypatch):
    x = rng.standard_normal((8, 128, 8, 8)).astype(np.float32)
    w = (rng.standard_normal((128, 128, 3, 3)) / 34).astype(np.float32)
    geo = CV.ConvGeometry(2, (1,), (1,), (1,), 1)
    winograd_bytes, im2col_bytes = IM.conv_forward_scratch([TensorType(x.shape), TensorType(w.shape)],
                                                           (1,), (1,), (1,), 1)
    assert im2col_bytes < winograd_bytes
    calls = []
    real = WG.winograd_conv2d
    monkeypatch.setattr(WG, "winograd_conv2d", lambda *a: calls.append(1) or real(*a))
    want = reference_conv(x, w, None, 1, 1)
    for nbytes, winograd_runs in ((winograd_bytes, True), (im2col_bytes, False)):
        calls.clear()
        got = IM.conv_forward(np, x, w, None, geo, scratch=np.empty(nbytes, np.uint8))
        assert bool(calls) == winograd_runs
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)


# ----------------------------------------------------------------------------- the planner

def test_scratch_goes_in_the_tightest_free_gap_of_its_instruction():
    blocks = [M._Block(1024, 0, 2), M._Block(512, 1, 1), M._Block(256, 2, 3)]
    where = [(0, 0), (0, 1024), (0, 1536)]          # one storage of 2048 bytes
    requests = [(7, 1, (512,)), (8, 2, (600, 200)), (9, 0, (4096,))]
    placed, left = M._fit_scratch(blocks, where, [2048], requests)
    assert placed[7] == (0, 1536, 512)              # t=1: block 2 is not alive yet, its bytes are free
    # t=2: gaps of 512 (block 1 is dead) and 256 bytes; 600 fits in neither, 200 in the tighter one
    assert placed[8] == (0, 1792, 200)
    assert left == {9: 4096}                        # fits nowhere: the kernel allocates


def _conv_chain(channels=32, batch=8, size=48):
    """y0 = tanh(x); y1 = conv(y0, stride 2); out = tanh(conv(y1) + y1): y0's memory is free when
    conv 2 runs (room for its scratch), and y1 is alive then (scratch written over it would show)."""
    x = input_value(TensorType((batch, channels, size, size)), "x")
    w1 = param_value("w1", TensorType((channels, channels, 3, 3)))
    w2 = param_value("w2", TensorType((channels, channels, 3, 3)))
    y1 = CV.conv(E.tanh(x), w1, stride=(2,), pad=(1,))
    out = E.add(CV.conv(y1, w2, pad=(1,)), y1)
    ws = cgvm.Workspace()
    for name in ("w1", "w2"):
        ws[name] = (rng.standard_normal((channels, channels, 3, 3)) / 17).astype(np.float32)
    return Graph([x], [E.tanh(out)]), ws


def test_planned_scratch_never_overlaps_a_value_alive_at_its_instruction():
    graph, ws = _conv_chain()
    prog = generate(graph)
    known = {prog.input_slots[0]: TensorType((8, 32, 48, 48))}
    known.update({s: TensorType(ws[name].shape) for name, s in prog.param_slots})
    types = infer_slot_types(prog, known)
    plan = plan_memory(prog, types)
    assert plan.scratch, "the convolutions' scratch was not planned"
    life = M._lifetimes(prog, types, True)
    times = {pc: t for t, pc in enumerate(pc for pc, ins in enumerate(prog.instrs) if ins.opcode == cgvm.vm.bytecode.CALL)}
    for pc, (sid, offset, nbytes) in plan.scratch.items():
        assert offset + nbytes <= plan.storage_bytes[sid]
        for s, blk in enumerate(life.block_of):
            b = life.blocks[blk] if blk is not None else None
            if b is None or not b.start <= times[pc] <= b.end or plan.storage[s] != sid:
                continue
            low = plan.offsets[s]
            assert low + types[s].nbytes <= offset or offset + nbytes <= low, f"scratch of pc {pc} overlaps slot {s}"


def test_the_vm_runs_convolutions_in_planned_scratch_without_allocating_it(monkeypatch):
    graph, ws = _conv_chain(size=64)
    planned = cgvm.compile(graph.inputs, graph.outputs[0], workspace=ws)
    unplanned = cgvm.compile(graph.inputs, graph.outputs[0], workspace=ws, plan=False, inplace=False)
    x = rng.standard_normal((8, 32, 64, 64)).astype(np.float32)
    want = unplanned(x)
    planned(x)
    plan = next(iter(planned.memory_plans().values()))
    assert plan.scratch and plan.scratch_left   # conv 2 has room in the plan, conv 1 (beside y0 and y1) none
    blocks = []
    real_take = IM.take
    monkeypatch.setattr(IM, "take", lambda xp, block, layout: blocks.append(block) or real_take(xp, block, layout))
    tracemalloc.start()
    try:
        got = planned(x)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    arena = next(iter(planned.executable.frames.values())).buffers[0]
    (sid, offset, nbytes), = plan.scratch.values()
    assert blocks[0] is None and blocks[1].nbytes == nbytes and np.shares_memory(blocks[1], arena)
    # what the call allocates is conv 1's scratch, not conv 2's on top of it
    assert peak < max(plan.scratch_left.values()) + nbytes / 4


def test_the_memory_report_counts_scratch_that_fits_nowhere_while_its_kernel_runs(monkeypatch):
    graph, ws = _conv_chain()
    fn = cgvm.compile(graph.inputs, graph.outputs[0], workspace=ws)
    rep = memory_report(fn)
    assert rep["scratch"] > 0
    assert (rep["scratch_placed"], rep["scratch_unplaced"]) == (1, 1)   # conv 2 in y0's memory; conv 1 has none
    assert any(line.startswith("  kernel scratch: largest") and "1 kernels run in planned memory" in line
               for line in format_report(rep))
    huge = 1 << 30        # a scratch no plan has room for: counted as dynamic at its instruction
    monkeypatch.setattr(CV.conv, "_scratch", lambda types, **attrs: huge)
    rep_huge = memory_report(fn)
    assert rep_huge["scratch"] == huge
    assert rep_huge["peak"] >= rep["peak"] - rep["scratch"] + huge - rep["planned"]


def test_aligned_copies_only_what_is_not_on_a_cache_line():
    from cgvm.ops.kernels.scratch import aligned

    raw = np.empty(64 * 40 + 64, np.uint8)
    start = -raw.ctypes.data % ALIGN
    on_line = raw[start:start + 64 * 40].view(np.float32).reshape(32, 20)
    off_line = raw[start + 16:start + 16 + 64 * 39].view(np.float32).reshape(13, 48)
    off_line[...] = np.arange(off_line.size).reshape(off_line.shape)
    assert aligned(np, on_line) is on_line
    fixed = aligned(np, off_line)
    assert fixed is not off_line and fixed.ctypes.data % ALIGN == 0
    np.testing.assert_array_equal(fixed, off_line)
    scalar = np.float32(2.0)
    assert aligned(np, scalar) is scalar
