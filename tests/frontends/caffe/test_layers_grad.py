"""Backward of every differentiable Caffe layer type against central differences (float64).

Caffe's GradientChecker approach (caffe_tests.md §E): one-layer nets over Input blobs, the
objective sum_t <R_t, top_t> with random R, every bottom element and every learnable blob element
perturbed by +-h.
"""
import numpy as np
import pytest

from caffe_helpers import check_gradients, fill_inputs, one_layer_net

GAUSS = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.5 }'


def labels(n, classes, seed=3):
    return np.random.default_rng(seed).integers(0, classes, size=n).astype(np.float64)


# (id, layer body, bottom shapes, bottoms to check, tops, bottom values {index: array}, phase)
CASES = [
    ("Convolution", f'type: "Convolution" convolution_param {{ num_output: 3 kernel_size: 2 stride: 1 pad: 1 {GAUSS} }}',
     [(2, 2, 3, 3)], [0], 1, {}, 1),
    ("ConvolutionGroupStrided", 'type: "Convolution" convolution_param { num_output: 4 kernel_h: 2 kernel_w: 3 '
     f'stride_h: 2 stride_w: 1 group: 2 dilation: 1 {GAUSS} }}', [(1, 4, 4, 5)], [0], 1, {}, 1),
    ("Deconvolution", f'type: "Deconvolution" convolution_param {{ num_output: 2 kernel_size: 3 stride: 2 pad: 1 {GAUSS} }}',
     [(1, 2, 2, 3)], [0], 1, {}, 1),
    ("Im2col", 'type: "Im2col" convolution_param { kernel_size: 2 stride: 1 }', [(1, 2, 3, 3)], [0], 1, {}, 1),
    ("PoolingMax", 'type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 }',
     [(1, 2, 5, 5)], [0], 1, {}, 1),
    ("PoolingAve", 'type: "Pooling" pooling_param { pool: AVE kernel_h: 3 kernel_w: 2 stride: 2 pad: 1 }',
     [(1, 2, 5, 4)], [0], 1, {}, 1),
    ("PoolingGlobal", 'type: "Pooling" pooling_param { pool: AVE global_pooling: true }', [(2, 2, 3, 3)], [0], 1, {}, 1),
    ("SPP", 'type: "SPP" spp_param { pyramid_height: 2 pool: MAX }', [(1, 2, 4, 5)], [0], 1, {}, 1),
    ("LRNAcross", 'type: "LRN" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 k: 1.5 }', [(1, 4, 2, 2)], [0], 1, {}, 1),
    ("LRNWithin", 'type: "LRN" lrn_param { local_size: 3 alpha: 0.5 norm_region: WITHIN_CHANNEL }',
     [(1, 2, 3, 3)], [0], 1, {}, 1),
    ("InnerProduct", f'type: "InnerProduct" inner_product_param {{ num_output: 3 {GAUSS} }}', [(2, 2, 2, 1)], [0], 1, {}, 1),
    ("InnerProductTransposeAxis", f'type: "InnerProduct" inner_product_param {{ num_output: 2 axis: 2 transpose: true {GAUSS} }}',
     [(2, 3, 4)], [0], 1, {}, 1),
    ("ReLU", 'type: "ReLU" relu_param { negative_slope: 0.1 }', [(2, 3, 4)], [0], 1, {}, 1),
    ("PReLU", 'type: "PReLU" prelu_param { filler { type: "gaussian" std: 0.5 } }', [(2, 3, 2)], [0], 1, {}, 1),
    ("PReLUShared", 'type: "PReLU" prelu_param { channel_shared: true }', [(2, 3, 2)], [0], 1, {}, 1),
    ("ELU", 'type: "ELU" elu_param { alpha: 0.5 }', [(2, 3, 4)], [0], 1, {}, 1),
    ("Sigmoid", 'type: "Sigmoid"', [(2, 3, 4)], [0], 1, {}, 1),
    ("TanH", 'type: "TanH"', [(2, 3, 4)], [0], 1, {}, 1),
    ("AbsVal", 'type: "AbsVal"', [(2, 3, 4)], [0], 1, {}, 1),
    ("BNLL", 'type: "BNLL"', [(2, 3, 4)], [0], 1, {}, 1),
    ("Swish", 'type: "Swish" swish_param { beta: 1.5 }', [(2, 3, 4)], [0], 1, {}, 1),
    ("Power", 'type: "Power" power_param { power: 2.5 scale: 0.5 shift: 3 }', [(2, 3, 4)], [0], 1, {}, 1),
    ("Exp", 'type: "Exp" exp_param { base: 2 scale: 0.5 shift: 1 }', [(2, 3, 4)], [0], 1, {}, 1),
    ("Log", 'type: "Log" log_param { base: 2 scale: 0.5 shift: 5 }', [(2, 3, 4)], [0], 1, {}, 1),
    ("Clip", 'type: "Clip" clip_param { min: -0.5 max: 0.7 }', [(2, 3, 4)], [0], 1, {}, 1),
    ("DropoutTest", 'type: "Dropout" dropout_param { dropout_ratio: 0.3 }', [(2, 3, 4)], [0], 1, {}, 1),
    ("BatchNormTrain", 'type: "BatchNorm"', [(3, 2, 2, 2)], [0], 1, {}, 0),
    ("BatchNormGlobal", 'type: "BatchNorm" batch_norm_param { use_global_stats: true }', [(3, 2, 2)], [0], 1, {}, 1),
    ("MVN", 'type: "MVN"', [(2, 3, 2, 2)], [0], 1, {}, 1),
    ("MVNAcross", 'type: "MVN" mvn_param { across_channels: true normalize_variance: true }', [(2, 2, 2, 2)], [0], 1, {}, 1),
    ("Scale", 'type: "Scale" scale_param { bias_term: true filler { type: "gaussian" } bias_filler { type: "gaussian" } }',
     [(2, 3, 2)], [0], 1, {}, 1),
    ("ScaleTwoBottoms", 'type: "Scale" scale_param { axis: 1 }', [(2, 3, 4), (3, 4)], [0, 1], 1, {}, 1),
    ("Bias", 'type: "Bias" bias_param { axis: 0 num_axes: 2 filler { type: "gaussian" } }', [(2, 3, 2)], [0], 1, {}, 1),
    ("EltwiseSum", 'type: "Eltwise" eltwise_param { operation: SUM coeff: 1 coeff: -0.5 coeff: 2 }',
     [(2, 3), (2, 3), (2, 3)], [0, 1, 2], 1, {}, 1),
    ("EltwiseProd", 'type: "Eltwise" eltwise_param { operation: PROD }', [(2, 3), (2, 3), (2, 3)], [0, 1, 2], 1, {}, 1),
    ("EltwiseMax", 'type: "Eltwise" eltwise_param { operation: MAX }', [(2, 3), (2, 3), (2, 3)], [0, 1, 2], 1, {}, 1),
    ("Concat", 'type: "Concat" concat_param { axis: 1 }', [(2, 2, 3), (2, 1, 3)], [0, 1], 1, {}, 1),
    ("Slice", 'type: "Slice" slice_param { axis: -1 slice_point: 1 slice_point: 3 }', [(2, 4)], [0], 3, {}, 1),
    ("Split", 'type: "Split"', [(2, 3)], [0], 2, {}, 1),
    ("Flatten", 'type: "Flatten" flatten_param { axis: 1 end_axis: -2 }', [(2, 3, 2, 2)], [0], 1, {}, 1),
    ("Reshape", 'type: "Reshape" reshape_param { shape { dim: 0 dim: -1 dim: 2 } }', [(2, 3, 2, 2)], [0], 1, {}, 1),
    ("Crop", 'type: "Crop" crop_param { axis: 2 offset: 1 offset: 0 }', [(1, 2, 4, 4), (1, 2, 2, 3)], [0], 1, {}, 1),
    ("Softmax", 'type: "Softmax" softmax_param { axis: 1 }', [(2, 4, 3)], [0], 1, {}, 1),
    ("Reduction", 'type: "Reduction" reduction_param { operation: SUMSQ axis: 1 coeff: 0.5 }', [(2, 3, 2)], [0], 1, {}, 1),
    ("ReductionMean", 'type: "Reduction" reduction_param { operation: MEAN axis: -1 }', [(2, 3)], [0], 1, {}, 1),
    ("ReductionAsum", 'type: "Reduction" reduction_param { operation: ASUM }', [(2, 3)], [0], 1, {}, 1),
    ("Tile", 'type: "Tile" tile_param { axis: 1 tiles: 3 }', [(2, 2, 2)], [0], 1, {}, 1),
    ("Embed", f'type: "Embed" embed_param {{ num_output: 3 input_dim: 5 {GAUSS} }}', [(4,)], [], 1,
     {0: np.array([0., 3., 4., 3.])}, 1),
    ("BatchReindex", 'type: "BatchReindex"', [(3, 2), (4,)], [0], 1, {1: np.array([2., 0., 2., 1.])}, 1),
    ("Parameter", 'type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } }', [], [], 1, {}, 1),
    ("LSTM", f'type: "LSTM" recurrent_param {{ num_output: 2 {GAUSS} }}', [(3, 2, 2), (3, 2)], [0], 1,
     {1: np.array([[0., 0.], [1., 1.], [0., 1.]])}, 1),
    ("LSTMStaticExposed", f'type: "LSTM" recurrent_param {{ num_output: 2 expose_hidden: true {GAUSS} }}',
     [(2, 2, 3), (2, 2), (2, 2), (1, 2, 2), (1, 2, 2)], [0, 2, 3, 4], 3, {1: np.array([[1., 0.], [1., 1.]])}, 1),
    ("RNN", f'type: "RNN" recurrent_param {{ num_output: 2 {GAUSS} }}', [(3, 2, 2), (3, 2)], [0], 1,
     {1: np.array([[0., 0.], [1., 0.], [1., 1.]])}, 1),
    ("RNNStaticExposed", f'type: "RNN" recurrent_param {{ num_output: 2 expose_hidden: true {GAUSS} }}',
     [(2, 2, 3), (2, 2), (2, 1, 2), (1, 2, 2)], [0, 2, 3], 2, {1: np.array([[1., 1.], [0., 1.]])}, 1),
    ("LSTMUnit", 'type: "LSTMUnit"', [(1, 2, 2), (1, 2, 8), (1, 2)], [0, 1], 2, {2: np.array([[1., 0.]])}, 1),
    ("Filter", 'type: "Filter"', [(4, 2, 2), (4,)], [0], 1, {1: np.array([1., 0., 0., 3.])}, 1),
    ("SoftmaxWithLoss", 'type: "SoftmaxWithLoss"', [(3, 4, 2), (3, 1, 2)], [0], 1, {1: labels(6, 4).reshape(3, 1, 2)}, 1),
    ("SoftmaxWithLossIgnore", 'type: "SoftmaxWithLoss" loss_param { ignore_label: 1 normalize: true }',
     [(4, 3), (4,)], [0], 1, {1: np.array([0., 1., 2., 1.])}, 1),
    ("SigmoidCrossEntropyLoss", 'type: "SigmoidCrossEntropyLoss"', [(3, 4), (3, 4)], [0], 1,
     {1: np.random.default_rng(0).random((3, 4)).round()}, 1),
    ("EuclideanLoss", 'type: "EuclideanLoss"', [(3, 4), (3, 4)], [0, 1], 1, {}, 1),
    ("HingeLossL2", 'type: "HingeLoss" hinge_loss_param { norm: L2 }', [(3, 4), (3,)], [0], 1, {1: labels(3, 4)}, 1),
    ("HingeLoss", 'type: "HingeLoss"', [(3, 4), (3,)], [0], 1, {1: labels(3, 4)}, 1),
    ("ContrastiveLoss", 'type: "ContrastiveLoss" contrastive_loss_param { margin: 3 }', [(4, 3, 1, 1), (4, 3, 1, 1), (4,)],
     [0, 1], 1, {2: np.array([1., 0., 0., 1.])}, 1),
    ("ContrastiveLossLegacy", 'type: "ContrastiveLoss" contrastive_loss_param { margin: 3 legacy_version: true }',
     [(4, 3), (4, 3), (4,)], [0, 1], 1, {2: np.array([1., 0., 0., 1.])}, 1),
    ("InfogainLoss", 'type: "InfogainLoss"', [(3, 4), (3,), (4, 4)], [0], 1,
     {1: labels(3, 4), 2: np.random.default_rng(1).random((4, 4))}, 1),
    ("MultinomialLogisticLoss", 'type: "MultinomialLogisticLoss"', [(3, 4), (3,)], [0], 1,
     {0: np.random.default_rng(2).random((3, 4)) + 0.1, 1: labels(3, 4)}, 1),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_layer_gradient(case):
    _, body, shapes, check, n_tops, values, phase = case
    net = one_layer_net(body, shapes, n_tops=n_tops, phase=phase)
    fill_inputs(net, values)
    check_gradients(net, check)


def test_dropout_train_gradient_uses_the_forward_mask():
    net = one_layer_net('type: "Dropout" dropout_param { dropout_ratio: 0.5 }', [(3, 4)], phase=0)
    fill_inputs(net)
    for info in net.layer_infos:   # hold the seed: each forward of the check draws the same mask
        info.seed_entry = None
    check_gradients(net, [0])
    net.forward()
    top, bottom = net.blobs["t0"].data, net.blobs["b0"].data
    kept = top != 0
    assert np.allclose(top[kept], bottom[kept] * 2.0)
    assert np.array_equal(net.blobs["b0"].diff != 0, kept)
