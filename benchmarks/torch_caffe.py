"""A PyTorch reference for Caffe nets: each layer of a cgvm Caffe Net re-run with torch.nn.functional.

Used by the interop tests (values) and the benchmarks (speed of PyTorch eager on the same net,
with the same weights). Caffe's pooling ceil rule is torch's ceil_mode; its LRN is torch's
local_response_norm.
"""
from __future__ import annotations

import numpy as np
import torch

from cgvm.frontends.caffe import caffe_pb2

F = torch.nn.functional


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
