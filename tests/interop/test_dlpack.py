"""DLPack interop with NumPy and PyTorch: the compliance matrix of shared/reference/dlpack.md.

Rows 1-9, 11-17 and 20 of the matrix, each in a test named after it, then compiled functions and
the Workspace fed by DLPack producers, and the memory rule: a buffer the VM reuses is never
handed out. PyTorch rows are skipped without torch; the CuPy checks run only with a GPU.
Capsules are inspected with ``cgvm.dlpack.capsule_info`` (ctypes over the C struct), so flags,
versions and strides below are what was actually exported.
"""
import ctypes
import gc
import weakref

import numpy as np
import pytest

import cgvm
from cgvm.dlpack import (FLAG_IS_COPIED, FLAG_READ_ONLY, DLDeviceType, DLPackCopyError, Tensor, capsule_info,
                         from_dlpack)
from cgvm.ir import TensorType, input_value, param_value
from cgvm.ops import elementwise as E
from cgvm.ops import reduce as R
from cgvm.ops import shape as S

try:
    import torch
except ImportError:
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
needs_cupy = pytest.mark.skipif("cupy" not in cgvm.available_backends(), reason="needs CuPy and a GPU")
CONSUMERS = ["numpy", pytest.param("torch", marks=needs_torch)]


# ------------------------------------------------------------------------------------------- helpers

def address(a) -> int:
    """The data pointer of a NumPy array or torch tensor."""
    return a.data_ptr() if torch is not None and isinstance(a, torch.Tensor) else a.__array_interface__["data"][0]


def consume(kind: str, producer):
    """``from_dlpack`` of the named peer."""
    return np.from_dlpack(producer) if kind == "numpy" else torch.from_dlpack(producer)


class Capsule:
    """Hands one raw capsule to a consumer's from_dlpack (which wants an object with __dlpack__)."""

    def __init__(self, capsule, device=(1, 0)):
        self.capsule, self.device = capsule, device

    def __dlpack__(self, **_):
        return self.capsule

    def __dlpack_device__(self):
        return self.device


class LegacyProducer:
    """A producer from before DLPack 1.0: ``__dlpack__(self, stream=None)`` only."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class FutureMajorProducer:
    """Claims DLPack 2.0 in the versioned struct (a major version no consumer here understands)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **kw):
        capsule = self.array.__dlpack__(**kw)
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        ctypes.c_uint32.from_address(get_pointer(capsule, b"dltensor_versioned")).value = 2  # version.major
        return capsule

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


def finalizer_count(obj) -> list:
    """A list that gets one entry when ``obj`` is freed (the producer's deleter ran)."""
    calls: list = []
    weakref.finalize(obj, calls.append, 1)
    return calls


# ---------------------------------------------------------------------------- 1, 2: zero-copy both ways

@pytest.mark.parametrize("kind", CONSUMERS)
def test_1_peers_import_cgvm_tensors_without_copy(kind):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    peer = consume(kind, Tensor(a))
    assert address(peer) == address(a) and tuple(peer.shape) == (3, 4)
    peer[1, 2] = -7.0          # written through the peer ...
    assert a[1, 2] == -7.0
    a[0, 0] = 42.0             # ... and through cgvm's side
    assert float(peer[0, 0]) == 42.0


@pytest.mark.parametrize("kind", CONSUMERS)
def test_2_cgvm_imports_peers_without_copy(kind):
    src = np.arange(24, dtype=np.float64).reshape(4, 6)
    if kind == "torch":
        src = torch.from_numpy(src)
    view = from_dlpack(src.T)  # a transposed producer keeps its strides
    assert isinstance(view, np.ndarray) and view.dtype == np.float64 and view.shape == (6, 4)
    assert view.strides == (8, 48) and view.flags.writeable
    assert address(view) == address(src)
    view[5, 3] = -1.0
    assert float(src[3, 5]) == -1.0


# ---------------------------------------------------------------------------- 3, 4: lifetime and capsules

def test_3_imported_view_outlives_its_producer_and_frees_once():
    src = np.arange(1000, dtype=np.float32)
    freed = finalizer_count(src)
    view = from_dlpack(src)
    del src
    gc.collect()
    assert freed == [] and view[999] == 999.0
    del view
    gc.collect()
    assert freed == [1]


@needs_torch
def test_3_torch_view_of_a_workspace_entry_outlives_the_entry():
    ws = cgvm.Workspace()
    ws["w"] = np.arange(6, dtype=np.float32)
    freed = finalizer_count(ws["w"])
    t = torch.from_dlpack(ws.tensor("w"))
    ws["w"] = np.zeros(3, np.float32)  # rebinding drops the workspace's reference
    gc.collect()
    assert freed == [] and t.tolist() == [0, 1, 2, 3, 4, 5]
    del t
    gc.collect()
    assert freed == [1]


def test_4_a_capsule_is_consumed_once():
    capsule = Tensor(np.arange(3.0)).__dlpack__(max_version=(1, 0))
    assert capsule_info(capsule).name == "dltensor_versioned"
    first = np.from_dlpack(Capsule(capsule))
    with pytest.raises((RuntimeError, ValueError, BufferError)):
        np.from_dlpack(Capsule(capsule))
    with pytest.raises(ValueError, match="consumed once"):
        capsule_info(capsule)  # renamed "used_dltensor_versioned"
    assert first.tolist() == [0.0, 1.0, 2.0]


@needs_torch
def test_4_torch_consumes_a_cgvm_capsule_once():
    capsule = Tensor(np.arange(3.0)).__dlpack__()
    t = torch.utils.dlpack.from_dlpack(capsule)
    with pytest.raises((RuntimeError, ValueError, BufferError)):
        torch.utils.dlpack.from_dlpack(capsule)
    assert t.tolist() == [0.0, 1.0, 2.0]


# ---------------------------------------------------------------------------- 5, 6: versions

@pytest.mark.parametrize("max_version, name", [(None, "dltensor"), ((0, 8), "dltensor"),
                                               ((1, 0), "dltensor_versioned"), ((1, 99), "dltensor_versioned"),
                                               ((2, 0), "dltensor_versioned")])
def test_5_export_answers_max_version(max_version, name):
    info = capsule_info(Tensor(np.ones(2)).__dlpack__(max_version=max_version))
    assert info.name == name
    if info.version is not None:
        assert info.version[0] == 1  # our own 1.x even when 2.0 is offered: consumers must check


def test_5_import_refuses_a_newer_major_version_and_only_frees_it():
    src = np.arange(4.0)
    freed = finalizer_count(src)
    with pytest.raises(BufferError, match="version"):
        from_dlpack(FutureMajorProducer(src))
    del src
    gc.collect()
    assert freed == [1]  # the refused capsule's deleter ran, once


def test_6_legacy_producer_is_called_without_keywords():
    src = np.arange(5, dtype=np.int32)
    view = from_dlpack(LegacyProducer(src))
    assert address(view) == address(src) and view.tolist() == [0, 1, 2, 3, 4]
    assert not view.flags.writeable  # a legacy capsule cannot say whether writing is allowed
    copied = from_dlpack(LegacyProducer(src), copy=True)
    assert not np.shares_memory(copied, src) and copied.flags.writeable and copied.tolist() == view.tolist()
    assert address(from_dlpack(LegacyProducer(src), copy=False)) == address(src)


# ---------------------------------------------------------------------------- 7, 8, 9: copy, device, stream

def test_7_export_copy_keyword():
    a = np.arange(6, dtype=np.float32)
    copied = capsule_info(Tensor(a).__dlpack__(max_version=(1, 0), copy=True))
    assert copied.is_copied and copied.data != address(a)
    shared = capsule_info(Tensor(a).__dlpack__(max_version=(1, 0), copy=False))
    assert not shared.flags & FLAG_IS_COPIED and shared.data == address(a)
    with pytest.raises(BufferError):
        Tensor(a[::-1]).__dlpack__(max_version=(1, 0), copy=False)  # the copy is unavoidable


@pytest.mark.parametrize("kind", CONSUMERS)
def test_7_import_copy_keyword(kind):
    src = np.arange(6, dtype=np.float32)
    if kind == "torch":
        src = torch.from_numpy(src)
    assert address(from_dlpack(src, copy=False)) == address(src)
    copied = from_dlpack(src, copy=True)
    assert address(copied) != address(src) and copied.tolist() == [0, 1, 2, 3, 4, 5]


def test_7_import_copy_false_where_a_copy_is_needed():
    with pytest.raises(BufferError) as info:
        from_dlpack(np.arange(4.0)[::-1], copy=False)
    # the array API says ValueError in one place, BufferError in another: it is both
    assert isinstance(info.value, ValueError) and isinstance(info.value, DLPackCopyError)


def test_8_dl_device():
    a = np.arange(3.0)
    assert capsule_info(Tensor(a).__dlpack__(max_version=(1, 0), dl_device=(1, 0))).data == address(a)
    with pytest.raises(BufferError):
        Tensor(a).__dlpack__(max_version=(1, 0), dl_device=(int(DLDeviceType.CUDA), 0))
    assert address(from_dlpack(a, device="cpu")) == address(a)
    assert address(from_dlpack(a, device=(1, 0), backend="numpy")) == address(a)
    with pytest.raises(ValueError, match="not on backend"):
        from_dlpack(a, device="cuda", backend="numpy")


@pytest.mark.parametrize("stream", [1, 2, -1, 0])
def test_9_stream_must_be_none_on_cpu(stream):
    t = Tensor(np.arange(3.0))
    with pytest.raises(BufferError, match="stream"):
        t.__dlpack__(stream=stream)
    assert capsule_info(t.__dlpack__(stream=None)).name == "dltensor"


# ---------------------------------------------------------------------------- 11, 12: device, strides

@needs_torch
def test_11_dlpack_device_is_an_int_enum():
    device = Tensor(np.zeros(2)).__dlpack_device__()
    assert device == (DLDeviceType.CPU, 0) and isinstance(device[0], DLDeviceType) and device[0] == 1
    assert torch.from_dlpack(Tensor(np.zeros(2))).device.type == "cpu"


def _layouts():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    return {"c": base, "f": np.asfortranarray(base), "every_other_column": base[:, ::2], "transposed": base.T,
            "0-d": np.array(3.5, np.float32), "size-0": np.zeros((0, 3), np.float32),
            "broadcast": np.broadcast_to(np.arange(3, dtype=np.float32), (4, 3))}


@pytest.mark.parametrize("layout", list(_layouts()))
@pytest.mark.parametrize("kind", CONSUMERS)
def test_12_strides_round_trip(layout, kind):
    a = _layouts()[layout]
    info = capsule_info(Tensor(a).__dlpack__(max_version=(1, 0)))
    if a.ndim == 0:
        assert info.shape is None and info.strides is None  # NumPy's 0-d export: both NULL
    else:
        assert info.shape == a.shape and info.strides == tuple(s // a.itemsize for s in a.strides)  # elements
    peer = consume(kind, Tensor(a))
    np.testing.assert_array_equal(np.asarray(peer), a)
    back = from_dlpack(peer)
    np.testing.assert_array_equal(back, a)
    if a.size:
        assert address(back) == address(a)


@needs_torch
@pytest.mark.parametrize("view", ["transposed", "every_other_column", "expanded"])
def test_12_torch_strided_views_import_with_their_strides(view):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    v = {"transposed": t.T, "every_other_column": t[:, ::2], "expanded": t[:1].expand(3, 4)}[view]
    got = from_dlpack(v)
    assert got.strides == tuple(s * 4 for s in v.stride())
    np.testing.assert_array_equal(got, v.numpy())


# ---------------------------------------------------------------------------- 13: negative strides

@pytest.mark.parametrize("make", [lambda a: a[::-1], lambda a: a.reshape(4, 6)[::-1, ::-2]], ids=["1d", "2d"])
def test_13_negative_strides_are_copied_on_export(make):
    view = make(np.arange(24, dtype=np.float32))
    for max_version in (None, (1, 0)):
        capsule = Tensor(view).__dlpack__(max_version=max_version)
        info = capsule_info(capsule)
        assert info.strides is None or min(info.strides) >= 0  # never hand negative strides out
        if max_version is not None:
            assert info.is_copied
        np.testing.assert_array_equal(np.from_dlpack(Capsule(capsule)), view)
    with pytest.raises(BufferError, match="negative strides"):
        Tensor(view).__dlpack__(copy=False)


@needs_torch
def test_13_torch_gets_a_copy_of_a_reversed_array():
    # torch 2.13 aborts the process on negative strides; the capsule is checked before torch sees it
    reversed_ = np.arange(6, dtype=np.float32)[::-1]
    capsule = Tensor(reversed_).__dlpack__(max_version=(1, 0))
    assert min(capsule_info(capsule).strides) >= 0
    assert torch.utils.dlpack.from_dlpack(capsule).tolist() == [5, 4, 3, 2, 1, 0]
    assert torch.from_dlpack(Tensor(reversed_)).tolist() == [5, 4, 3, 2, 1, 0]


def test_13_negative_strides_are_copied_on_import():
    src = np.arange(6, dtype=np.float32)
    got = from_dlpack(src[::-1])
    assert min(got.strides) > 0 and got.tolist() == [5, 4, 3, 2, 1, 0] and not np.shares_memory(got, src)


# ---------------------------------------------------------------------------- 14, 15: read-only, byte order

def test_14_read_only_arrays_export_read_only():
    ro = np.arange(4.0)
    ro.flags.writeable = False
    with pytest.raises(BufferError):
        Tensor(ro).__dlpack__()  # the legacy struct cannot say read-only
    assert capsule_info(Tensor(ro).__dlpack__(max_version=(1, 0))).flags & FLAG_READ_ONLY
    broadcast = np.broadcast_to(np.arange(3.0), (2, 3))
    assert capsule_info(Tensor(broadcast).__dlpack__(max_version=(1, 0))).read_only
    ws = cgvm.Workspace()
    ws["frozen"] = ro
    assert capsule_info(ws.tensor("frozen").__dlpack__(max_version=(1, 0))).read_only


def test_14_read_only_imports_read_only():
    ro = np.arange(4.0)
    ro.flags.writeable = False
    view = from_dlpack(ro)
    assert address(view) == address(ro) and not view.flags.writeable
    with pytest.raises(ValueError):
        view[0] = 1.0


def test_15_non_native_byte_order_is_refused():
    swapped = np.arange(3, dtype=np.dtype(np.float32).newbyteorder())
    with pytest.raises(BufferError):
        Tensor(swapped).__dlpack__(max_version=(1, 0))
    with pytest.raises(BufferError):
        from_dlpack(swapped)


# ---------------------------------------------------------------------------- 16, 17: dtypes, torch's oddities

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
          "float64", "complex64", "complex128"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", CONSUMERS)
def test_16_dtypes_round_trip(dtype, kind):
    a = (np.arange(6) % 3).astype(dtype)
    if dtype == "bool":
        assert capsule_info(Tensor(a).__dlpack__(max_version=(1, 0))).dtype == (6, 8, 1)  # kDLBool
    back = from_dlpack(consume(kind, Tensor(a)))
    assert back.dtype == a.dtype and address(back) == address(a)
    np.testing.assert_array_equal(back, a)


@needs_torch
@pytest.mark.parametrize("dtype, label", [("bfloat16", "bfloat16"), ("float8_e4m3fn", "float8_e4m3fn"),
                                          ("float8_e5m2", "float8_e5m2")])
def test_16_dtypes_numpy_cannot_hold_raise_buffer_error(dtype, label):
    with pytest.raises(BufferError, match=label):
        from_dlpack(torch.zeros(3, dtype=getattr(torch, dtype)))


@needs_torch
def test_17_torch_tensors_that_need_care():
    with pytest.raises(BufferError, match="gradient"):
        from_dlpack(torch.ones(2, requires_grad=True))
    with pytest.raises(BufferError, match="conjugate"):
        from_dlpack(torch.tensor([1 + 2j]).conj())
    negated = torch.tensor([1 + 2j, 3 + 4j]).conj().imag  # torch exports this memory without the sign
    assert negated.is_neg() and negated.tolist() == [-2.0, -4.0]
    assert from_dlpack(negated).tolist() == [-2.0, -4.0]
    with pytest.raises(DLPackCopyError, match="resolve_neg"):
        from_dlpack(negated, copy=False)


# ---------------------------------------------------------------------------- compiled functions and the Workspace

@needs_torch
def test_compiled_function_takes_a_torch_tensor_without_copy():
    x = input_value(TensorType((None, 3), "float32"), "x")
    f = cgvm.compile([x], S.reshape(x, shape=(-1,)))  # a view of the input comes back
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    out = f(t)
    assert address(out) == t.data_ptr() and out.tolist() == [0, 1, 2, 3, 4, 5]
    t.mul_(10)  # written through torch, seen through cgvm's output
    assert out[5] == 50.0
    assert address(f(Tensor(t))) == t.data_ptr()  # a cgvm.Tensor is a producer too
    converted = f(t.double())  # another dtype is converted (a copy), not refused
    assert converted.dtype == np.float32 and converted[5] == 50.0


@needs_torch
def test_workspace_entry_set_from_torch_shares_its_memory():
    ws = cgvm.Workspace()
    w = param_value("w", TensorType((3,), "float32"))
    f = cgvm.compile([], R.sum(w), workspace=ws)
    t = torch.ones(3)
    ws["w"] = t
    assert address(ws["w"]) == t.data_ptr()
    assert float(f()) == 3.0
    t.mul_(2)  # the compiled function reads the parameter torch just wrote
    assert float(f()) == 6.0


@needs_torch
def test_workspace_tensor_zero_copy_both_ways():
    ws = cgvm.Workspace()
    ws["w"] = np.zeros(4, np.float32)
    w = param_value("w", TensorType((4,), "float32"))
    f = cgvm.compile([], E.mul(w, 2.0), workspace=ws)
    tw = torch.from_dlpack(ws.tensor("w"))
    assert tw.data_ptr() == address(ws["w"])
    tw.add_(1.0)                                      # torch writes, cgvm reads
    assert ws["w"].tolist() == [1, 1, 1, 1] and f().tolist() == [2, 2, 2, 2]
    ws.assign("w", np.arange(4, dtype=np.float32))   # cgvm writes in place, torch reads
    assert tw.tolist() == [0, 1, 2, 3]
    t = ws.tensor("w")
    assert t.name == "w" and t.shape == (4,) and t.dtype == np.float32 and t.numpy() is ws["w"]
    assert np.asarray(t) is ws["w"] and "cgvm.Tensor 'w' float32[4] on CPU:0" in repr(t)


@needs_torch
def test_exported_parameter_keeps_its_values_across_updates():
    # updates rebind the name to a new array; the exported one is never written or reused
    ws = cgvm.Workspace()
    ws["w"] = np.ones(3, np.float32)
    w = param_value("w", TensorType((3,), "float32"))
    step = cgvm.compile([], [R.sum(w)], workspace=ws, updates={w: E.mul(w, 2.0)})
    exported = torch.from_dlpack(ws.tensor("w"))
    for _ in range(3):
        step()
    assert exported.tolist() == [1, 1, 1] and ws["w"].tolist() == [8, 8, 8]
    assert torch.from_dlpack(ws.tensor("w")).tolist() == [8, 8, 8]


def _planned_function():
    x = input_value(TensorType((None, 64), "float32"), "x")
    hidden = E.tanh(E.mul(E.exp(E.mul(x, 0.01)), 3.0))    # intermediates the planner puts in its buffers
    return cgvm.compile([x], [E.add(hidden, 1.0), R.sum(hidden, axis=1)])


def test_outputs_never_share_memory_with_planned_buffers_or_each_other():
    f = _planned_function()
    x = np.random.default_rng(0).standard_normal((32, 64)).astype(np.float32)
    first = f(x)
    second = f(x + 1)
    buffers = [b for frame in f.executable.frames.values() for b in frame.buffers]
    assert buffers, "the test needs a function whose intermediates are planned"
    for out in first + second:
        assert not any(np.shares_memory(out, b) for b in buffers)
    for a in first:
        assert not any(np.shares_memory(a, b) for b in second)


@pytest.mark.parametrize("kind", CONSUMERS)
def test_exported_outputs_survive_later_calls(kind):
    f = _planned_function()
    x = np.ones((8, 64), np.float32)
    out, _ = f(x)
    peer = consume(kind, Tensor(out))
    expected = np.asarray(peer).copy()
    for k in range(3):
        f(x * (k + 2))  # the planned buffers are rewritten each call; the exported output is not among them
    np.testing.assert_array_equal(np.asarray(peer), expected)


def test_tensor_wraps_producers_and_plain_data():
    assert Tensor([1, 2, 3]).numpy().tolist() == [1, 2, 3]
    a = np.arange(3.0)
    assert Tensor(Tensor(a)).array is a
    assert np.array(Tensor(a), dtype=np.float32, copy=True).dtype == np.float32
    assert len(Tensor(a)) == 3 and Tensor(a).ndim == 1 and Tensor(a).size == 3
    assert Tensor(a).device == (DLDeviceType.CPU, 0)


# ---------------------------------------------------------------------------- CuPy (GPU runs only)

@needs_cupy
def test_cupy_rows_8_11_18():
    import cupy

    host = np.arange(6, dtype=np.float32)
    with pytest.raises(DLPackCopyError):
        from_dlpack(host, backend="cupy", copy=False)
    on_gpu = from_dlpack(host, backend="cupy")              # row 18: an explicit host-to-device copy
    assert isinstance(on_gpu, cupy.ndarray) and on_gpu.get().tolist() == host.tolist()
    t = Tensor(on_gpu)
    assert t.__dlpack_device__() == (DLDeviceType.CUDA, on_gpu.device.id)    # row 11
    assert from_dlpack(t).data.ptr == on_gpu.data.ptr       # zero-copy on the device
    info = capsule_info(t.__dlpack__(max_version=(1, 0), dl_device=(1, 0)))  # row 8: a host copy
    assert info.is_copied and info.device[0] == DLDeviceType.CPU
    assert from_dlpack(t, device="cpu").tolist() == host.tolist()
    reversed_ = Tensor(on_gpu[::-1])
    assert min(capsule_info(reversed_.__dlpack__(max_version=(1, 0))).strides) >= 0
