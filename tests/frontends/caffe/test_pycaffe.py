"""The `cgvm.caffe` module surface: import alias, modes, forward_all, MemoryData, the solver hook."""
import numpy as np
import pytest

import cgvm
import cgvm.caffe as caffe
from cgvm.errors import BackendUnavailable

DEPLOY = """layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 4 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""


def test_module_surface():
    assert caffe.TRAIN == 0 and caffe.TEST == 1
    assert {"Convolution", "InnerProduct", "Python"} <= set(caffe.layer_type_list())
    assert caffe.proto.caffe_pb2.NetParameter is not None
    caffe.set_mode_cpu()
    with pytest.raises(TypeError):
        caffe.Net(DEPLOY)
    with pytest.raises(FileNotFoundError, match="Could not open file"):
        caffe.Net("/nonexistent/net.prototxt", caffe.TEST)


def test_set_mode_gpu_without_cupy_is_a_clear_error():
    if "cupy" in cgvm.available_backends():
        pytest.skip("CuPy is available here")
    with pytest.raises(BackendUnavailable):
        caffe.set_mode_gpu()
    caffe.set_mode_cpu()


def test_forward_all_pads_and_trims():
    net = caffe.Net(DEPLOY, caffe.TEST, seed=0)
    x = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    out = net.forward_all(data=x)["prob"]
    w = net.params["ip"][0].data
    logits = x @ w.T + net.params["ip"][1].data
    expected = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(out, expected / expected.sum(1, keepdims=True), rtol=1e-5)
    with pytest.raises(Exception, match="batch sized"):
        net.forward(data=x)


def test_memory_data_and_training_graph():
    text = """layer { name: "data" type: "MemoryData" top: "data" top: "label"
  memory_data_param { batch_size: 2 channels: 1 height: 1 width: 3 } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" loss_weight: 2 }
"""
    net = caffe.Net(text, caffe.TRAIN, seed=0)
    data = np.arange(12, dtype=np.float32).reshape(4, 1, 1, 3) / 10
    net.set_input_arrays(data, np.array([0, 1, 1, 0], np.float32))
    assert [(p.name, p.lr_mult, p.decay_mult) for p in net.learnable_params] == [("ip/0", 1, 1), ("ip/1", 2, 0)]
    tg = net.training_graph()
    step = cgvm.Function([], [tg.loss] + [tg.grads[p.name] for p in tg.params], workspace=net.workspace)
    net.prepare_step()
    loss, gw, gb = step()
    np.testing.assert_array_equal(net.blobs["data"].data, data[:2])
    ref_loss = net.forward()  # the next batch: compare with the pycaffe path on the same batch instead
    net.set_input_arrays(data, np.array([0, 1, 1, 0], np.float32))
    net.forward()
    net.clear_param_diffs()
    net.backward()
    assert float(net.blobs["loss"].data) * 2 == pytest.approx(float(loss), rel=1e-5)
    np.testing.assert_allclose(net.params["ip"][0].diff, gw, rtol=1e-5)
    np.testing.assert_allclose(net.params["ip"][1].diff, gb, rtol=1e-5)
    assert ref_loss is not None
