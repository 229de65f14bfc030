"""Forward passes of real Caffe deploy nets with random weights against a PyTorch reference.

The reference (benchmarks/torch_caffe.py) re-runs the net layer by layer with torch.nn.functional
from the same NetParameter and the same weights. Batches are small to keep the file fast.
"""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import cgvm.caffe as caffe  # noqa: E402
from benchmarks.torch_caffe import torch_forward  # noqa: E402
from shared_paths import SHARED_CAFFE_MODELS  # noqa: E402

MODELS = str(SHARED_CAFFE_MODELS)
NETS = [("lenet/lenet.prototxt", 2), ("cifar10_quick/cifar10_quick.prototxt", 2),
        ("bvlc_alexnet/deploy.prototxt", 1), ("bvlc_googlenet/deploy.prototxt", 1),
        ("legacy_input_dim_caffenet/deploy.prototxt", 1)]


@pytest.mark.skipif(not os.path.isdir(MODELS), reason="no shared Caffe models")
@pytest.mark.parametrize("path, batch", NETS, ids=[n for n, _ in NETS])
def test_forward_matches_torch(path, batch):
    net = caffe.Net(os.path.join(MODELS, path), caffe.TEST, seed=0)
    rng = np.random.default_rng(0)
    for name, params in net.params.items():   # random weights with a sane scale
        for blob in params:
            fan_in = max(int(np.prod(blob.data.shape[1:])), 1)
            blob.data[...] = rng.normal(0, 1.0 / np.sqrt(fan_in), blob.data.shape)
    shape = (batch,) + net.blobs[net.inputs[0]].shape[1:]
    net.blobs[net.inputs[0]].reshape(*shape)
    data = rng.normal(0, 1, shape).astype(np.float32)
    net.blobs[net.inputs[0]].data[...] = data
    out = net.forward()
    with torch.no_grad():
        ref = torch_forward(net, data)
    for name in net.outputs:
        expected = ref[name].numpy()
        assert out[name].shape == expected.shape
        np.testing.assert_allclose(out[name], expected, rtol=1e-4, atol=1e-6 * max(np.abs(expected).max(), 1e-30))
    for name in ("pool1", "norm1", "conv1", "fc6"):
        if name in net.blobs and name in ref:
            e = ref[name].numpy()
            np.testing.assert_allclose(net.blobs[name].data, e, rtol=1e-4, atol=1e-4 * np.abs(e).max())
