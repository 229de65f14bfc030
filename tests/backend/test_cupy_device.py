"""The CuPy backend on a real GPU: cuDNN convolutions against the NumPy kernels, no copies back to the
host inside a training step, inputs through pinned memory, the plan as one arena, DLPack with
torch.cuda and device selection. Skipped where CuPy cannot run (no GPU)."""
import numpy as np
import pytest

import cgvm
from cgvm.backend import cudnn, transfer
from cgvm.errors import BackendUnavailable
from cgvm.ir import TensorType, input_value, param_value
from cgvm.ops import conv as CV
from cgvm.ops import elementwise as E
from cgvm.ops import linalg as L
from cgvm.ops import loss as LS
from cgvm.ops import reduce as R

if "cupy" not in cgvm.available_backends():
    pytest.skip("needs CuPy and a CUDA device", allow_module_level=True)

import cupy  # noqa: E402


def _conv_step(backend, x, w, b, attrs):
    xs = [input_value(TensorType(a.shape, a.dtype), f"in{i}") for i, a in enumerate((x, w, b))]
    y = CV.conv(*xs, **attrs)
    r = np.random.default_rng(3).standard_normal(tuple(y.shape)).astype(x.dtype)
    grads = cgvm.grad(R.sum(E.mul(y, r)), xs)
    ws = cgvm.Workspace(backend)
    f = cgvm.compile(xs, [y] + list(grads), workspace=ws)
    return [ws.backend.to_numpy(v) for v in f(*[ws.backend.asarray(a) for a in (x, w, b)])]


@pytest.mark.parametrize("shape,wshape,attrs", [
    ((4, 8, 17, 15), (16, 8, 3, 3), dict(pad=(1,))),
    ((2, 6, 12, 12), (9, 2, 5, 3), dict(stride=(2, 1), pad=(2, 1), dilation=(1, 2), groups=3)),
    ((3, 4, 20), (5, 4, 4), dict(stride=(3,), pad=(1,))),
    ((2, 3, 6, 6, 6), (4, 3, 3, 3, 3), dict(pad=(1,))),
    ((2, 3, 9, 9), (4, 3, 3, 3), dict(pad=(0, 1, 1, 0))),     # asymmetric: the im2col fallback on CuPy
])
def test_gpu_convolution_matches_numpy(shape, wshape, attrs):
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(wshape).astype(np.float32)
    b = rng.standard_normal(wshape[0]).astype(np.float32)
    want = _conv_step("numpy", x, w, b, attrs)
    got = _conv_step("cupy", x, w, b, attrs)
    for g, e, what in zip(got, want, ("y", "dx", "dw", "db")):
        # relative to the largest value: cuDNN may compute float32 in TF32 (unless NVIDIA_TF32_OVERRIDE=0),
        # 1e-3 relative; a wrong stride, pad or group is off by the values themselves
        np.testing.assert_allclose(g, e, rtol=0, atol=5e-3 * max(1.0, float(np.abs(e).max())), err_msg=what)


def test_cudnn_is_reported():
    choice = cudnn.choose(cupy, np.float32, 2, ((1, 1), (1, 1)))
    print(f"cuDNN path: {choice}")       # the GPU check's log shows which path convolutions took
    assert choice.path in ("cudnn", "im2col")


def _mlp(ws):
    rng = np.random.default_rng(0)
    x = input_value(TensorType((None, 64)), "x")
    y = input_value(TensorType((None,), "int64"), "y")
    params, h = [], x
    for i, (a, b) in enumerate(((64, 128), (128, 10))):
        ws[f"W{i}"] = (rng.standard_normal((a, b)) * np.sqrt(2 / a)).astype(np.float32)
        ws[f"b{i}"] = np.zeros(b, np.float32)
        wv, bv = param_value(f"W{i}", TensorType((a, b))), param_value(f"b{i}", TensorType((b,)))
        params += [wv, bv]
        h = E.add(L.matmul(h, wv), bv)
        if i == 0:
            h = E.relu(h)
    loss = LS.softmax_cross_entropy(h, y)
    grads = cgvm.grad(loss, params)
    return cgvm.compile([x, y], loss, workspace=ws, updates={p: E.sub(p, E.mul(g, 0.1)) for p, g in zip(params, grads)})


def test_training_step_copies_nothing_back_to_the_host():
    ws = cgvm.Workspace("cupy")
    step = _mlp(ws)
    x = cupy.asarray(np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32))
    y = cupy.asarray(np.arange(32) % 10)
    step(x, y)
    with transfer.counting(strict=True) as c:   # strict: any device synchronization raises
        for _ in range(3):
            loss = step(x, y)
    assert c.device_to_host == 0 and c.host_reads == 0 and c.host_to_device == 0
    assert isinstance(loss, cupy.ndarray)        # the output stays on the device
    with transfer.counting() as c:
        ws.backend.to_numpy(loss)
    assert c.device_to_host == 1


def test_host_inputs_are_copied_once_each_through_pinned_memory():
    ws = cgvm.Workspace("cupy")
    step = _mlp(ws)
    x = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
    y = np.arange(32) % 10
    step(x, y)
    with transfer.counting() as c:
        step(x, y)
    assert c.host_to_device == 2 and c.device_to_host == 0
    assert ws.backend._staging is not None and ws.backend._staging.allocated_bytes > 0


def test_memory_plan_is_one_arena():
    ws = cgvm.Workspace("cupy")
    step = _mlp(ws)
    step(cupy.ones((32, 64), cupy.float32), cupy.zeros(32, cupy.int64))
    (frame,) = step.executable.frames.values()
    assert len(frame.buffers) >= 2
    assert len({id(b.data.mem) for b in frame.buffers}) == 1    # one allocation from the pool
    assert all(b.data.ptr % transfer.ARENA_ALIGN == 0 for b in frame.buffers)


def test_dlpack_with_torch_cuda_is_zero_copy():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    t = torch.arange(6, dtype=torch.float32, device="cuda")
    arr = cgvm.from_dlpack(t)
    assert isinstance(arr, cupy.ndarray) and arr.data.ptr == t.data_ptr()
    ws = cgvm.Workspace("cupy")
    ws["v"] = arr
    back = torch.from_dlpack(ws.tensor("v"))
    assert back.device.type == "cuda" and back.data_ptr() == t.data_ptr()
    assert ws.backend.asarray(t).data.ptr == t.data_ptr()


def test_use_device_out_of_range_is_a_clear_error():
    from cgvm.backend.cupy import use_device

    n = cupy.cuda.runtime.getDeviceCount()
    with pytest.raises(BackendUnavailable, match=f"no CUDA device {n}"):
        use_device(n, "--gpu")
    use_device(0, "--gpu")
    assert cupy.cuda.Device().id == 0
