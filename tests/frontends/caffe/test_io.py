"""caffe.io: BlobProto / Datum / BlobProtoVector conversions, images, oversample, Transformer."""
from __future__ import annotations

import numpy as np
import pytest

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe import io as cio


def test_blobproto_legacy_shape_dims_and_scalar():
    blob = caffe_pb2.BlobProto(num=1, channels=1, height=10, width=10)
    blob.data.extend([1.0] * 100)
    assert cio.blobproto_to_array(blob).shape == (1, 1, 10, 10)
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend([2, 3])
    blob.data.extend(range(6))
    np.testing.assert_array_equal(cio.blobproto_to_array(blob), np.arange(6).reshape(2, 3))
    single = caffe_pb2.BlobProto()
    single.data.append(5.0)
    assert cio.blobproto_to_array(single).shape == () and cio.blobproto_to_array(single) == 5
    many = caffe_pb2.BlobProto()
    many.data.extend([1.0, 2.0])
    with pytest.raises(ValueError, match="no shape"):
        cio.blobproto_to_array(many)


def test_array_blobproto_round_trip_with_diff_and_doubles():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    blob = cio.array_to_blobproto(a, diff=-a)
    assert list(blob.shape.dim) == [2, 3, 4] and not blob.HasField("num")
    np.testing.assert_array_equal(cio.blobproto_to_array(blob), a)
    np.testing.assert_array_equal(cio.blobproto_to_array(blob, return_diff=True), -a)
    doubles = caffe_pb2.BlobProto()
    doubles.shape.dim.append(2)
    doubles.double_data.extend([0.1, 0.2])
    assert cio.blobproto_to_array(doubles).dtype == np.float64


def test_blobprotovector_round_trip():
    arrays = [np.ones((2, 2), np.float32), np.arange(3, dtype=np.float32)]
    back = cio.blobprotovector_str_to_arraylist(cio.arraylist_to_blobprotovector_str(arrays))
    for a, b in zip(arrays, back):
        np.testing.assert_array_equal(a, b)


def test_datum_uint8_float_and_label():
    img = np.arange(60, dtype=np.uint8).reshape(3, 4, 5)
    d = cio.array_to_datum(img, 7)
    assert (d.channels, d.height, d.width, d.label) == (3, 4, 5, 7) and len(d.data) == 60
    np.testing.assert_array_equal(cio.datum_to_array(d), img)
    f = cio.array_to_datum(img.astype(np.float32) / 2)
    assert not f.data and len(f.float_data) == 60 and not f.HasField("label")
    assert f.ByteSize() < cio.array_to_datum(img.astype(np.float32) / 2, 1).ByteSize()
    np.testing.assert_array_equal(cio.datum_to_array(f), img / 2)
    with pytest.raises(ValueError, match="3-D"):
        cio.array_to_datum(np.zeros((4, 5)))


def test_encoded_datum_decodes_to_bgr(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    rgb = np.zeros((4, 5, 3), np.uint8)
    rgb[..., 0] = 200
    Image.fromarray(rgb).save(tmp_path / "x.png")
    d = caffe_pb2.Datum(encoded=True, data=(tmp_path / "x.png").read_bytes(), label=1)
    arr = cio.datum_to_array(d)
    assert arr.shape == (3, 4, 5) and arr[2].min() == 200 and arr[0].max() == 0


def test_load_image_color_grey_and_alpha(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    grey = np.full((6, 7), 255, np.uint8)
    Image.fromarray(grey).save(tmp_path / "g.png")
    rgba = np.zeros((6, 7, 4), np.uint8)
    rgba[..., 1] = 51
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    im = cio.load_image(str(tmp_path / "g.png"))
    assert im.shape == (6, 7, 3) and im.dtype == np.float32 and np.all(im == 1.0)
    assert cio.load_image(str(tmp_path / "g.png"), color=False).shape == (6, 7, 1)
    a = cio.load_image(str(tmp_path / "a.png"))
    assert a.shape == (6, 7, 3) and np.allclose(a[..., 1], 0.2)


def test_resize_image_bilinear_and_nearest():
    row = np.array([[0.0, 10.0]], np.float32)[:, :, None]
    # pixel centres of 4 outputs over 2 inputs: -0.25, 0.25, 0.75, 1.25 -> clamped, interpolated
    np.testing.assert_allclose(cio.resize_image(row, (1, 4))[0, :, 0], [0, 2.5, 7.5, 10])
    np.testing.assert_allclose(cio.resize_image(row, (1, 4), interp_order=0)[0, :, 0], [0, 0, 10, 10])
    im = np.random.default_rng(0).random((5, 6, 3)).astype(np.float32)
    np.testing.assert_array_equal(cio.resize_image(im, (5, 6)), im)
    assert cio.resize_image(im, (9, 2)).shape == (9, 2, 3)


def test_oversample_corners_centre_and_mirrors():
    im = np.arange(4 * 6, dtype=np.float32).reshape(4, 6, 1)
    crops = cio.oversample([im], (2, 2))
    assert crops.shape == (10, 2, 2, 1)
    np.testing.assert_array_equal(crops[0], im[0:2, 0:2])
    np.testing.assert_array_equal(crops[1], im[0:2, 4:6])
    np.testing.assert_array_equal(crops[2], im[2:4, 0:2])
    np.testing.assert_array_equal(crops[3], im[2:4, 4:6])
    np.testing.assert_array_equal(crops[4], im[1:3, 2:4])
    for k in range(5):
        np.testing.assert_array_equal(crops[5 + k], crops[k][:, ::-1])


def test_transformer_order_and_inverse():
    t = cio.Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255.0)
    t.set_mean("data", np.array([10.0, 20.0, 30.0]))
    t.set_input_scale("data", 0.5)
    im = np.random.default_rng(1).random((4, 5, 3)).astype(np.float32)
    out = t.preprocess("data", im)
    expected = (im.transpose(2, 0, 1)[[2, 1, 0]] * 255.0 - np.array([10, 20, 30])[:, None, None]) * 0.5
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    np.testing.assert_allclose(t.deprocess("data", out), im, rtol=1e-5, atol=1e-6)
    # an image of another size is resized to the input first
    assert t.preprocess("data", np.zeros((8, 10, 3), np.float32)).shape == (3, 4, 5)


def test_transformer_checks():
    t = cio.Transformer({"data": (1, 3, 4, 5)})
    with pytest.raises(Exception, match="not one of the net inputs"):
        t.set_raw_scale("image", 1.0)
    with pytest.raises(ValueError, match="Mean channels"):
        t.set_mean("data", np.zeros(4))
    t.set_mean("data", np.ones((3, 8, 10)))   # a mean image of another size is resized
    assert t.mean["data"].shape == (3, 4, 5)


def test_classifier_predicts_probabilities(tmp_path):
    from cgvm.frontends.caffe.classifier import Classifier

    model = tmp_path / "deploy.prototxt"
    model.write_text('layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 6 '
                     'dim: 6 } } }\nlayer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
                     'inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.1 } } }\n'
                     'layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }\n')
    clf = Classifier(str(model), None, image_dims=(8, 8), raw_scale=255.0, channel_swap=(2, 1, 0),
                     mean=np.array([100.0, 110.0, 120.0]))
    images = [np.random.default_rng(i).random((10, 12, 3)).astype(np.float32) for i in range(3)]
    for oversample in (True, False):
        probs = clf.predict(images, oversample=oversample)
        assert probs.shape == (3, 4)
        np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-5)
