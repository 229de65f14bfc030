"""Host data layers: DataTransformer (Caffe's test_data_transformer cases), Data over LMDB, HDF5Data,
HDF5Output, ImageData, WindowData, and their registration in the net's DATA_LAYERS."""
from __future__ import annotations

import numpy as np
import pytest

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.data_common import DataTransformer
from cgvm.frontends.caffe.data_hdf5 import HDF5DataLayer, HDF5OutputLayer
from cgvm.frontends.caffe.data_images import ImageDataLayer, WindowDataLayer
from cgvm.frontends.caffe.data_lmdb import LMDBDataLayer
from cgvm.frontends.caffe.errors import CaffeNetError
from cgvm.frontends.caffe.io import array_to_blobproto
from cgvm.frontends.caffe.layers import DATA_LAYERS
from cgvm.frontends.caffe.prototxt import parse_net_text, write_blobproto


def layer_of(text: str) -> caffe_pb2.LayerParameter:
    return parse_net_text(text).layer[0]


def transformer(text: str, phase=caffe_pb2.TEST, seed=0):
    layer = layer_of(f'layer {{ name: "d" type: "Data" {text} }}')
    return DataTransformer(layer.transform_param, phase, np.random.default_rng(seed), layer)


def datum_batch(label: int = 3) -> np.ndarray:
    """Caffe's test datum: C=3, H=4, W=5, every pixel = label."""
    return np.full((1, 3, 4, 5), label, np.uint8)


def test_registered():
    for name in ("Data", "HDF5Data", "HDF5Output", "ImageData", "WindowData"):
        assert name in DATA_LAYERS


def test_transformer_identity_mean_values_and_scale():
    np.testing.assert_array_equal(transformer("")(datum_batch()), datum_batch().astype(np.float32))
    out = transformer("transform_param { mean_value: 0 mean_value: 1 mean_value: 2 }")(datum_batch(0))
    for c in range(3):
        assert np.all(out[0, c] == -c)
    out = transformer("transform_param { mean_value: 2 }")(datum_batch(3))
    assert np.all(out == 1)
    out = transformer("transform_param { mean_value: 1 scale: 0.5 }")(datum_batch(3))
    assert np.all(out == 1.0)   # (3 - 1) * 0.5: the scale comes after the mean


def test_transformer_mean_file(tmp_path):
    mean = np.arange(60, dtype=np.float32).reshape(1, 3, 4, 5)
    write_blobproto(array_to_blobproto(mean), tmp_path / "mean.binaryproto")
    t = transformer(f'transform_param {{ mean_file: "{tmp_path / "mean.binaryproto"}" }}')
    data = np.arange(60, dtype=np.uint8).reshape(1, 3, 4, 5) * 2
    np.testing.assert_array_equal(t(data), data.astype(np.float32) - mean)
    # with a crop, the mean image is read at the crop offset
    t = transformer(f'transform_param {{ mean_file: "{tmp_path / "mean.binaryproto"}" crop_size: 2 }}')
    np.testing.assert_array_equal(t(data), (data.astype(np.float32) - mean)[:, :, 1:3, 1:3])


def test_transformer_crop_test_is_centre_train_is_random():
    data = np.arange(60, dtype=np.uint8).reshape(1, 3, 4, 5)
    t = transformer("transform_param { crop_size: 2 }", caffe_pb2.TEST)
    first = t(data)
    np.testing.assert_array_equal(first, data[:, :, 1:3, 1:3])   # offsets (4-2)/2, (5-2)/2
    assert all(np.array_equal(t(data), first) for _ in range(10))
    t = transformer("transform_param { crop_size: 2 }", caffe_pb2.TRAIN)
    crops = [t(data) for _ in range(30)]
    assert any(not np.array_equal(c, crops[0]) for c in crops)


def test_transformer_mirror_in_both_phases():
    data = np.arange(60, dtype=np.uint8).reshape(1, 3, 4, 5)
    for phase in (caffe_pb2.TRAIN, caffe_pb2.TEST):
        t = transformer("transform_param { mirror: true }", phase)
        outs = [t(data) for _ in range(30)]
        flipped = [np.array_equal(o, data[:, :, :, ::-1]) for o in outs]
        same = [np.array_equal(o, data) for o in outs]
        assert all(f or s for f, s in zip(flipped, same)) and any(flipped) and any(same)


# --------------------------------------------------------------------------- LMDB

def write_db(path, n=7):
    from cgvm.frontends.caffe.digits import write_lmdb

    images = np.stack([np.full((1, 6, 6), i * 10, np.uint8) for i in range(n)])
    write_lmdb(str(path), images, np.arange(n))
    return images


def test_lmdb_data_layer_reads_in_order_and_wraps(tmp_path):
    pytest.importorskip("lmdb")
    write_db(tmp_path / "db")
    layer = layer_of(f'layer {{ name: "d" type: "Data" top: "data" top: "label" '
                     f'transform_param {{ scale: 0.1 crop_size: 4 }} '
                     f'data_param {{ source: "{tmp_path / "db"}" batch_size: 5 backend: LMDB }} }}')
    d = LMDBDataLayer(layer, caffe_pb2.TEST)
    assert d.top_shapes() == [(5, 1, 4, 4), (5,)]
    b1, b2 = d.next_batch(), d.next_batch()
    np.testing.assert_array_equal(b1["label"], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(b2["label"], [5, 6, 0, 1, 2])
    np.testing.assert_allclose(b2["data"][:, 0, 0, 0], [5.0, 6.0, 0.0, 1.0, 2.0])


def test_lmdb_missing_source_names_it(tmp_path):
    pytest.importorskip("lmdb")
    layer = layer_of(f'layer {{ name: "d" type: "Data" top: "data" '
                     f'data_param {{ source: "{tmp_path / "nope"}" batch_size: 5 backend: LMDB }} }}')
    with pytest.raises(CaffeNetError, match="nope.*not found"):
        LMDBDataLayer(layer, caffe_pb2.TRAIN)


def test_data_layer_in_a_net(tmp_path):
    pytest.importorskip("lmdb")
    from cgvm.frontends.caffe.pycaffe import Net

    write_db(tmp_path / "db")
    net = Net(f'layer {{ name: "d" type: "Data" top: "data" top: "label" '
              f'data_param {{ source: "{tmp_path / "db"}" batch_size: 3 backend: LMDB }} }}\n'
              'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" '
              'inner_product_param { num_output: 2 } }', caffe_pb2.TEST)
    out = net.forward(blobs=["label", "data"])
    assert out["data"].shape == (3, 1, 6, 6) and out["ip"].shape == (3, 2)
    np.testing.assert_array_equal(out["data"][:, 0, 0, 0], out["label"] * 10)


# --------------------------------------------------------------------------- HDF5

def test_hdf5_data_spans_files_and_wraps(tmp_path):
    h5py = pytest.importorskip("h5py")
    for k, rows in enumerate((3, 4)):
        with h5py.File(tmp_path / f"f{k}.h5", "w") as f:
            f["data"] = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2) + 100 * k
            f["label"] = np.arange(rows, dtype=np.float32) + 10 * k
    (tmp_path / "list.txt").write_text(f"{tmp_path / 'f0.h5'}\n{tmp_path / 'f1.h5'}\n")
    layer = layer_of(f'layer {{ name: "h" type: "HDF5Data" top: "data" top: "label" '
                     f'hdf5_data_param {{ source: "{tmp_path / "list.txt"}" batch_size: 5 }} }}')
    d = HDF5DataLayer(layer, caffe_pb2.TRAIN)
    assert d.top_shapes() == [(5, 2), (5,)]
    labels = np.concatenate([d.next_batch()["label"] for _ in range(3)])
    np.testing.assert_array_equal(labels, [0, 1, 2, 10, 11, 12, 13, 0, 1, 2, 10, 11, 12, 13, 0])
    layer.hdf5_data_param.shuffle = True
    d = HDF5DataLayer(layer, caffe_pb2.TRAIN, type("Ctx", (), {"rng": np.random.default_rng(1)})())
    seen = np.concatenate([d.next_batch()["label"] for _ in range(7)])
    assert sorted(seen[:7].tolist()) != seen[:7].tolist() or sorted(seen[7:14].tolist()) != seen[7:14].tolist()
    assert sorted(seen[:7].tolist()) == [0, 1, 2, 10, 11, 12, 13]


def test_hdf5_missing_dataset_is_named(tmp_path):
    h5py = pytest.importorskip("h5py")
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["data"] = np.zeros((2, 3), np.float32)
    (tmp_path / "list.txt").write_text(f"{tmp_path / 'f.h5'}\n")
    layer = layer_of(f'layer {{ name: "h" type: "HDF5Data" top: "data" top: "target" '
                     f'hdf5_data_param {{ source: "{tmp_path / "list.txt"}" batch_size: 2 }} }}')
    with pytest.raises(CaffeNetError, match="no dataset 'target'"):
        HDF5DataLayer(layer, caffe_pb2.TRAIN)


def test_hdf5_output_appends(tmp_path):
    h5py = pytest.importorskip("h5py")
    layer = layer_of(f'layer {{ name: "o" type: "HDF5Output" bottom: "x" bottom: "y" '
                     f'hdf5_output_param {{ file_name: "{tmp_path / "out.h5"}" }} }}')
    out = HDF5OutputLayer(layer, caffe_pb2.TEST)
    assert out.top_shapes() == [] and out.next_batch() == {}
    out.write({"x": np.ones((2, 3)), "y": np.zeros(2)})
    out.write({"x": np.full((1, 3), 2.0), "y": np.ones(1)})
    with h5py.File(tmp_path / "out.h5") as f:
        np.testing.assert_array_equal(f["data"][:], [[1, 1, 1], [1, 1, 1], [2, 2, 2]])
        np.testing.assert_array_equal(f["label"][:], [0, 0, 1])


# --------------------------------------------------------------------------- images

def write_images(tmp_path, n=4, size=(10, 8)):
    Image = pytest.importorskip("PIL.Image")
    (tmp_path / "img").mkdir()
    lines = []
    for i in range(n):
        arr = np.zeros((size[1], size[0], 3), np.uint8)
        arr[..., 0] = 50 * i     # red
        arr[..., 2] = 7          # blue
        Image.fromarray(arr).save(tmp_path / "img" / f"im{i}.png")
        lines.append(f"im{i}.png {i}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")


def test_image_data_layer(tmp_path):
    write_images(tmp_path)
    layer = layer_of(f'layer {{ name: "i" type: "ImageData" top: "data" top: "label" '
                     f'image_data_param {{ source: "{tmp_path / "list.txt"}" root_folder: "{tmp_path / "img"}/" '
                     f'batch_size: 3 new_height: 6 new_width: 5 }} }}')
    d = ImageDataLayer(layer, caffe_pb2.TEST)
    assert d.top_shapes() == [(3, 3, 6, 5), (3,)]
    b = d.next_batch()
    np.testing.assert_array_equal(b["label"], [0, 1, 2])
    # BGR order, as OpenCV gives Caffe: channel 2 is red, channel 0 blue
    np.testing.assert_allclose(b["data"][:, 2, 0, 0], [0, 50, 100])
    np.testing.assert_allclose(b["data"][:, 0, 0, 0], [7, 7, 7])
    np.testing.assert_array_equal(d.next_batch()["label"], [3, 0, 1])
    layer.image_data_param.is_color = False
    assert ImageDataLayer(layer, caffe_pb2.TEST).top_shapes()[0] == (3, 1, 6, 5)


def test_window_data_layer(tmp_path):
    write_images(tmp_path, n=1, size=(40, 30))
    image = tmp_path / "img" / "im0.png"
    (tmp_path / "windows.txt").write_text(
        f"# 0\n{image}\n3\n30\n40\n3\n1 0.9 2 2 20 20\n2 0.7 10 5 39 29\n0 0.1 0 0 5 5\n")
    layer = layer_of(f'layer {{ name: "w" type: "WindowData" top: "data" top: "label" '
                     f'transform_param {{ crop_size: 8 mirror: true mean_value: 1 }} '
                     f'window_data_param {{ source: "{tmp_path / "windows.txt"}" batch_size: 8 '
                     f'fg_threshold: 0.5 bg_threshold: 0.5 fg_fraction: 0.25 context_pad: 2 }} }}')
    d = WindowDataLayer(layer, caffe_pb2.TRAIN, type("Ctx", (), {"rng": np.random.default_rng(0)})())
    assert d.top_shapes() == [(8, 3, 8, 8), (8,)]
    b = d.next_batch()
    assert b["data"].shape == (8, 3, 8, 8)
    assert (b["label"][:2] > 0).all() and (b["label"][2:] == 0).all()   # 25% foreground first
    assert np.isfinite(b["data"]).all()


def test_hdf5_output_in_a_net(tmp_path):
    h5py = pytest.importorskip("h5py")
    from cgvm.frontends.caffe.pycaffe import Net

    out = tmp_path / "o.h5"
    net = Net(f'layer {{ name: "d" type: "DummyData" top: "x" top: "y" dummy_data_param {{ shape {{ dim: 2 dim: 3 }} '
              f'shape {{ dim: 2 }} data_filler {{ type: "constant" value: 2 }} }} }}\n'
              f'layer {{ name: "o" type: "HDF5Output" bottom: "x" bottom: "y" '
              f'hdf5_output_param {{ file_name: "{out}" }} }}', caffe_pb2.TEST)
    assert net.forward() == {}
    net.forward()
    with h5py.File(out) as f:
        assert f["data"].shape == (4, 3) and np.all(f["data"][:] == 2) and f["label"].shape == (4,)
