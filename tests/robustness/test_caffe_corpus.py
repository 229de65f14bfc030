"""A corpus of malformed Caffe files (written here, small): each gives a clean cgvm error naming the
file and the part at fault, and leaves what it was loaded into exactly as it was."""
import json
import os
from pathlib import Path

import numpy as np
import pytest

import cgvm.caffe as caffe
from cgvm.errors import CgvmError, LoadTimeout, ResourceLimitError
from cgvm.frontends.caffe import caffe_pb2, weights
from cgvm.frontends.caffe.io import array_to_blobproto, blobproto_to_array
from cgvm.frontends.caffe.prototxt import read_blobproto
from fuzz.targets_caffe import SMALL_NET, TRAIN_NET, _solver_fingerprint, _solver_text, _workspace_arrays, _digest


def _ws_digest(net) -> str:
    return _digest(_workspace_arrays(net.workspace))


# ----------------------------------------------------------------------------- prototxt -> Net

def _with(old: str, new: str) -> str:
    assert old in SMALL_NET
    return SMALL_NET.replace(old, new)


PROTOTXT_CORPUS = {
    "num_output 10**12": (_with("num_output: 4", "num_output: 1000000000000"), CgvmError, "out of range"),
    "num_output 4e9": (_with("num_output: 4", "num_output: 4000000000"), ResourceLimitError, "ip1"),
    "num_output 2**31": (_with("num_output: 4", "num_output: 2147483647"), ResourceLimitError, "needs"),
    "input dim 10**12": (_with("dim: 2 dim: 1", "dim: 1000000000000 dim: 1"), ResourceLimitError, "data layers"),
    "kernel 2**31": (_with("kernel_size: 3", "kernel_size: 2147483647"), CgvmError, "conv1"),
    "xavier zero fan-in": (_with("num_output: 3 kernel_size: 3", "num_output: 0 kernel_size: 3"), CgvmError, "conv1"),
    "uniform min > max": (_with('type: "gaussian" std: 0.1', 'type: "uniform" min: 2 max: 1'), CgvmError, "min 2"),
    "gaussian std < 0": (_with("std: 0.1", "std: -1"), CgvmError, "std -1"),
    "uniform inf bound": (_with('type: "gaussian" std: 0.1', 'type: "uniform" min: -inf max: 1'), CgvmError, "finite"),
    "unknown filler": (_with('type: "gaussian"', 'type: "gauss"'), CgvmError, "gauss"),
    "nested 5000 deep": (SMALL_NET + "layer {" * 5000 + "}" * 5000, CgvmError, "prototxt"),
    "truncated": (SMALL_NET[:len(SMALL_NET) // 2], CgvmError, "prototxt"),
    "not utf-8": (SMALL_NET.replace("small", "sm\udcffall"), CgvmError, "UTF-8"),
}


@pytest.mark.parametrize("case", sorted(PROTOTXT_CORPUS))
def test_malformed_prototxt(tmp_path, monkeypatch, case):
    monkeypatch.setenv("CGVM_MAX_BYTES", "256M")
    text, error, match = PROTOTXT_CORPUS[case]
    path = tmp_path / "net.prototxt"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(error, match=match) as info:
        caffe.Net(str(path), caffe.TEST)
    assert str(path) in str(info.value) or "net.prototxt" in str(info.value)


def test_huge_net_is_refused_before_anything_is_allocated(tmp_path, monkeypatch):
    """32 TiB of blobs: the error says how much and why; the shared workspace gets nothing."""
    monkeypatch.setenv("CGVM_MAX_BYTES", "1G")
    path = tmp_path / "net.prototxt"
    path.write_text(_with("dim: 2 dim: 1 dim: 8 dim: 8", "dim: 2 dim: 1 dim: 8 dim: 8000000000000"))
    ws = caffe.Net(SMALL_NET, caffe.TEST).workspace
    before = sorted(ws.keys())
    with pytest.raises(ResourceLimitError, match=r"needs .*TiB.*limit of 1 GiB.*CGVM_MAX_BYTES") as info:
        caffe.Net(str(path), caffe.TEST, workspace=ws)
    assert "data" in str(info.value)
    assert sorted(ws.keys()) == before
    from cgvm import Workspace

    path.write_text(_with("num_output: 4", "num_output: 4000000000"))   # a learnable blob of 400 GiB
    ws = Workspace()
    ws["keep"] = np.ones(3, np.float32)
    with pytest.raises(ResourceLimitError, match=r"needs 953.7 GiB.*ip1/0 804.7 GiB"):
        caffe.Net(str(path), caffe.TEST, workspace=ws)
    assert sorted(ws.keys()) == ["keep"]


def test_directory_and_binary_given_as_prototxt(tmp_path):
    with pytest.raises((CgvmError, IsADirectoryError)):
        caffe.Net(str(tmp_path), caffe.TEST)
    model = tmp_path / "w.caffemodel"
    weights.save(caffe.Net(SMALL_NET, caffe.TEST), str(model))
    with pytest.raises(CgvmError, match="binary file, not prototxt"):
        caffe.Net(str(model), caffe.TEST)


def test_dummy_data_bad_filler_and_size(tmp_path, monkeypatch):
    monkeypatch.setenv("CGVM_MAX_BYTES", "64M")
    huge = TRAIN_NET.replace("shape { dim: 4 dim: 6 }", "shape { dim: 4 dim: 1000000000000 }")
    with pytest.raises(ResourceLimitError, match="data layers"):
        caffe.Net(huge, caffe.TEST)
    bad = TRAIN_NET.replace("data_filler { type: \"gaussian\" std: 1 }", "data_filler { type: \"gaussian\" std: -2 }")
    with pytest.raises(CgvmError, match="layer 'data'.*std -2"):
        caffe.Net(bad, caffe.TEST)


# ----------------------------------------------------------------------------- caffemodel -> copy_from

@pytest.fixture
def small(tmp_path):
    """A net, two good weight files (binary, HDF5) with other weights than the net's."""
    (tmp_path / "small.prototxt").write_text(SMALL_NET)
    other = caffe.Net(str(tmp_path / "small.prototxt"), caffe.TEST, seed=9)
    weights.save(other, str(tmp_path / "good.caffemodel"))
    weights.save_hdf5(other, str(tmp_path / "good.caffemodel.h5"))
    net = caffe.Net(str(tmp_path / "small.prototxt"), caffe.TEST, seed=1)
    return net, tmp_path


def _bad_caffemodels(tmp_path: Path):
    good = (tmp_path / "good.caffemodel").read_bytes()
    msg = caffe_pb2.NetParameter.FromString(good)
    wrong_shape = caffe_pb2.NetParameter()
    wrong_shape.CopyFrom(msg)
    wrong_shape.layer[1].blobs[0].shape.dim[0] = 5
    del wrong_shape.layer[1].blobs[0].data[:]
    wrong_shape.layer[1].blobs[0].data.extend([0.0] * (5 * 27))
    extra_blob = caffe_pb2.NetParameter()
    extra_blob.CopyFrom(msg)
    extra_blob.layer[1].blobs.add().CopyFrom(msg.layer[1].blobs[1])
    claims = caffe_pb2.NetParameter()
    claims.CopyFrom(msg)
    claims.layer[1].blobs[0].shape.dim[0] = 10 ** 12
    yield "truncated", good[:len(good) // 2], "caffemodel"
    yield "empty", b"", "empty"
    yield "text", SMALL_NET.encode(), "text file"
    yield "wrong shape", wrong_shape.SerializeToString(), "conv1"
    yield "extra blob", extra_blob.SerializeToString(), "conv1"
    yield "claims 10**12 values", claims.SerializeToString(), "conv1"


def test_malformed_caffemodel_in_a_comma_list_changes_nothing(small):
    """A good file first, then a bad one: all or nothing, as copy_from's docstring says."""
    net, tmp = small
    for name, data, match in _bad_caffemodels(tmp):
        bad = tmp / f"bad_{name.replace(' ', '_')}.caffemodel"
        bad.write_bytes(data)
        before = _ws_digest(net)
        with pytest.raises(CgvmError, match=match) as info:
            net.copy_from(f"{tmp / 'good.caffemodel'},{bad}")
        assert str(bad) in str(info.value), name
        assert _ws_digest(net) == before, name
    net.copy_from(str(tmp / "good.caffemodel"))   # and a good list still loads
    assert _ws_digest(net) != before


def test_malformed_hdf5_weights_change_nothing(small):
    h5py = pytest.importorskip("h5py")
    net, tmp = small
    good = (tmp / "good.caffemodel.h5").read_bytes()
    cases = {"truncated": good[:len(good) // 2], "flipped": good[:600] + bytes(b ^ 0xFF for b in good[600:700]) + good[700:]}
    for name, data in cases.items():
        path = tmp / f"{name}.caffemodel.h5"
        path.write_bytes(data)
        before = _ws_digest(net)
        with pytest.raises(CgvmError, match=str(path)):
            net.copy_from(f"{tmp / 'good.caffemodel'},{path}")
        assert _ws_digest(net) == before, name
    strings = tmp / "strings.caffemodel.h5"
    with h5py.File(strings, "w") as f:
        f.create_dataset("data/conv1/0", data=np.array([b"not", b"numbers"]))
    before = _ws_digest(net)
    with pytest.raises(CgvmError, match="/data/conv1/0 is not a numeric dataset"):
        net.copy_from(str(strings))
    assert _ws_digest(net) == before


def test_directory_as_weights(small):
    net, tmp = small
    with pytest.raises(CgvmError, match="directory"):
        net.copy_from(str(tmp))


# ----------------------------------------------------------------------------- binaryproto

def test_malformed_binaryproto(tmp_path):
    good = array_to_blobproto(np.ones((1, 3, 2, 2), np.float32)).SerializeToString()
    no_shape = caffe_pb2.BlobProto(data=[1, 2, 3]).SerializeToString()
    short = caffe_pb2.BlobProto(num=1, channels=3, height=2, width=10 ** 9, data=[1]).SerializeToString()
    for name, data in {"truncated": good[:7], "empty": b"", "no shape": no_shape, "claims 6e9 values": short,
                       "hdf5": b"\x89HDF\r\n\x1a\n" + bytes(50)}.items():
        path = tmp_path / f"{name.replace(' ', '_')}.binaryproto"
        path.write_bytes(data)
        with pytest.raises(CgvmError) as info:
            blobproto_to_array(read_blobproto(str(path)))
        assert path.name in str(info.value) or name == "no shape", name


# ----------------------------------------------------------------------------- solverstate -> restore

@pytest.fixture(params=["binaryproto", "hdf5"])
def snapshot(request, tmp_path):
    (tmp_path / "train.prototxt").write_text(TRAIN_NET)
    fmt = "snapshot_format: HDF5\n" if request.param == "hdf5" else ""
    solver_file = tmp_path / "solver.prototxt"
    solver_file.write_text(_solver_text(f'net: "{tmp_path / "train.prototxt"}"', "Adam",
                                        f'snapshot_prefix: "{tmp_path / "snap"}"\n{fmt}'))
    trained = caffe.get_solver(str(solver_file), log=False)
    trained.step(2)
    model, state = trained.snapshot()
    fresh = caffe.get_solver(str(solver_file), log=False)
    fresh.step(1)   # a solver with its own iteration, histories and random state
    return fresh, Path(state), Path(model), request.param


def _expect_untouched(solver, state_file, match):
    before = _solver_fingerprint(solver)
    with pytest.raises(CgvmError, match=match):
        solver.restore(str(state_file))
    assert _solver_fingerprint(solver) == before


def test_good_snapshot_restores(snapshot):
    solver, state, model, kind = snapshot
    solver.restore(str(state))
    assert solver.iter == 2


def test_truncated_solverstate(snapshot, tmp_path):
    solver, state, model, kind = snapshot
    bad = tmp_path / ("cut" + ("".join(state.suffixes[-2:]) if kind == "hdf5" else state.suffix))
    bad.write_bytes(state.read_bytes()[:len(state.read_bytes()) // 2])
    _expect_untouched(solver, bad, bad.name)


def test_solverstate_whose_weights_do_not_fit(snapshot):
    """The bug of issue 20: restore set the iteration and histories, then failed on the weights."""
    solver, state, model, kind = snapshot
    data = model.read_bytes()
    model.write_bytes(data[:len(data) // 2])
    _expect_untouched(solver, state, model.name)


def test_solverstate_with_wrong_history_count(snapshot, tmp_path):
    solver, state, model, kind = snapshot
    if kind != "binaryproto":
        pytest.skip("the binary form is enough to check the count")
    msg = caffe_pb2.SolverState.FromString(state.read_bytes())
    del msg.history[-1]
    bad = tmp_path / "fewer.solverstate"
    bad.write_bytes(msg.SerializeToString())
    _expect_untouched(solver, bad, "history blobs")


def test_hdf5_solverstate_with_bad_datasets(snapshot, tmp_path):
    h5py = pytest.importorskip("h5py")
    solver, state, model, kind = snapshot
    if kind != "hdf5":
        pytest.skip("HDF5 only")
    cases = {"iter as text": lambda f: (f.__delitem__("iter"), f.create_dataset("iter", data=b"seven")),
             "history as strings": lambda f: (f["history"].__delitem__("0"),
                                              f["history"].create_dataset("0", data=np.array([b"x"])))}
    for name, change in cases.items():
        bad = tmp_path / f"{name.replace(' ', '_')}.solverstate.h5"
        bad.write_bytes(state.read_bytes())
        with h5py.File(bad, "r+") as f:
            change(f)
        _expect_untouched(solver, bad, "/iter|/history/0")


@pytest.mark.parametrize("content", ["{not json", json.dumps({"nets": "x"}), json.dumps({"nets": [{"rng": 5, "data": {}}]}),
                                     "[" * 100000])
def test_bad_run_state_json_changes_nothing(snapshot, content):
    solver, state, model, kind = snapshot
    Path(str(state) + ".cgvm-run.json").write_text(content)
    _expect_untouched(solver, state, "cgvm-run.json")


def test_run_state_a_data_layer_refuses_is_rolled_back(snapshot):
    solver, state, model, kind = snapshot
    run_file = Path(str(state) + ".cgvm-run.json")
    saved = json.loads(run_file.read_text())
    saved["nets"][0]["data"] = {"data": {"position": "nowhere"}}
    run_file.write_text(json.dumps(saved))
    before = _solver_fingerprint(solver)
    try:
        solver.restore(str(state))
    except CgvmError:
        assert _solver_fingerprint(solver) == before
    # a DummyData layer keeps no position: ignoring the entry is right as well


# ----------------------------------------------------------------------------- solver prototxt

def test_solver_histories_past_the_limit(tmp_path, monkeypatch):
    net = TRAIN_NET.replace("num_output: 5", "num_output: 200000")
    (tmp_path / "train.prototxt").write_text(net)
    solver_file = tmp_path / "solver.prototxt"
    solver_file.write_text(_solver_text(f'net: "{tmp_path / "train.prototxt"}"', "Adam"))
    monkeypatch.setenv("CGVM_MAX_BYTES", "40M")   # the net fits (about 37 MB); with Adam's two histories it does not
    with pytest.raises(ResourceLimitError, match="solver .its nets and history blobs.*history blobs"):
        caffe.get_solver(str(solver_file), log=False)


def test_memory_plan_past_the_limit(monkeypatch):
    import cgvm
    from cgvm.ir import TensorType, input_value
    from cgvm.ops import elementwise as E

    from cgvm.ops import linalg as L

    x = input_value(TensorType((None, None)), "x")
    f = cgvm.compile([x], L.matmul(E.exp(L.matmul(x, x)), x))   # one planned buffer of x's size
    monkeypatch.setenv("CGVM_MAX_BYTES", "1M")
    f(np.ones((8, 8), np.float32))
    with pytest.raises(ResourceLimitError, match="memory plan"):
        f(np.ones((1024, 1024), np.float32))


# ----------------------------------------------------------------------------- reads that never return

def _never_returns():
    import time

    while True:
        time.sleep(1)


def test_a_read_that_never_returns_is_stopped():
    from cgvm.guard import call_with_deadline

    with pytest.raises(LoadTimeout, match="reading x.h5: no answer after"):
        call_with_deadline(_never_returns, what="reading x.h5", timeout=0.5)


def test_a_reader_that_dies_is_an_error():
    from cgvm.errors import LoadError
    from cgvm.guard import call_with_deadline

    with pytest.raises(LoadError, match="died"):
        call_with_deadline(os._exit, 3, what="reading", timeout=5)


def test_guarded_errors_come_back_as_they_were():
    from cgvm.guard import call_with_deadline

    with pytest.raises(ZeroDivisionError):
        call_with_deadline(divmod, 1, 0, what="dividing", timeout=5)
    assert call_with_deadline(divmod, 7, 2, what="dividing", timeout=5) == (3, 1)


@pytest.mark.parametrize("kind, extra, match", [
    ("Adam", "momentum: 1", "Adam needs 0 <= momentum < 1"),
    ("SGD", "test_iter: -2147483648\ntest_interval: 2", "test_iter must be >= 0"),   # found by the fuzzer
    ("SGD", 'lr_policy: "exp"\ngamma: 1e300', "gives no learning rate"),
])
def test_solver_values_that_break_the_learning_rate(tmp_path, kind, extra, match):
    (tmp_path / "train.prototxt").write_text(TRAIN_NET)
    solver_file = tmp_path / "solver.prototxt"
    text = _solver_text(f'net: "{tmp_path / "train.prototxt"}"', kind, policy="")
    text = text.replace("momentum: 0.9\n", "") if "momentum" in extra else text
    text = text.replace("gamma: 0.5\n", "") if "gamma" in extra else text
    solver_file.write_text(text + (extra if "lr_policy" in extra else 'lr_policy: "fixed"\n' + extra) + "\n")
    with pytest.raises(CgvmError, match=match):
        solver = caffe.get_solver(str(solver_file), log=False)
        solver.step(3)


def test_snapshot_of_a_big_layer_is_fast_and_exact(tmp_path):
    """Blobs are written as packed floats in one piece (a Python list per value took seconds per 10**7)."""
    import time

    net = caffe.Net(SMALL_NET.replace("num_output: 4", "num_output: 20000"), caffe.TEST, seed=2)
    start = time.perf_counter()
    weights.save(net, str(tmp_path / "big.caffemodel"))
    elapsed = time.perf_counter() - start
    back = caffe.Net(SMALL_NET.replace("num_output: 4", "num_output: 20000"), caffe.TEST, seed=3)
    back.copy_from(str(tmp_path / "big.caffemodel"))
    np.testing.assert_array_equal(back.params["ip1"][0].data, net.params["ip1"][0].data)
    assert elapsed < 5.0, elapsed   # about 0.05 s; the old path took over a second even unloaded


def test_im2col_kernel_is_checked_before_it_is_made(monkeypatch):
    """Found by the fuzzer: Im2col builds a one-hot kernel of channels * taps**2 values at graph build."""
    from fuzz.targets_caffe import ZOO_NET

    monkeypatch.setenv("CGVM_MAX_BYTES", "64M")
    huge = ZOO_NET.replace("convolution_param { kernel_size: 2 stride: 2 } }", "convolution_param { kernel_size: 2 "
                           "kernel_size: 4000000000 stride: 2 } }")
    with pytest.raises(ResourceLimitError, match="layer 'im2col' .Im2col.: the Im2col kernel"):
        caffe.Net(huge, caffe.TEST)
