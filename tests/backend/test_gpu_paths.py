"""The GPU backend's logic, checked on the CPU with NumPy: cuDNN-or-im2col selection and the glue to
CuPy's cuDNN wrappers (through a stand-in written as plain loops), the transfer counter, pinned
staging and the plan arena, and the errors of backend/device selection."""
import importlib.util
import os

import numpy as np
import pytest

import cgvm
from cgvm.backend import cudnn, transfer
from cgvm.errors import BackendUnavailable, ConfigError
from cgvm.ir import TensorType, input_value
from cgvm.ops import conv as CV
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R

HAS_CUPY = importlib.util.find_spec("cupy") is not None


class _FakeCupy:
    """An array module that calls itself CuPy (selection only looks at the name)."""

    __name__ = "cupy"


# --------------------------------------------------------------------------- selection

def test_numpy_backend_takes_im2col():
    choice = cudnn.choose(np, np.float32, 2, ((1, 1), (1, 1)))
    assert choice.path == "im2col" and "NumPy" in choice.reason


def test_cupy_without_cudnn_binding_takes_im2col(monkeypatch):
    monkeypatch.setattr(cudnn, "_library_cache", {"lib": (None, "CuPy's cuDNN binding is not usable (x)")})
    choice = cudnn.choose(_FakeCupy(), np.float32, 2, ((1, 1), (1, 1)))
    assert choice == cudnn.Choice("im2col", "CuPy's cuDNN binding is not usable (x)")


@pytest.mark.parametrize("dtype,nsp,pads,path,why", [
    (np.float32, 2, ((1, 1), (2, 2)), "cudnn", ""),
    (np.float16, 3, ((0, 0),) * 3, "cudnn", ""),
    (np.float64, 1, ((2, 2),), "cudnn", ""),
    (np.float32, 2, ((0, 1), (0, 1)), "im2col", "asymmetric padding"),
    (np.int32, 2, ((0, 0), (0, 0)), "im2col", "does not convolve int32"),
    (np.float32, 4, ((0, 0),) * 4, "im2col", "1 to 3 spatial axes"),
])
def test_selection_rules(monkeypatch, dtype, nsp, pads, path, why):
    monkeypatch.setattr(cudnn, "_library_cache", {"lib": (object(), "")})
    choice = cudnn.choose(_FakeCupy(), dtype, nsp, pads)
    assert choice.path == path and why in choice.reason


def test_cudnn_switch(monkeypatch):
    monkeypatch.setattr(cudnn, "_library_cache", {"lib": (object(), "")})
    monkeypatch.setenv("CGVM_CUDNN", "off")
    assert cudnn.choose(_FakeCupy(), np.float32, 2, ((0, 0),) * 2) == cudnn.Choice("im2col", "CGVM_CUDNN=0")
    monkeypatch.setenv("CGVM_CUDNN", "maybe")
    with pytest.raises(ConfigError, match="CGVM_CUDNN='maybe'"):
        cudnn.choose(np, np.float32, 2, ((0, 0),) * 2)   # a bad value is an error on the CPU too


# --------------------------------------------------------------------------- the glue, through a stand-in

def _windows(x, pad, stride, dil, ksize, out):
    """(i, j, patch) for each kernel offset: x padded, the inputs offset (i, j) meets at each output."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    for i in range(ksize[0]):
        for j in range(ksize[1]):
            rows = slice(i * dil[0], i * dil[0] + stride[0] * (out[0] - 1) + 1, stride[0])
            cols = slice(j * dil[1], j * dil[1] + stride[1] * (out[1] - 1) + 1, stride[1])
            yield i, j, xp, (slice(None), slice(None), rows, cols)


class LoopCudnn:
    """CuPy's three cuDNN convolution wrappers as plain loops over kernel offsets (2-D, NCHW,
    symmetric padding), recording each call's geometry."""

    def __init__(self):
        self.calls = []

    def convolution_forward(self, x, W, b, y, pad, stride, dilation, groups, *, auto_tune, tensor_core):
        self.calls.append(("forward", x.ndim, pad, stride, dilation, groups))
        o, cg = W.shape[:2]
        og = o // groups
        y[...] = 0
        for i, j, xp, sl in _windows(x, pad, stride, dilation, W.shape[2:], y.shape[2:]):
            patch = xp[sl]
            for g in range(groups):
                y[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch[:, g * cg:(g + 1) * cg],
                                                       W[g * og:(g + 1) * og, :, i, j])
        if b is not None:
            y += b.reshape(1, -1, 1, 1)

    def convolution_backward_data(self, W, gy, b, gx, pad, stride, dilation, groups, *, deterministic,
                                  auto_tune, tensor_core):
        self.calls.append(("backward_data", gy.ndim, pad, stride, dilation, groups))
        o, cg = W.shape[:2]
        og = o // groups
        acc = np.zeros(gx.shape[:2] + (gx.shape[2] + 2 * pad[0], gx.shape[3] + 2 * pad[1]), gx.dtype)
        for i, j, _, sl in _windows(gx, pad, stride, dilation, W.shape[2:], gy.shape[2:]):
            for g in range(groups):
                acc[sl][:, g * cg:(g + 1) * cg] += np.einsum("nohw,oc->nchw", gy[:, g * og:(g + 1) * og],
                                                             W[g * og:(g + 1) * og, :, i, j])
        gx[...] = acc[:, :, pad[0]:pad[0] + gx.shape[2], pad[1]:pad[1] + gx.shape[3]]

    def convolution_backward_filter(self, x, gy, gW, pad, stride, dilation, groups, *, deterministic,
                                    auto_tune, tensor_core):
        self.calls.append(("backward_filter", x.ndim, pad, stride, dilation, groups))
        o, cg = gW.shape[:2]
        og = o // groups
        for i, j, xp, sl in _windows(x, pad, stride, dilation, gW.shape[2:], gy.shape[2:]):
            patch = xp[sl]
            for g in range(groups):
                gW[g * og:(g + 1) * og, :, i, j] = np.einsum("nohw,nchw->oc", gy[:, g * og:(g + 1) * og],
                                                             patch[:, g * cg:(g + 1) * cg])


def _conv_and_grads(x, w, b, **attrs):
    """conv's value and the gradients of <conv, r> wrt x, w and b, compiled on NumPy."""
    xs = [input_value(TensorType(a.shape, a.dtype), f"in{i}") for i, a in enumerate((x, w, b))]
    y = CV.conv(*xs, **attrs)
    weights = np.random.default_rng(3).standard_normal([d for d in y.shape]).astype(np.float32)
    cost = R.sum(E.mul(y, weights))
    f = cgvm.compile(xs, [y] + list(cgvm.grad(cost, xs)), workspace=cgvm.Workspace("numpy"))
    return [np.array(v, copy=True) for v in f(x, w, b)]


@pytest.mark.parametrize("shape,wshape,attrs,geometry", [
    ((2, 4, 9, 8), (6, 2, 3, 2), dict(stride=(2, 1), pad=(1, 2), dilation=(1, 2), groups=2),
     ((1, 2), (2, 1), (1, 2), 2)),
    ((3, 2, 11), (4, 2, 3), dict(stride=(2,), pad=(1,), dilation=(2,)), ((0, 1), (1, 2), (1, 2), 1)),
])
def test_cudnn_glue_matches_im2col(monkeypatch, shape, wshape, attrs, geometry):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(wshape).astype(np.float32)
    b = rng.standard_normal(wshape[0]).astype(np.float32)
    want = _conv_and_grads(x, w, b, **attrs)          # NumPy's im2col/batch-last kernels
    fake = LoopCudnn()
    monkeypatch.setattr(cudnn, "library", lambda xp: (fake, ""))
    got = _conv_and_grads(x, w, b, **attrs)
    kinds = {c[0] for c in fake.calls}
    assert kinds == {"forward", "backward_data", "backward_filter"}
    assert all(c[1] == 4 and c[2:] == geometry for c in fake.calls), fake.calls   # 1-D goes as 2-D
    for g, e, what in zip(got, want, ("y", "dx", "dw", "db")):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4, err_msg=what)


def test_asymmetric_padding_stays_on_im2col(monkeypatch):
    fake = LoopCudnn()
    monkeypatch.setattr(cudnn, "library", lambda xp: (fake, ""))
    x = np.random.default_rng(1).standard_normal((1, 2, 6, 6)).astype(np.float32)
    w = np.ones((3, 2, 3, 3), np.float32)
    xs = [input_value(TensorType(a.shape, a.dtype), f"in{i}") for i, a in enumerate((x, w))]
    f = cgvm.compile(xs, CV.conv(*xs, pad=(0, 1, 1, 0)), workspace=cgvm.Workspace("numpy"))
    assert f(x, w).shape == (1, 3, 5, 5) and fake.calls == []


# --------------------------------------------------------------------------- the transfer counter

def _mlp_step():
    from cgvm.ir import param_value
    from cgvm.ops import linalg as L
    from cgvm.ops import loss as LS

    ws = cgvm.Workspace("numpy")
    ws["w"] = np.full((5, 3), 0.1, np.float32)
    x = input_value(TensorType((None, 5)), "x")
    y = input_value(TensorType((None,), "int64"), "y")
    wv = param_value("w", TensorType((5, 3)))
    loss = LS.softmax_cross_entropy(L.matmul(x, wv), y)
    (gw,) = cgvm.grad(loss, [wv])
    return ws, cgvm.compile([x, y], loss, workspace=ws, updates={wv: E.sub(wv, E.mul(gw, 0.5))})


def test_a_step_reads_nothing_back_and_to_numpy_is_counted():
    ws, step = _mlp_step()
    x, y = np.ones((4, 5), np.float32), np.array([0, 1, 2, 0])
    step(x, y)
    with transfer.counting() as inside:
        loss = step(x, y)
    assert inside.host_reads == 0 and inside.device_to_host == 0
    with transfer.counting() as after:
        ws.backend.to_numpy(loss)
        cgvm.backend.host_array(ws["w"])
    assert after.host_reads == 2 and after.device_to_host == 0     # NumPy: reads, no copies


def test_counting_reports_even_when_the_block_raises():
    with pytest.raises(RuntimeError):
        with transfer.counting() as c:
            cgvm.get_backend("numpy").to_numpy(np.zeros(3))
            raise RuntimeError
    assert c.host_reads == 1


# --------------------------------------------------------------------------- pinned staging

class _Event:
    def __init__(self, log):
        self.log, self.done = log, False

    def record(self):
        self.log.append("record")
        self.done = False

    def synchronize(self):
        self.log.append("sync")
        self.done = True


def test_pinned_staging_reuses_buffers_after_their_copy():
    log, pinned = [], []

    def empty_pinned(n):
        pinned.append(n)
        return np.empty(n, np.uint8)

    def upload(device, host):
        log.append("upload")
        device[...] = host

    stage = transfer.PinnedStaging(np, empty_pinned, lambda: _Event(log), upload, slots_per_size=2)
    arrays = [np.arange(k, k + 12, dtype=np.float32).reshape(3, 4) for k in range(4)]
    with transfer.counting() as c:
        outs = [stage.to_device(a) for a in arrays]
    for a, o in zip(arrays, outs):
        np.testing.assert_array_equal(o, a)      # each copy saw its own data, not a later one's
    assert c.host_to_device == 4 and c.host_to_device_bytes == 4 * 48
    assert pinned == [64, 64]                    # two slots of the 48-byte size class, then reuse
    assert log.count("sync") == 2                # the reused buffers' copies were waited on
    stage._free[64][0][1].done = True            # a copy already finished: no wait
    stage.to_device(arrays[0])
    assert log.count("sync") == 2
    assert stage.to_device(np.zeros((0, 3), np.float32)).shape == (0, 3)


# --------------------------------------------------------------------------- the plan arena

def test_arena_buffers_are_aligned_disjoint_slices_of_one_block():
    sizes = [10, 0, 300, 1, 257]
    arena, buffers = transfer.arena_buffers(np, sizes, align=64)
    base = transfer.data_pointer(arena)
    spans = []
    for n, b in zip(sizes, buffers):
        start = transfer.data_pointer(b)
        assert start % 64 == 0 and b.nbytes == max(n, 1) and b.dtype == np.uint8
        assert base <= start and start + b.nbytes <= base + arena.nbytes
        spans.append((start, start + b.nbytes))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    arena[...] = 0
    buffers[2][...] = 7
    assert int(arena.sum()) == 7 * 300            # the buffers are views of the arena
    assert cgvm.get_backend("numpy").plan_buffers(sizes) is None   # NumPy allocates per buffer


# --------------------------------------------------------------------------- selection errors

def test_unknown_backend_in_the_environment_is_an_error_everywhere(monkeypatch):
    monkeypatch.setenv("CGVM_BACKEND", "tpu")
    monkeypatch.setattr(cgvm.backend.base, "_BACKENDS", {})
    with pytest.raises(BackendUnavailable, match="unknown backend 'tpu'.*CGVM_BACKEND"):
        cgvm.Workspace()
    from cgvm.cli import check_backend_environment

    with pytest.raises(ConfigError, match="CGVM_BACKEND='tpu'"):
        check_backend_environment()


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here")
@pytest.mark.parametrize("name", ["cupy", "gpu", "cuda"])
def test_missing_cupy_names_both_builds(monkeypatch, name):
    monkeypatch.setattr(cgvm.backend.base, "_BACKENDS", {})
    with pytest.raises(BackendUnavailable) as info:
        cgvm.get_backend(name)
    assert "pip install 'cgvm[gpu]'" in str(info.value) and "cgvm[gpu-cuda13]" in str(info.value)


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here")
def test_set_mode_gpu_without_cupy_names_the_install(monkeypatch):
    import cgvm.caffe as caffe

    monkeypatch.setattr(cgvm.backend.base, "_BACKENDS", {})
    with pytest.raises(BackendUnavailable, match=r"cgvm\[gpu-cuda13\]"):
        caffe.set_mode_gpu()


def test_gpu_flag_with_a_bad_id_is_a_usage_error(capsys):
    from cgvm.cli import main

    model = os.path.join(os.path.dirname(__file__), "..", "..", "models", "lenet", "lenet_train_test.prototxt")
    assert main(["time", "--model", model, "--gpu", "first"]) == 2
    assert "--gpu takes a device id" in capsys.readouterr().err


@pytest.mark.parametrize("value,device", [("cupy", "gpu"), (" GPU ", "gpu"), ("cuda", "gpu"), ("numpy", "cpu"),
                                          ("", "cpu")])
def test_distributed_default_device_follows_every_gpu_spelling(monkeypatch, value, device):
    from cgvm.distributed import world

    monkeypatch.setenv("CGVM_BACKEND", value)
    assert world.default_device() == device


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here")
def test_gpu_flag_without_cupy_gives_the_install_commands(capsys):
    from cgvm.cli import main

    model = os.path.join(os.path.dirname(__file__), "..", "..", "models", "lenet", "lenet_train_test.prototxt")
    assert main(["time", "--model", model, "--gpu", "1"]) == 2
    err = capsys.readouterr().err
    assert "--gpu needs the CuPy backend" in err and "cgvm[gpu-cuda13]" in err and "cgvm[gpu]" in err


# --------------------------------------------------------------------------- the device's im2col (no cuDNN)

@pytest.mark.parametrize("budget", [64 << 20, 2048])   # whole batch at once; a few samples (or rows) a GEMM
@pytest.mark.parametrize("shape,wshape,attrs", [
    ((4, 6, 10, 9), (8, 6, 3, 3), dict(pad=(1,))),                        # Winograd's case on the CPU
    ((3, 4, 7, 7), (6, 2, 3, 3), dict(stride=(2,), pad=(1,), groups=2)),
    ((2, 8, 6, 6), (5, 8, 1, 1), {}),                                       # pointwise
    ((2, 3, 13), (4, 3, 5), dict(dilation=(2,), pad=(0, 3))),
])
def test_device_im2col_path_matches_the_cpu_kernels(monkeypatch, shape, wshape, attrs, budget):
    from cgvm.ops.kernels import conv_im2col

    rng = np.random.default_rng(2)
    x, w = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(wshape).astype(np.float32)
    b = rng.standard_normal(wshape[0]).astype(np.float32)
    want = _conv_and_grads(x, w, b, **attrs)
    methods = []
    pick = conv_im2col.forward_methods

    def recording(*args, **kwargs):
        found = pick(*args, **kwargs)
        if (args[4:5] or [kwargs.get("device")])[0]:      # the kernel's call, not the planner's
            methods.extend(found)
        return found
    monkeypatch.setattr(conv_im2col, "on_device", lambda xp: True)   # NumPy runs the device's choices
    monkeypatch.setattr(conv_im2col, "DEVICE_COLUMN_BUDGET_BYTES", budget)
    monkeypatch.setattr(conv_im2col, "forward_methods", recording)
    got = _conv_and_grads(x, w, b, **attrs)
    assert methods and {m for m, _ in methods} <= {"im2col", "pointwise"}
    for g, e, what in zip(got, want, ("y", "dx", "dw", "db")):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4, err_msg=what)
