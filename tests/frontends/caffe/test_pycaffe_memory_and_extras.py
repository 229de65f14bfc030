"""pycaffe fidelity: blob memory that stays the blob's across forward/backward/step/apply_update,
``caffe.coord_map`` (checked against the arithmetic of the conv/pool/deconv geometry), ``Detector``,
``Timer``, ``init_log``/``log``, ``has_nccl`` and the ``cgvm.caffe.proto.caffe_pb2`` module path."""
from __future__ import annotations

import importlib
import importlib.util

import numpy as np
import pytest

import cgvm.caffe as caffe
from cgvm.caffe import layers as L, params as P

NET = """
name: "tiny"
force_backward: true
layer { name: "data" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 3 dim: 6 dim: 6 } shape { dim: 4 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 5 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "conv" }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def _net(tmp_path, phase=caffe.TRAIN):
    path = tmp_path / "tiny.prototxt"
    path.write_text(NET)
    net = caffe.Net(str(path), phase, seed=3)
    rng = np.random.default_rng(0)
    net.blobs["data"].data[...] = rng.normal(size=(4, 3, 6, 6))
    net.blobs["label"].data[...] = [0, 1, 2, 1]
    return net, str(path)


def test_held_blob_arrays_see_every_forward_and_backward(tmp_path):
    net, _ = _net(tmp_path)
    held = {name: (blob.data, blob.diff) for name, blob in net.blobs.items()}
    held_params = {name: [(p.data, p.diff) for p in ps] for name, ps in net.params.items()}
    rng = np.random.default_rng(1)
    for _ in range(2):
        net.blobs["data"].data[...] = rng.normal(size=(4, 3, 6, 6))
        out = net.forward()
        net.backward()
        for name, blob in net.blobs.items():
            data, diff = held[name]
            assert blob.data is data and blob.diff is diff, name
        for name, ps in net.params.items():
            for (data, diff), p in zip(held_params[name], ps):
                assert p.data is data and p.diff is diff, name
        # what forward returned and what the script holds are the blob's current values
        assert float(held["loss"][0]) == pytest.approx(float(out["loss"]))
        ip = held["ip"][0]
        w, b = net.params["ip"][0].data, net.params["ip"][1].data
        np.testing.assert_allclose(ip, held["conv"][0].reshape(4, -1) @ w.T + b, rtol=1e-5, atol=1e-6)
        assert np.abs(held["conv"][1]).sum() > 0 and np.abs(held_params["conv"][0][1]).sum() > 0
    # BatchNorm's running statistics are updated into the same arrays too
    assert held_params["bn"][2][0][()] == pytest.approx(1 + 0.999 * 1)


def test_held_param_arrays_see_solver_step_and_apply_update(tmp_path):
    net_path = _net(tmp_path)[1]
    solver_path = tmp_path / "solver.prototxt"
    solver_path.write_text(f'net: "{net_path}" base_lr: 0.1 momentum: 0.9 lr_policy: "fixed" max_iter: 10 '
                           'display: 0 snapshot_after_train: false')
    solver = caffe.SGDSolver(str(solver_path))
    solver.net.blobs["label"].data[...] = [0, 1, 2, 1]
    solver.net.blobs["data"].data[...] = np.random.default_rng(0).normal(size=(4, 3, 6, 6))
    w = solver.net.params["ip"][0].data
    w_diff = solver.net.params["ip"][0].diff
    loss = solver.net.blobs["loss"].data
    before = w.copy()
    solver.step(1)
    assert solver.net.params["ip"][0].data is w and solver.net.params["ip"][0].diff is w_diff
    assert solver.net.blobs["loss"].data is loss and float(loss) > 0
    # SGD's first step from zero history: w <- w - lr * diff, the step left in the diff (as Caffe does)
    assert not np.array_equal(w, before)
    np.testing.assert_allclose(before - w, w_diff, rtol=1e-5, atol=1e-7)
    # apply_update on a held array (the BVLC pycaffe test's pattern)
    history = w_diff.copy()
    w[...] = 0
    w_diff[...] = 1
    solver.apply_update()
    assert solver.net.params["ip"][0].data is w
    # momentum 0.9 carries the last step: v = 0.9 * v_prev + 0.1 * 1
    np.testing.assert_allclose(w, -(0.9 * history + 0.1), rtol=1e-5)
    np.testing.assert_allclose(w_diff, 0.9 * history + 0.1, rtol=1e-5)


def test_reshape_gives_new_arrays(tmp_path):
    net, _ = _net(tmp_path, caffe.TEST)
    old = net.blobs["data"].data
    net.blobs["data"].reshape(2, 3, 6, 6)
    assert net.blobs["data"].data is not old and net.blobs["data"].data.shape == (2, 3, 6, 6)
    net.blobs["label"].reshape(2)
    net.forward()
    assert net.blobs["ip"].data.shape == (2, 3)


def _coord_spec(ks=3, stride=1, pad=0, pool=2, dstride=2, dpad=0):
    n = caffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 64, 64]))
    n.conv = L.Convolution(n.data, num_output=2, kernel_size=ks, stride=stride, pad=pad)
    n.pool = L.Pooling(n.conv, pool=P.Pooling.MAX, kernel_size=pool, stride=pool)
    # Deconvolution's settings are a convolution_param, as FCN writes them (NetSpec cannot guess that message)
    n.deconv = L.Deconvolution(n.pool, convolution_param=dict(num_output=2, kernel_size=2 * dstride, stride=dstride,
                                                              pad=dpad))
    return n


@pytest.mark.parametrize("ks,stride,pad,pool,dstride,dpad", [(3, 1, 0, 2, 2, 0), (5, 1, 2, 4, 4, 0),
                                                             (3, 1, 1, 2, 2, 1), (7, 1, 0, 2, 2, 3)])
def test_coord_map_offsets_match_the_window_geometry(ks, stride, pad, pool, dstride, dpad):
    from cgvm.caffe.coord_map import coord_map_from_to

    n = _coord_spec(ks, stride, pad, pool, dstride, dpad)
    axis, a, b = coord_map_from_to(n.deconv, n.data)
    # centre of deconv output pixel i, followed back by hand through each layer's window arithmetic
    def centre_in_data(i):
        k = 2 * dstride
        x = (i + dpad - (k - 1) / 2) / dstride          # deconv: input centre of output i
        x = x * pool + (pool - 1) / 2                   # pool: centre of its window
        return x * stride - pad + (ks - 1) / 2          # conv: centre of its window
    assert axis == 1
    for i in (0, 5, 17):
        assert float(a[0] * i + b[0]) == pytest.approx(centre_in_data(i))


def test_crop_layer_from_coord_map_runs_and_aligns():
    from cgvm.caffe.coord_map import crop

    n = _coord_spec(ks=5, pad=3, pool=2, dstride=2)   # deconv 68 x 68 over data 64 x 64, centred 2 pixels in
    n.score = crop(n.deconv, n.data)
    text = str(n.to_proto())
    assert 'type: "Crop"' in text and "offset: 2" in text and "axis: 2" in text
    net = caffe.Net(text, caffe.TEST, seed=0)
    net.blobs["data"].data[...] = np.random.default_rng(0).normal(size=(1, 1, 64, 64))
    net.forward()
    assert net.blobs["deconv"].data.shape[2:] == (68, 68) and net.blobs["score"].data.shape[2:] == (64, 64)
    np.testing.assert_array_equal(net.blobs["score"].data, net.blobs["deconv"].data[:, :, 2:66, 2:66])


def test_crop_refuses_negative_and_mismatched_maps():
    from cgvm.caffe.coord_map import coord_map_from_to, crop

    smaller = _coord_spec(dpad=10)   # the deconv output is smaller than the data
    with pytest.raises(AssertionError, match="negative"):
        crop(smaller.deconv, smaller.data)
    n = _coord_spec(pool=3, dstride=2)
    with pytest.raises(AssertionError, match="scales"):
        crop(n.deconv, n.data)
    n.ip = L.InnerProduct(n.deconv, num_output=3)
    with pytest.raises(RuntimeError, match="share no blob"):
        coord_map_from_to(n.ip, n.data)


def test_detector_windows_and_context(tmp_path):
    from PIL import Image

    image = (np.arange(40 * 50 * 3) % 251).reshape(40, 50, 3).astype(np.uint8)
    path = tmp_path / "im.png"
    Image.fromarray(image).save(path)
    proto = tmp_path / "det.prototxt"
    proto.write_text('layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 dim: 8 dim: 8 } } }'
                     'layer { name: "pool" type: "Pooling" bottom: "data" top: "pool" '
                     'pooling_param { pool: AVE global_pooling: true } }')
    det = caffe.Detector(str(proto), None, raw_scale=255)
    windows = [np.array([0, 0, 8, 8]), np.array([10, 20, 18, 28])]
    found = det.detect_windows([(str(path), windows)])
    assert [d["filename"] for d in found] == [str(path)] * 2
    for d, (y0, x0, y1, x1) in zip(found, windows):
        # an 8x8 window warped to the 8x8 input is itself: the mean of each channel, in raw 0..255 units
        expected = image[y0:y1, x0:x1].reshape(-1, 3).mean(0)
        np.testing.assert_allclose(d["prediction"].ravel(), expected, rtol=1e-4, atol=1e-3)
    padded = caffe.Detector(str(proto), None, raw_scale=255, context_pad=2)
    cut = padded.crop(image.astype(np.float32) / 255, np.array([0, 0, 8, 8]))
    assert cut.shape == (8, 8, 3)
    # the window grows by 8/(8-4) = 2 about its centre: the top-left part lies outside the image (mean 0)
    assert (cut[0, 0] == 0).all() and (cut[-1, -1] > 0).any()


def test_timer_log_nccl_and_module_paths(capsys):
    timer = caffe.Timer()
    timer.start()
    sum(range(10000))
    timer.stop()
    assert timer.ms > 0 and timer.seconds == pytest.approx(timer.ms / 1e3)
    caffe.init_log(0)
    caffe.log("hello from the test")
    line = capsys.readouterr().err.strip()
    assert line.startswith("I") and line.endswith("pycaffe] hello from the test")
    caffe.init_log(1)
    caffe.log("dropped")
    assert capsys.readouterr().err == ""
    caffe.init_log(0)
    if importlib.util.find_spec("cupy") is None:   # NCCL comes with CuPy's bindings
        assert caffe.has_nccl() is False
    module = importlib.import_module("cgvm.caffe.proto.caffe_pb2")
    assert module.NetParameter is caffe.proto.caffe_pb2.NetParameter
    from cgvm.caffe.coord_map import coord_map_from_to  # noqa: F401
