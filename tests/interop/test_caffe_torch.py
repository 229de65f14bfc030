"""Forward passes of real Caffe deploy nets with random weights against a PyTorch reference.

The reference is built here, layer by layer from the same NetParameter and the same weights, with
torch.nn.functional (Caffe's pooling ceil rule is torch's ceil_mode; its LRN is torch's
local_response_norm). Batches are small to keep the file fast.
"""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import cgvm.caffe as caffe  # noqa: E402
from cgvm.frontends.caffe import caffe_pb2  # noqa: E402

MODELS = "/work/shared/models/caffe"
NETS = [("lenet/lenet.prototxt", 2), ("cifar10_quick/cifar10_quick.prototxt", 2),
        ("bvlc_alexnet/deploy.prototxt", 1), ("bvlc_googlenet/deploy.prototxt", 1),
        ("legacy_input_dim_caffenet/deploy.prototxt", 1)]


def _pair(param, single, h, w, default):
    if param.HasField(h) or param.HasField(w):
        return getattr(param, h), getattr(param, w)
    value = getattr(param, single)
    if isinstance(value, int):
        return (value, value) if param.HasField(single) else (default, default)
    return (value[0], value[0]) if len(value) else (default, default)


def torch_forward(net, data):
    """Run ``net``'s layers with torch on ``data``; return every blob."""
    blobs = {net.inputs[0]: torch.from_numpy(data)}
    for info in net.layer_infos:
        p = info.param
        xs = [blobs[b] for b in info.bottoms]
        ws = [torch.from_numpy(np.array(net.workspace[q.name])) for q in info.params]
        t = p.type
        if t == "Input":
            continue
        if t == "Convolution":
            c = p.convolution_param
            y = F.conv2d(xs[0], ws[0], ws[1] if len(ws) > 1 else None, stride=_pair(c, "stride", "stride_h", "stride_w", 1),
                         padding=_pair(c, "pad", "pad_h", "pad_w", 0), groups=c.group)
        elif t == "Pooling":
            c = p.pooling_param
            k = _pair(c, "kernel_size", "kernel_h", "kernel_w", 0)
            s = _pair(c, "stride", "stride_h", "stride_w", 1)
            pad = _pair(c, "pad", "pad_h", "pad_w", 0)
            if c.global_pooling:
                k, s, pad = tuple(xs[0].shape[2:]), (1, 1), (0, 0)
            if c.pool == caffe_pb2.PoolingParameter.MAX:
                y = F.max_pool2d(xs[0], k, s, pad, ceil_mode=True)
            else:
                y = F.avg_pool2d(xs[0], k, s, pad, ceil_mode=True, count_include_pad=True)
        elif t == "ReLU":
            y = F.leaky_relu(xs[0], p.relu_param.negative_slope)
        elif t == "LRN":
            c = p.lrn_param
            y = F.local_response_norm(xs[0], c.local_size, c.alpha, c.beta, c.k)
        elif t == "InnerProduct":
            y = F.linear(xs[0].reshape(xs[0].shape[0], -1), ws[0], ws[1] if len(ws) > 1 else None)
        elif t == "Dropout":
            y = xs[0]
        elif t == "Softmax":
            y = F.softmax(xs[0], dim=p.softmax_param.axis)
        elif t == "Concat":
            y = torch.cat(xs, dim=p.concat_param.axis)
        elif t == "Split":
            for top in info.tops:
                blobs[top] = xs[0]
            continue
        else:
            raise AssertionError(f"reference has no {t}")
        blobs[info.tops[0]] = y
    return blobs


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
