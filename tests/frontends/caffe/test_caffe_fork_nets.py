"""Whole fork nets forward against a reference: the 4 DenseNet-Caffe deploy nets (``ceil_mode``)
and the MobileNet-SSD and VGG-SSD deploy nets (the SSD layer set).

The real files are used when /work/shared/models/caffe has them (``densenet*/``, ``mobilenet_ssd/``,
``vgg_ssd/``, each a ``deploy.prototxt``); otherwise the test writes faithful ones: the same layer
sequence, types, names, kernel/stride/pad/dilation, ``ceil_mode``, PriorBox and DetectionOutput
settings as the published deploy files, with fewer channels (SSD) or a smaller input (DenseNet)
so they run in seconds. Every blob is compared with PyTorch (fork layers: loops from the fork's
formulas, tests/frontends/caffe/fork_reference.py); DetectionOutput is compared on the net's own
inputs to it, since a float32 / float64 difference may reorder near-equal scores.
"""
from __future__ import annotations

import numpy as np
import pytest

import cgvm.caffe as caffe
from tests.frontends.caffe.fork_reference import detection_output_loops, torch_forward
from tests.shared_paths import SHARED_CAFFE_MODELS

pytest.importorskip("torch")

_BN = 'layer {{ name: "{n}/bn" type: "BatchNorm" bottom: "{b}" top: "{n}/bn" batch_norm_param {{ eps: 1e-5 }} }}\n' \
      'layer {{ name: "{n}/scale" type: "Scale" bottom: "{n}/bn" top: "{n}/bn" scale_param {{ bias_term: true }} }}\n' \
      'layer {{ name: "{r}" type: "ReLU" bottom: "{n}/bn" top: "{n}/bn" }}\n'


def _conv(name, bottom, out, k, s=1, p=0, bias=False, group=1, dilation=1):
    extra = f" group: {group}" if group > 1 else ""
    extra += f" dilation: {dilation}" if dilation > 1 else ""
    return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}" convolution_param {{ '
            f'num_output: {out} bias_term: {str(bias).lower()} pad: {p} kernel_size: {k} stride: {s}{extra} '
            'weight_filler { type: "msra" } bias_filler { type: "gaussian" std: 0.1 } } }\n')


def densenet(blocks, growth, features, size):
    """DenseNet-Caffe's deploy layout (shicai/DenseNet-Caffe): names, BN/Scale/ReLU order, ceil_mode: false."""
    text = [f'name: "DenseNet"\ninput: "data"\ninput_dim: 1\ninput_dim: 3\ninput_dim: {size}\ninput_dim: {size}\n',
            _conv("conv1", "data", features, 7, 2, 3), _BN.format(n="conv1", b="conv1", r="relu1"),
            'layer { name: "pool1" type: "Pooling" bottom: "conv1/bn" top: "pool1" pooling_param { pool: MAX '
            'kernel_size: 3 stride: 2 pad: 1 ceil_mode: false } }\n']
    current, channels = "pool1", features
    for b, layers in enumerate(blocks, start=2):
        for i in range(1, layers + 1):
            x1, x2 = f"conv{b}_{i}/x1", f"conv{b}_{i}/x2"
            text += [_BN.format(n=x1, b=current, r=f"relu{b}_{i}/x1"), _conv(x1, f"{x1}/bn", 4 * growth, 1),
                     _BN.format(n=x2, b=x1, r=f"relu{b}_{i}/x2"), _conv(x2, f"{x2}/bn", growth, 3, 1, 1),
                     f'layer {{ name: "concat_{b}_{i}" type: "Concat" bottom: "{current}" bottom: "{x2}" '
                     f'top: "concat_{b}_{i}" }}\n']
            current, channels = f"concat_{b}_{i}", channels + growth
        if b < 1 + len(blocks):
            blk = f"conv{b}_blk"
            channels //= 2
            text += [_BN.format(n=blk, b=current, r=f"relu{b}_blk"), _conv(blk, f"{blk}/bn", channels, 1),
                     f'layer {{ name: "pool{b}" type: "Pooling" bottom: "{blk}" top: "pool{b}" pooling_param {{ '
                     'pool: AVE kernel_size: 2 stride: 2 ceil_mode: false } }\n']
            current = f"pool{b}"
    last = len(blocks) + 1
    text += [_BN.format(n=f"conv{last}_blk", b=current, r=f"relu{last}_blk"),
             f'layer {{ name: "pool{last}" type: "Pooling" bottom: "conv{last}_blk/bn" top: "pool{last}" '
             'pooling_param { pool: AVE global_pooling: true } }\n',
             _conv("fc6", f"pool{last}", 1000, 1, bias=True)]
    return "".join(text)


DENSENETS = {"densenet121": ((6, 12, 24, 16), 32, 64), "densenet161": ((6, 12, 36, 24), 48, 96),
             "densenet169": ((6, 12, 32, 32), 32, 64), "densenet201": ((6, 12, 48, 32), 32, 64)}


def _ssd_head(source, priors, classes, prior_box, heads, k=1):
    pad = k // 2
    out = []
    for kind, n in (("loc", priors * 4), ("conf", priors * classes)):
        name = f"{source}_mbox_{kind}"
        out += [_conv(name, source, n, k, 1, pad, bias=True),
                f'layer {{ name: "{name}_perm" type: "Permute" bottom: "{name}" top: "{name}_perm" permute_param {{ '
                'order: 0 order: 2 order: 3 order: 1 } }\n',
                f'layer {{ name: "{name}_flat" type: "Flatten" bottom: "{name}_perm" top: "{name}_flat" '
                'flatten_param { axis: 1 } }\n']
        heads[kind].append(f"{name}_flat")
    out.append(f'layer {{ name: "{source}_mbox_priorbox" type: "PriorBox" bottom: "{source}" bottom: "data" '
               f'top: "{source}_mbox_priorbox" prior_box_param {{ {prior_box} }} }}\n')
    heads["prior"].append(f"{source}_mbox_priorbox")
    return out


def _ssd_tail(heads, classes, detection):
    cat = lambda name, blobs, axis: (f'layer {{ name: "{name}" type: "Concat" ' + " ".join(  # noqa: E731
        f'bottom: "{b}"' for b in blobs) + f' top: "{name}" concat_param {{ axis: {axis} }} }}\n')
    return [cat("mbox_loc", heads["loc"], 1), cat("mbox_conf", heads["conf"], 1), cat("mbox_priorbox", heads["prior"], 2),
            'layer { name: "mbox_conf_reshape" type: "Reshape" bottom: "mbox_conf" top: "mbox_conf_reshape" '
            f'reshape_param {{ shape {{ dim: 0 dim: -1 dim: {classes} }} }} }}\n',
            'layer { name: "mbox_conf_softmax" type: "Softmax" bottom: "mbox_conf_reshape" top: "mbox_conf_softmax" '
            'softmax_param { axis: 2 } }\n',
            'layer { name: "mbox_conf_flatten" type: "Flatten" bottom: "mbox_conf_softmax" top: "mbox_conf_flatten" '
            'flatten_param { axis: 1 } }\n',
            'layer { name: "detection_out" type: "DetectionOutput" bottom: "mbox_loc" bottom: "mbox_conf_flatten" '
            f'bottom: "mbox_priorbox" top: "detection_out" include {{ phase: TEST }} detection_output_param {{ '
            f'num_classes: {classes} share_location: true background_label_id: 0 {detection} code_type: CENTER_SIZE }} }}\n']


def mobilenet_ssd(width=0.25):
    """chuanqi305/MobileNet-SSD deploy layout: conv0..conv13 (depthwise + pointwise), conv14..17, six heads."""
    c = lambda n: max(8, int(n * width))  # noqa: E731
    text = ['name: "MobileNet-SSD"\ninput: "data"\ninput_shape { dim: 1 dim: 3 dim: 300 dim: 300 }\n',
            _conv("conv0", "data", c(32), 3, 2, 1), _BN.format(n="conv0", b="conv0", r="conv0/relu")]
    current, channels = "conv0/bn", c(32)
    plan = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 + [(1024, 2), (1024, 1)]
    for i, (out, stride) in enumerate(plan, start=1):
        dw = f"conv{i}/dw"
        text += [_conv(dw, current, channels, 3, stride, 1, group=channels), _BN.format(n=dw, b=dw, r=f"{dw}/relu"),
                 _conv(f"conv{i}", f"{dw}/bn", c(out), 1), _BN.format(n=f"conv{i}", b=f"conv{i}", r=f"conv{i}/relu")]
        current, channels = f"conv{i}/bn", c(out)
    for i, (mid, out) in zip(range(14, 18), ((256, 512), (128, 256), (128, 256), (64, 128))):
        a, b = f"conv{i}_1", f"conv{i}_2"
        text += [_conv(a, current, c(mid), 1), _BN.format(n=a, b=a, r=f"{a}/relu"),
                 _conv(b, f"{a}/bn", c(out), 3, 2, 1), _BN.format(n=b, b=b, r=f"{b}/relu")]
        current = f"{b}/bn"
    heads = {"loc": [], "conf": [], "prior": []}
    var = "variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 offset: 0.5"
    text += _ssd_head("conv11/bn", 3, 21, f"min_size: 60.0 aspect_ratio: 2.0 flip: true clip: false {var}", heads)
    for source, lo, hi in (("conv13/bn", 105, 150), ("conv14_2/bn", 150, 195), ("conv15_2/bn", 195, 240),
                           ("conv16_2/bn", 240, 285), ("conv17_2/bn", 285, 300)):
        text += _ssd_head(source, 6, 21, f"min_size: {lo}.0 max_size: {hi}.0 aspect_ratio: 2.0 aspect_ratio: 3.0 "
                          f"flip: true clip: false {var}", heads)
    text += _ssd_tail(heads, 21, "nms_param { nms_threshold: 0.45 top_k: 100 } keep_top_k: 100 "
                      "confidence_threshold: 0.25")
    return "".join(text)


def vgg_ssd(width=0.125):
    """weiliu89's SSD300 VOC0712 deploy layout: VGG16 (pool5 3x3/1, dilated fc6), conv6..9, L2-normalized conv4_3."""
    c = lambda n: max(8, int(n * width))  # noqa: E731
    relu = lambda n: f'layer {{ name: "relu{n[4:]}" type: "ReLU" bottom: "{n}" top: "{n}" }}\n'  # noqa: E731
    text = ['name: "VGG_VOC0712_SSD_300x300_deploy"\ninput: "data"\n'
            'input_shape { dim: 1 dim: 3 dim: 300 dim: 300 }\n']
    current = "data"
    for stage, (out, count) in enumerate(((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)), start=1):
        for i in range(1, count + 1):
            name = f"conv{stage}_{i}"
            text += [_conv(name, current, c(out), 3, 1, 1, bias=True), relu(name)]
            current = name
        pool = "kernel_size: 3 stride: 1 pad: 1" if stage == 5 else "kernel_size: 2 stride: 2"
        text.append(f'layer {{ name: "pool{stage}" type: "Pooling" bottom: "{current}" top: "pool{stage}" '
                    f'pooling_param {{ pool: MAX {pool} }} }}\n')
        current = f"pool{stage}"
    text += [_conv("fc6", current, c(1024), 3, 1, 6, bias=True, dilation=6),
             'layer { name: "relu6" type: "ReLU" bottom: "fc6" top: "fc6" }\n',
             _conv("fc7", "fc6", c(1024), 1, bias=True), 'layer { name: "relu7" type: "ReLU" bottom: "fc7" top: "fc7" }\n']
    current = "fc7"
    for i, (mid, out, s, p) in zip(range(6, 10), ((256, 512, 2, 1), (128, 256, 2, 1), (128, 256, 1, 0), (128, 256, 1, 0))):
        a, b = f"conv{i}_1", f"conv{i}_2"
        text += [_conv(a, current, c(mid), 1, bias=True), f'layer {{ name: "{a}_relu" type: "ReLU" bottom: "{a}" top: "{a}" }}\n',
                 _conv(b, a, c(out), 3, s, p, bias=True), f'layer {{ name: "{b}_relu" type: "ReLU" bottom: "{b}" top: "{b}" }}\n']
        current = b
    text.append('layer { name: "conv4_3_norm" type: "Normalize" bottom: "conv4_3" top: "conv4_3_norm" norm_param { '
                'across_spatial: false scale_filler { type: "constant" value: 20 } channel_shared: false } }\n')
    heads = {"loc": [], "conf": [], "prior": []}
    var = "clip: false variance: 0.1 variance: 0.1 variance: 0.2 variance: 0.2 offset: 0.5"
    for source, lo, hi, ratios, step in (("conv4_3_norm", 30, 60, (2,), 8), ("fc7", 60, 111, (2, 3), 16),
                                         ("conv6_2", 111, 162, (2, 3), 32), ("conv7_2", 162, 213, (2, 3), 64),
                                         ("conv8_2", 213, 264, (2,), 100), ("conv9_2", 264, 315, (2,), 300)):
        ars = " ".join(f"aspect_ratio: {r}" for r in ratios)
        text += _ssd_head(source, 2 + 2 * len(ratios), 21, f"min_size: {lo}.0 max_size: {hi}.0 {ars} flip: true "
                          f"{var} step: {step}", heads, k=3)
    text += _ssd_tail(heads, 21, "nms_param { nms_threshold: 0.45 top_k: 400 } save_output_param { "
                      'label_map_file: "data/VOC0712/labelmap_voc.prototxt" } keep_top_k: 200 confidence_threshold: 0.01')
    return "".join(text)


def _deploy(name, make):
    real = SHARED_CAFFE_MODELS / name / "deploy.prototxt"
    return real.read_text() if real.exists() else make()


def _randomize_statistics(net, rng):
    """Trained-looking BatchNorm statistics and Scale factors (fresh ones are zeros and ones)."""
    for info in net.layer_infos:
        blobs = net.params.get(info.name)
        if info.type == "BatchNorm":
            blobs[0].data[...] = rng.normal(0, 0.1, blobs[0].data.shape)
            blobs[1].data[...] = rng.uniform(0.5, 1.5, blobs[1].data.shape)
            blobs[2].data[...] = 1
        elif info.type == "Scale":
            blobs[0].data[...] = rng.uniform(0.8, 1.2, blobs[0].data.shape)
            blobs[1].data[...] = rng.normal(0, 0.1, blobs[1].data.shape)


def _check_every_blob(net, data, skip=()):
    net.forward(**{net.inputs[0]: data})
    ref = torch_forward(net, data)
    for name, blob in net.blobs.items():
        if name in skip:
            continue
        got, want = blob.data, ref[name]
        assert got.shape == want.shape, name
        scale = max(float(np.abs(want).max()), 1e-6)
        assert float(np.abs(got - want).max()) <= 2e-4 * scale, name


@pytest.mark.parametrize("name", sorted(DENSENETS))
def test_densenet_deploy_forward_matches_torch(name):
    blocks, growth, features = DENSENETS[name]
    net = caffe.Net(_deploy(name, lambda: densenet(blocks, growth, features, 40)), caffe.TEST, seed=0)
    rng = np.random.default_rng(0)
    _randomize_statistics(net, rng)
    # floor rounding shows: pool1 on 20 -> 10 (ceil would give 11), pool3 on 5 -> 2 (ceil: 3)
    data = rng.normal(size=net.blobs["data"].data.shape).astype(np.float32)
    _check_every_blob(net, data)
    if net.blobs["data"].data.shape[2] == 40:
        assert net.blobs["pool1"].data.shape[2] == 10 and net.blobs["pool3"].data.shape[2] == 2
    assert net.blobs["fc6"].data.shape == (1, 1000, 1, 1)


@pytest.mark.parametrize("name,make", [("mobilenet_ssd", mobilenet_ssd), ("vgg_ssd", vgg_ssd)])
def test_ssd_deploy_forward_matches_reference(name, make):
    net = caffe.Net(_deploy(name, make), caffe.TEST, seed=0)
    rng = np.random.default_rng(1)
    _randomize_statistics(net, rng)
    for layer, blobs in net.params.items():   # confident class scores, so the detections are not empty
        if layer.endswith("mbox_conf"):
            blobs[0].data[...] *= 8
    data = rng.normal(size=net.blobs["data"].data.shape).astype(np.float32)
    _check_every_blob(net, data, skip=("detection_out",))
    priors = net.blobs["mbox_priorbox"].data.shape[2] // 4
    assert priors == {"mobilenet_ssd": 1917, "vgg_ssd": 8732}[name]
    param = next(i.param for i in net.layer_infos if i.type == "DetectionOutput").detection_output_param
    want = detection_output_loops(net.blobs["mbox_loc"].data, net.blobs["mbox_conf_flatten"].data,
                                  net.blobs["mbox_priorbox"].data, 21, param.nms_param.nms_threshold,
                                  param.nms_param.top_k, param.keep_top_k, param.confidence_threshold)
    got = net.blobs["detection_out"].data
    assert got.shape == want.shape and got.shape[2] > 1
    np.testing.assert_array_equal(got[..., :2], want[..., :2])
    np.testing.assert_allclose(got[..., 2:], want[..., 2:], rtol=1e-4, atol=1e-5)
