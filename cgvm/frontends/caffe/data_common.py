"""What every host data layer shares: its random generator, errors that name the layer, list files
read from the working directory, and ``DataTransformer`` (Caffe's ``transform_param``).
"""
from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeNetError
from cgvm.frontends.caffe.io import blobproto_to_array

_seed: Optional[int] = None


def set_random_seed(seed: Optional[int]) -> None:
    """Seed every data layer created from now on (None: fresh entropy each time)."""
    global _seed
    _seed = seed


def layer_rng(ctx: Any) -> np.random.Generator:
    """The net's generator when it gives one (runs repeat under caffe.set_random_seed), else a fresh one."""
    rng = getattr(ctx, "rng", None)
    return rng if rng is not None else np.random.default_rng(_seed)


def layer_error(ctx: Any, layer: caffe_pb2.LayerParameter, message: str) -> CaffeNetError:
    """An error naming the layer: its file and line when the net gives a context, else its name and type."""
    if ctx is not None and hasattr(ctx, "error"):
        return ctx.error(message)
    return CaffeNetError(f"layer {layer.name!r} ({layer.type}): {message}")


def need_tops(layer: caffe_pb2.LayerParameter, counts: Sequence[int], ctx: Any) -> None:
    """Fail unless the layer has one of ``counts`` tops."""
    if len(layer.top) not in counts:
        raise layer_error(ctx, layer, f"takes {' or '.join(map(str, counts))} top blob(s), got {len(layer.top)}")


def read_list_file(path: str, layer: caffe_pb2.LayerParameter, ctx: Any) -> List[str]:
    """The non-blank lines of a source list file, stripped."""
    if not os.path.isfile(path):
        raise layer_error(ctx, layer, f"source list file {path!r} not found (paths are relative to the working "
                          f"directory {os.getcwd()!r})")
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


class DataTransformer:
    """Caffe's ``transform_param`` on a batch: crop, mirror, subtract mean, scale (in that order).

    TRAIN crops at a random offset, TEST at the centre; ``mirror`` flips with probability 1/2
    in both phases. ``mean_file`` is a full-size mean image read at the crop offset;
    ``mean_value`` is one value or one per channel.
    """

    def __init__(self, param: caffe_pb2.TransformationParameter, phase: int, rng: np.random.Generator,
                 layer: caffe_pb2.LayerParameter, ctx: Any = None):
        self.scale = float(param.scale)
        self.mirror = bool(param.mirror)
        self.crop = int(param.crop_size)
        self.phase = phase
        self.rng = rng
        self.mean_image: Optional[np.ndarray] = None
        self.mean_values: Optional[np.ndarray] = None
        if param.mean_file and len(param.mean_value):
            raise layer_error(ctx, layer, "transform_param: give mean_file or mean_value, not both")
        if param.mean_file:
            from cgvm.frontends.caffe.prototxt import read_blobproto

            mean = blobproto_to_array(read_blobproto(param.mean_file)).astype(np.float32)
            self.mean_image = mean.reshape(mean.shape[-3:]) if mean.ndim == 4 else mean
        elif len(param.mean_value):
            self.mean_values = np.asarray(param.mean_value, dtype=np.float32)

    def output_shape(self, channels: int, height: int, width: int) -> Tuple[int, int, int]:
        if self.crop:
            return channels, self.crop, self.crop
        return channels, height, width

    def __call__(self, batch: np.ndarray, positions: Optional[Sequence[int]] = None,
                 total: Optional[int] = None) -> np.ndarray:
        """N x C x H x W (any dtype) -> N x C x h x w float32.

        ``positions``/``total``: ``batch`` holds only the items at ``positions`` (increasing) of a
        batch of ``total`` (one rank's share, see data_shard.py). The random flips and crop offsets
        are drawn for all ``total`` items, in the order the whole batch draws them, and applied to
        the kept ones, so the shares of all ranks together are exactly the whole batch.
        """
        n, c, h, w = batch.shape
        if positions is None:
            positions, total = range(n), n
        elif len(positions) != n or total is None:
            raise ValueError(f"a share of {n} items needs {n} positions and the whole batch's size")
        if self.mean_values is not None and self.mean_values.size not in (1, c):
            raise CaffeNetError(f"transform_param has {self.mean_values.size} mean_value entries; give 1 or "
                                f"one per channel ({c})")
        if self.mean_image is not None and self.mean_image.shape != (c, h, w):
            raise CaffeNetError(f"the mean_file image has shape {self.mean_image.shape}, the data is {(c, h, w)}")
        size = self.crop
        if size and (size > h or size > w):
            raise CaffeNetError(f"crop_size {size} is larger than the data ({h} x {w})")
        if not size and not self.mirror:
            out = batch.astype(np.float32)  # nothing per item: one vectorized pass
            if self.mean_image is not None:
                out -= self.mean_image
            return self._mean_and_scale(out, c)
        out = np.empty((n, c, size or h, size or w), dtype=np.float32)
        flips = self.rng.random(total) < 0.5 if self.mirror else np.zeros(total, bool)
        offsets = [self._crop_offset(h, w) for _ in range(total)] if size else None
        for j, i in enumerate(positions):
            if size:
                top, left = offsets[i]
                rows, cols = slice(top, top + size), slice(left, left + size)
            else:
                rows, cols = slice(None), slice(None)
            item = batch[j, :, rows, cols].astype(np.float32)
            if self.mean_image is not None:
                item -= self.mean_image[:, rows, cols]
            if flips[i]:
                item = item[:, :, ::-1]
            out[j] = item
        return self._mean_and_scale(out, c)

    def _crop_offset(self, h: int, w: int) -> Tuple[int, int]:
        """(top, left) of one item's crop: random in TRAIN (row offset drawn first), centred in TEST."""
        size = self.crop
        if self.phase == caffe_pb2.TRAIN:
            return int(self.rng.integers(0, h - size + 1)), int(self.rng.integers(0, w - size + 1))
        return (h - size) // 2, (w - size) // 2

    def _mean_and_scale(self, out: np.ndarray, channels: int) -> np.ndarray:
        if self.mean_values is not None:
            out -= self.mean_values.reshape(-1, 1, 1) if self.mean_values.size == channels else self.mean_values[0]
        if self.scale != 1.0:
            out *= np.float32(self.scale)
        return out


class BatchShare:
    """Mixed into the data layers: which items of each batch of ``batch_size`` this process decodes.

    By default all of them. ``take_share(count, rank)`` (several solvers, data_shard.py) keeps
    items rank, rank+count, rank+2*count, ... of every batch (Caffe's interleaving): the layer
    still moves its read position, shuffles and random draws over the whole batch, exactly as
    one process of the whole batch does, but reads and decodes only the kept records.
    """

    batch_size: int
    positions: Optional[np.ndarray] = None   # None: the whole batch
    records_decoded = 0                       # records next_batch has decoded (read, parsed, copied)

    def take_share(self, count: int, rank: int) -> None:
        if count < 1 or not 0 <= rank < count or self.batch_size % count:
            raise ValueError(f"cannot split a batch of {self.batch_size} into {count} equal shares (rank {rank})")
        self.positions = np.arange(rank, self.batch_size, count)

    @property
    def share_size(self) -> int:
        """The number of items next_batch returns."""
        return self.batch_size if self.positions is None else len(self.positions)

    def kept(self) -> np.ndarray:
        """A bool per item of the whole batch: True for the items this process decodes."""
        if self.positions is None:
            return np.ones(self.batch_size, bool)
        mask = np.zeros(self.batch_size, bool)
        mask[self.positions] = True
        return mask
