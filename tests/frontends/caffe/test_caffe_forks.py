"""The Caffe forks' fields and layers cgvm recognises (docs/caffe_forks.md): PoolingParameter
``ceil_mode`` and the SSD layer set, each checked against an independent reference (PyTorch
pooling; loops written from the SSD fork's formulas); other fork fields keep their clear error."""
from __future__ import annotations

import numpy as np
import pytest

import cgvm.caffe as caffe
from cgvm.frontends.caffe.errors import CaffeNetError, CaffeParseError
from tests.frontends.caffe.fork_reference import (detection_inputs, detection_output_loops, normalize_numpy,
                                                  prior_box_loops)

torch = pytest.importorskip("torch")


def _input(shape, name="data"):
    dims = " ".join(f"dim: {d}" for d in shape)
    return f'layer {{ name: "{name}" type: "Input" top: "{name}" input_param {{ shape {{ {dims} }} }} }}\n'


@pytest.mark.parametrize("ceil", [False, True])
@pytest.mark.parametrize("pool,k,s,pad,size", [("MAX", 3, 2, 1, 20), ("MAX", 3, 2, 0, 10), ("AVE", 2, 2, 0, 5),
                                               ("AVE", 3, 2, 1, 6), ("MAX", 2, 2, 1, 5)])
def test_ceil_mode_pooling_matches_torch(ceil, pool, k, s, pad, size):
    text = _input((2, 3, size, size + 1)) + (
        f'layer {{ name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param {{ pool: {pool} kernel_size: {k} '
        f'stride: {s} pad: {pad} ceil_mode: {str(ceil).lower()} }} }}')
    net = caffe.Net(text, caffe.TEST)
    x = np.random.default_rng(0).normal(size=(2, 3, size, size + 1)).astype(np.float32)
    got = net.forward(data=x)["p"]
    t = torch.from_numpy(x)
    ref = (torch.nn.functional.max_pool2d(t, k, s, pad, ceil_mode=ceil) if pool == "MAX" else
           torch.nn.functional.avg_pool2d(t, k, s, pad, ceil_mode=ceil, count_include_pad=True)).numpy()
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_ceil_mode_and_round_mode_agree_or_error():
    base = _input((1, 1, 6, 6))
    same = caffe.Net(base + 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { '
                     'pool: MAX kernel_size: 3 stride: 2 round_mode: FLOOR ceil_mode: false } }', caffe.TEST)
    assert same.blobs["p"].data.shape == (1, 1, 2, 2)
    with pytest.raises(CaffeNetError, match="round_mode: CEIL and ceil_mode: false, which disagree"):
        caffe.Net(base + 'layer { name: "p" type: "Pooling" bottom: "data" top: "p" pooling_param { '
                  'pool: MAX kernel_size: 3 stride: 2 round_mode: CEIL ceil_mode: false } }', caffe.TEST)


def test_other_fork_fields_still_give_the_clear_error():
    from cgvm.frontends.caffe.prototxt import parse_net_text

    with pytest.raises(CaffeParseError, match="not BVLC Caffe.*Fast/Faster R-CNN"):
        parse_net_text('layer { name: "d" dropout_param { scale_train: false } }')
    with pytest.raises(CaffeParseError, match='did you mean "ceil_mode"'):
        parse_net_text('layer { name: "p" pooling_param { ceil_mod: false } }')
    with pytest.raises(CaffeParseError, match="MultiBoxLoss|multibox_loss_param"):
        parse_net_text('layer { name: "l" multibox_loss_param { } }')
    with pytest.raises(CaffeParseError, match='unknown field "min_sizes"'):
        parse_net_text('layer { name: "p" prior_box_param { min_sizes: 3 } }')


def test_permute_matches_numpy_transpose():
    text = _input((2, 3, 4, 5)) + 'layer { name: "p" type: "Permute" bottom: "data" top: "p" permute_param { order: 0 order: 2 order: 3 order: 1 } }' \
        + 'layer { name: "q" type: "Permute" bottom: "data" top: "q" permute_param { order: 3 } }'
    net = caffe.Net(text, caffe.TEST)
    x = np.arange(120, dtype=np.float32).reshape(2, 3, 4, 5)
    out = net.forward(data=x)
    np.testing.assert_array_equal(out["p"], x.transpose(0, 2, 3, 1))
    np.testing.assert_array_equal(out["q"], x.transpose(3, 0, 1, 2))   # unnamed axes follow in order
    with pytest.raises(CaffeNetError, match="names axis 1 twice"):
        caffe.Net(_input((2, 3)) + 'layer { name: "p" type: "Permute" bottom: "data" top: "p" '
                  'permute_param { order: 1 order: 1 } }', caffe.TEST)


@pytest.mark.parametrize("across,shared", [(True, True), (False, False), (False, True), (True, False)])
def test_normalize_forward_and_gradient(across, shared):
    from tests.frontends.caffe.caffe_helpers import check_gradients, one_layer_net

    body = (f'type: "Normalize" norm_param {{ across_spatial: {str(across).lower()} channel_shared: '
            f'{str(shared).lower()} scale_filler {{ type: "gaussian" mean: 10 std: 3 }} eps: 1e-6 }}')
    net = one_layer_net(body, [(2, 3, 4, 5)])
    x = np.random.default_rng(1).normal(size=(2, 3, 4, 5))
    net.blobs["b0"].data[...] = x
    net.forward()
    scale = net.params["under_test"][0].data
    assert scale.shape == (() if shared else (3,))
    np.testing.assert_allclose(net.blobs["t0"].data, normalize_numpy(x, scale, across, 1e-6), rtol=1e-10)
    check_gradients(net, [0], tol=1e-4)


@pytest.mark.parametrize("spec,layer_hw,image_hw", [
    (dict(min_size=[30.0], max_size=[60.0], aspect_ratio=[2.0], flip=True, clip=False, variance=[0.1, 0.1, 0.2, 0.2],
          step=8.0), (38, 38), (300, 300)),
    (dict(min_size=[60.0], aspect_ratio=[2.0, 3.0], flip=True, clip=True, variance=[0.2]), (3, 5), (96, 160)),
    (dict(min_size=[12.5, 40.0], max_size=[31.7, 90.0], aspect_ratio=[2.0, 0.5], flip=True, clip=False), (4, 4), (64, 64)),
])
def test_prior_box_matches_the_forks_loops(spec, layer_hw, image_hw):
    fields = " ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in spec.items() if not isinstance(v, list))
    fields += " " + " ".join(f"{k}: {x}" for k, v in spec.items() if isinstance(v, list) for x in v)
    text = (_input((1, 4) + layer_hw, "feat") + _input((1, 3) + image_hw, "data") +
            f'layer {{ name: "pb" type: "PriorBox" bottom: "feat" bottom: "data" top: "pb" prior_box_param {{ {fields} }} }}')
    net = caffe.Net(text, caffe.TEST)
    got = net.forward()["pb"]
    ref = prior_box_loops(spec["min_size"], spec.get("max_size", []), spec["aspect_ratio"], spec["flip"], spec["clip"],
                          spec.get("variance", [0.1]), layer_hw, image_hw, step=spec.get("step"))
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threshold,top_k,keep,nms,code", [(0.01, 400, 200, 0.45, "CENTER_SIZE"),
                                                           (0.25, 100, 5, 0.45, "CENTER_SIZE"),
                                                           (0.3, -1, -1, 0.3, "CORNER"), (0.2, 20, 7, 0.6, "CORNER_SIZE")])
def test_detection_output_matches_the_forks_loops(threshold, top_k, keep, nms, code):
    loc, conf, prior = detection_inputs(7)
    n, p4 = loc.shape
    text = (_input(loc.shape, "loc") + _input(conf.shape, "conf") + _input(prior.shape, "prior") +
            'layer { name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "prior" top: "det" '
            f'detection_output_param {{ num_classes: 4 share_location: true background_label_id: 0 '
            f'nms_param {{ nms_threshold: {nms} {"top_k: %d" % top_k if top_k > -1 else ""} }} code_type: {code} '
            f'keep_top_k: {keep} confidence_threshold: {threshold} }} }}')
    net = caffe.Net(text, caffe.TEST)
    net.blobs["loc"].data[...] = loc
    net.blobs["conf"].data[...] = conf
    net.blobs["prior"].data[...] = prior
    got = net.forward()["det"]
    codes = {"CORNER": 1, "CENTER_SIZE": 2, "CORNER_SIZE": 3}
    ref = detection_output_loops(loc, conf, prior, 4, nms, top_k, keep, threshold, codes[code])
    assert got.shape == ref.shape and got.shape[2] > 1
    np.testing.assert_array_equal(got[..., :2], ref[..., :2])
    np.testing.assert_allclose(got[..., 2:], ref[..., 2:], rtol=1e-5, atol=1e-6)
    if keep > -1:
        assert (got[0, 0, :, 0] == 0).sum() <= keep


def test_detection_output_with_nothing_kept_gives_minus_one_rows():
    loc, conf, prior = detection_inputs(3, n=3, peaky=0.1)
    text = (_input(loc.shape, "loc") + _input(conf.shape, "conf") + _input(prior.shape, "prior") +
            'layer { name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "prior" top: "det" '
            'detection_output_param { num_classes: 4 nms_param { nms_threshold: 0.45 } confidence_threshold: 0.9 } }')
    net = caffe.Net(text, caffe.TEST)
    for name, value in (("loc", loc), ("conf", conf), ("prior", prior)):
        net.blobs[name].data[...] = value
    got = net.forward()["det"]
    expected = np.full((1, 1, 3, 7), -1.0)
    expected[0, 0, :, 0] = [0, 1, 2]
    np.testing.assert_array_equal(got, expected)


def test_detection_output_checks_its_bottoms_and_settings():
    loc, conf, prior = detection_inputs(1)
    good = _input(loc.shape, "loc") + _input(conf.shape, "conf") + _input(prior.shape, "prior")
    with pytest.raises(CaffeNetError, match="conf has .* values per image, expected 60 priors x 5"):
        caffe.Net(good + 'layer { name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "prior" '
                  'top: "det" detection_output_param { num_classes: 5 } }', caffe.TEST)
    with pytest.raises(CaffeNetError, match="needs num_classes"):
        caffe.Net(good + 'layer { name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "prior" '
                  'top: "det" detection_output_param { } }', caffe.TEST)
    with pytest.warns(UserWarning, match="does not write them"):
        caffe.Net(good + 'layer { name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "prior" '
                  'top: "det" detection_output_param { num_classes: 4 save_output_param { output_directory: "/x" '
                  'output_format: "VOC" resize_param { height: 300 width: 300 interp_mode: LINEAR } } } }', caffe.TEST)
