"""``cgvm data digits``: scikit-learn's handwritten digits as Caffe training data.

The 1797 8x8 images (values 0..16) are upscaled to 20x20 and centred in a 28x28 frame, the
way MNIST digits are framed, so the MNIST LeNet in ``models/lenet`` fits them unchanged.
A fixed permutation splits them into train and test sets, written as

    DIR/digits_train_lmdb, DIR/digits_test_lmdb     Datum records (1x28x28 uint8, label), as
                                                     Caffe's convert_imageset writes them
    DIR/digits_train.h5, DIR/digits_test.h5         datasets ``data`` (N x 1 x 28 x 28 float32
                                                     in [0, 1]) and ``label`` (N float32)
    DIR/digits_train_h5.txt, DIR/digits_test_h5.txt list files for HDF5Data layers
    DIR/samples/test_<i>_label_<y>.png               ten test images, to try `cgvm run` on
"""
from __future__ import annotations

import os
from typing import Dict, Tuple

import numpy as np

from cgvm.frontends.caffe.errors import CaffeError
from cgvm.frontends.caffe.io import array_to_datum, resize_image

IMAGE_SIZE = 28
DIGIT_SIZE = 20
TEST_COUNT = 450  # divisible by 50, 90 and 150: a test batch size covers the test set exactly


def load_digit_images(channels: int = 1) -> Tuple[np.ndarray, np.ndarray]:
    """All digits as (N x channels x 28 x 28 uint8, N int labels); channels 3 replicates the grey image."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise CaffeError("`cgvm data digits` needs scikit-learn for the digits: pip install scikit-learn") from None
    digits = load_digits()
    small = digits.images.astype(np.float32) * (255.0 / 16.0)
    images = np.zeros((len(small), IMAGE_SIZE, IMAGE_SIZE), np.float32)
    pad = (IMAGE_SIZE - DIGIT_SIZE) // 2
    for i, img in enumerate(small):
        images[i, pad:pad + DIGIT_SIZE, pad:pad + DIGIT_SIZE] = resize_image(img[:, :, None],
                                                                             (DIGIT_SIZE, DIGIT_SIZE))[:, :, 0]
    images = np.clip(np.rint(images), 0, 255).astype(np.uint8)[:, None]
    if channels == 3:
        images = np.repeat(images, 3, axis=1)
    elif channels != 1:
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    return images, digits.target.astype(np.int64)


def split(images: np.ndarray, labels: np.ndarray, seed: int = 0, test_count: int = TEST_COUNT):
    """(train_images, train_labels, test_images, test_labels) by a fixed permutation."""
    order = np.random.default_rng(seed).permutation(len(images))
    test, train = order[:test_count], order[test_count:]
    return images[train], labels[train], images[test], labels[test]


def write_lmdb(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Datum records keyed ``%08d`` in order, in a fresh LMDB database at ``path``."""
    try:
        import lmdb
    except ImportError:
        raise CaffeError("writing LMDB needs the lmdb package: pip install lmdb") from None
    from cgvm.frontends.caffe.data_lmdb import forget_lmdb

    forget_lmdb(path)
    if os.path.exists(path):
        import shutil

        shutil.rmtree(path)
    map_size = max(1 << 24, images.nbytes * 4)
    env = lmdb.open(path, map_size=map_size)
    with env.begin(write=True) as txn:
        for i, (img, label) in enumerate(zip(images, labels)):
            txn.put(f"{i:08d}".encode(), array_to_datum(img, int(label)).SerializeToString())
    env.close()


def write_hdf5(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    """Datasets ``data`` (float32 in [0, 1]) and ``label`` (float32) for an HDF5Data layer."""
    try:
        import h5py
    except ImportError:
        raise CaffeError("writing HDF5 needs h5py: pip install h5py") from None
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=images.astype(np.float32) / 255.0)
        f.create_dataset("label", data=labels.astype(np.float32))


def write_digits(out_dir: str, *, seed: int = 0, channels: int = 1, formats: Tuple[str, ...] = ("lmdb", "hdf5"),
                 limit: int = 0) -> Dict[str, int]:
    """Write the train/test split under ``out_dir``; returns the image count of each split.

    ``limit`` > 0 keeps only that many images per split (for quick tests).
    """
    os.makedirs(out_dir, exist_ok=True)
    images, labels = load_digit_images(channels)
    xtr, ytr, xte, yte = split(images, labels, seed)
    if limit:
        xtr, ytr, xte, yte = xtr[:limit], ytr[:limit], xte[:limit], yte[:limit]
    for name, x, y in (("train", xtr, ytr), ("test", xte, yte)):
        if "lmdb" in formats:
            write_lmdb(os.path.join(out_dir, f"digits_{name}_lmdb"), x, y)
        if "hdf5" in formats:
            h5 = os.path.join(out_dir, f"digits_{name}.h5")
            write_hdf5(h5, x, y)
            with open(os.path.join(out_dir, f"digits_{name}_h5.txt"), "w") as f:
                f.write(os.path.abspath(h5) + "\n")
    write_samples(os.path.join(out_dir, "samples"), xte[:10], yte[:10])
    return {"train": len(xtr), "test": len(xte)}


def write_samples(directory: str, images: np.ndarray, labels: np.ndarray) -> None:
    """A few test images as PNG files ``test_<i>_label_<y>.png`` to try ``cgvm run`` on (needs Pillow)."""
    try:
        from PIL import Image
    except ImportError:
        return
    os.makedirs(directory, exist_ok=True)
    for i, (img, label) in enumerate(zip(images, labels)):
        pixels = img[0] if img.shape[0] == 1 else img.transpose(1, 2, 0)
        Image.fromarray(pixels).save(os.path.join(directory, f"test_{i}_label_{int(label)}.png"))
