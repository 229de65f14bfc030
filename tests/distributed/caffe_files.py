"""Small Caffe data sets (LMDB, HDF5, image list) and nets/solvers over them for the 2-rank tests."""
from __future__ import annotations

from pathlib import Path

import numpy as np

DATA_LAYERS = {
    "lmdb": '''layer {{ name: "data" type: "Data" top: "data" top: "label" include {{ phase: {phase} }}
  transform_param {{ scale: 0.00390625 mirror: {mirror} crop_size: 5 }}
  data_param {{ source: "{source}" batch_size: {batch} backend: LMDB }} }}''',
    "hdf5": '''layer {{ name: "data" type: "HDF5Data" top: "data" top: "label" include {{ phase: {phase} }}
  hdf5_data_param {{ source: "{source}" batch_size: {batch} shuffle: {shuffle} }} }}''',
    "images": '''layer {{ name: "data" type: "ImageData" top: "data" top: "label" include {{ phase: {phase} }}
  transform_param {{ scale: 0.00390625 mirror: {mirror} crop_size: 5 }}
  image_data_param {{ source: "{source}" batch_size: {batch} shuffle: {shuffle} is_color: false }} }}''',
}

BODY = '''layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  inner_product_param { num_output: 16 weight_filler { type: "xavier" } bias_filler { type: "constant" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 4 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip2" bottom: "label" top: "acc" include { phase: TEST } }
'''


def write_data(d: Path, n: int = 192) -> None:
    """Random 1x6x6 images whose label is their brightest quadrant, as LMDB, HDF5 and PNG files."""
    from PIL import Image

    from cgvm.frontends.caffe.digits import write_hdf5, write_lmdb

    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, (n, 1, 6, 6)).astype(np.uint8)
    quads = images.reshape(n, 2, 3, 2, 3).mean(axis=(2, 4)).reshape(n, 4)
    labels = quads.argmax(axis=1)
    write_lmdb(str(d / "train_lmdb"), images, labels)
    write_lmdb(str(d / "test_lmdb"), images[:64], labels[:64])
    for part in range(2):   # two files: a batch runs on into the next
        rows = slice(part * n // 2, (part + 1) * n // 2)
        write_hdf5(str(d / f"train{part}.h5"), images[rows], labels[rows])
    (d / "train_h5.txt").write_text("".join(f"{d / f'train{p}.h5'}\n" for p in range(2)))
    (d / "img").mkdir(exist_ok=True)
    lines = []
    for i, (im, label) in enumerate(zip(images, labels)):
        path = d / "img" / f"{i:04d}.png"
        Image.fromarray(im[0]).save(path)
        lines.append(f"{path} {label}\n")
    (d / "train_images.txt").write_text("".join(lines))


def write_solver(d: Path, name: str, kind: str, batch: int, *, max_iter: int = 100, snapshot: int = 50,
                 test: bool = True, lr_policy: str = "fixed") -> Path:
    """``d/name.prototxt`` (the solver) over ``d/name_net.prototxt``, snapshots to ``d/name_snap/``."""
    source = {"lmdb": "train_lmdb", "hdf5": "train_h5.txt", "images": "train_images.txt"}[kind]
    layers = [DATA_LAYERS[kind].format(phase="TRAIN", source=source, batch=batch, mirror="true", shuffle="true")]
    if test:
        layers.append(DATA_LAYERS["lmdb"].format(phase="TEST", source="test_lmdb", batch=32, mirror="false",
                                                 shuffle="false"))
    (d / f"{name}_net.prototxt").write_text('name: "mlp"\n' + "\n".join(layers) + "\n" + BODY)
    (d / f"{name}_snap").mkdir(exist_ok=True)
    tests = "test_iter: 2\ntest_interval: 50\n" if test else ""
    (d / f"{name}.prototxt").write_text(
        f'net: "{name}_net.prototxt"\n{tests}base_lr: 0.05\nmomentum: 0.9\nweight_decay: 0.0005\n'
        f'lr_policy: "{lr_policy}"\ngamma: 0.5\nstepsize: 30\ndisplay: 25\nmax_iter: {max_iter}\n'
        f'snapshot: {snapshot}\nsnapshot_prefix: "{name}_snap/mlp"\nrandom_seed: 3\nsolver_mode: CPU\n')
    return d / f"{name}.prototxt"


def read_weights(path: Path) -> dict:
    from cgvm.frontends.caffe import caffe_pb2
    from cgvm.frontends.caffe.io import blobproto_to_array

    net = caffe_pb2.NetParameter()
    net.ParseFromString(Path(path).read_bytes())
    return {f"{layer.name}/{i}": blobproto_to_array(b) for layer in net.layer for i, b in enumerate(layer.blobs)}
