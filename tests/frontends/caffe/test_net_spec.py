"""NetSpec / caffe.layers / caffe.params, mirroring pycaffe's test_net_spec.py."""
from __future__ import annotations

import pytest

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe import net_spec
from cgvm.frontends.caffe.net_spec import NetSpec
from cgvm.frontends.caffe.net_spec import layers as L
from cgvm.frontends.caffe.net_spec import params as P
from cgvm.frontends.caffe.prototxt import parse_net_text


def lenet(batch_size):
    n = NetSpec()
    n.data, n.label = L.DummyData(shape=[dict(dim=[batch_size, 1, 28, 28]), dict(dim=[batch_size, 1, 1, 1])],
                                  transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50, weight_filler=dict(type="xavier"))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.ip1 = L.InnerProduct(n.pool2, num_output=500, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.ip2 = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.ip2, n.label)
    return n.to_proto()


def anon_lenet(batch_size):
    data, label = L.DummyData(shape=dict(dim=[batch_size, 1, 28, 28]), ntop=2)
    conv1 = L.Convolution(data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    pool1 = L.Pooling(conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    ip1 = L.InnerProduct(pool1, num_output=500, weight_filler=dict(type="xavier"))
    relu1 = L.ReLU(ip1, in_place=True)
    ip2 = L.InnerProduct(relu1, num_output=10, weight_filler=dict(type="xavier"))
    loss = L.SoftmaxWithLoss(ip2, label)
    return net_spec.to_proto(loss)


def test_lenet_proto():
    net = lenet(50)
    assert net.layer[6].bottom == net.layer[6].top == ["ip1"]
    assert [layer.name for layer in net.layer] == ["data", "conv1", "pool1", "conv2", "pool2", "ip1", "relu1",
                                                   "ip2", "loss"]
    assert net.layer[0].top == ["data", "label"]
    assert net.layer[1].convolution_param.kernel_size == [5]        # scalar into a repeated field
    assert net.layer[1].convolution_param.weight_filler.type == "xavier"
    assert net.layer[2].pooling_param.pool == caffe_pb2.PoolingParameter.MAX
    assert net.layer[0].transform_param.scale == pytest.approx(1 / 255)
    assert list(net.layer[0].dummy_data_param.shape[1].dim) == [50, 1, 1, 1]
    # the text round-trips through our prototxt reader
    again = parse_net_text(str(net))
    assert again == net


def test_lenet_builds_and_runs():
    from cgvm.frontends.caffe.pycaffe import Net

    net = Net(str(lenet(4)), caffe_pb2.TRAIN)
    assert len(net.layers) == 9
    assert net.forward()["loss"].shape == ()


def test_anonymous_names():
    net = anon_lenet(8)
    assert [layer.name for layer in net.layer] == ["DummyData1", "Convolution1", "Pooling1", "InnerProduct1",
                                                   "ReLU1", "InnerProduct2", "SoftmaxWithLoss1"]
    assert net.layer[0].top == ["DummyData1", "DummyData2"]
    assert net.layer[4].top == net.layer[4].bottom == ["InnerProduct1"]
    assert net.layer[6].bottom == ["InnerProduct2", "DummyData2"]


def test_silence_only_net_forwards_to_nothing():
    from cgvm.frontends.caffe.pycaffe import Net

    n = NetSpec()
    n.data, n.data2 = L.DummyData(shape=[dict(dim=[3]), dict(dim=[4, 2])], ntop=2)
    n.silence_data = L.Silence(n.data, ntop=0)
    n.silence_data2 = L.Silence(n.data2, ntop=0)
    proto = n.to_proto()
    assert [layer.name for layer in proto.layer] == ["data", "silence_data", "silence_data2"]
    assert Net(str(proto), caffe_pb2.TEST).forward() == {}


def test_type_error_for_non_top():
    n = NetSpec()
    n.data, n.label = L.DummyData(shape=dict(dim=[1]), ntop=2)
    with pytest.raises(TypeError, match=r"Silence input 0 is not a Top \(type is <class 'tuple'>\)"):
        L.Silence((n.data, n.label), ntop=0)


def test_keyword_routing():
    n = NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3]))
    n.acc = L.Accuracy(n.data, n.data, top_k=5)                        # accuracy_param
    n.loss = L.SoftmaxWithLoss(n.data, n.data, loss_param=dict(ignore_label=255), loss_weight=2,
                               include=dict(phase=caffe_pb2.TRAIN))  # LayerParameter fields
    n.deconv = L.Deconvolution(n.data, convolution_param=dict(num_output=3, kernel_size=2),
                               param=[dict(lr_mult=1), dict(lr_mult=2, decay_mult=0)], name="up")
    proto = n.to_proto()
    acc, loss, deconv = proto.layer[1], proto.layer[2], proto.layer[3]
    assert acc.accuracy_param.top_k == 5
    assert loss.loss_param.ignore_label == 255 and loss.loss_weight == [2] and loss.include[0].phase == 0
    assert deconv.name == "up" and deconv.convolution_param.num_output == 3
    assert [p.lr_mult for p in deconv.param] == [1, 2] and deconv.param[1].decay_mult == 0
    with pytest.raises(AttributeError):
        L.SoftmaxWithLoss(n.data, n.data, ignore_label=255).fn._to_proto({}, {}, __import__("collections").Counter())


def test_params_enums():
    assert P.Pooling.AVE == caffe_pb2.PoolingParameter.AVE
    assert P.Eltwise.SUM == caffe_pb2.EltwiseParameter.SUM
    assert P.Data.LMDB == caffe_pb2.DataParameter.LMDB
