"""Data layers reading image files (with Pillow): ``type: "ImageData"`` (whole images named in a list
file) and ``type: "WindowData"`` (R-CNN's foreground/background windows cropped out of images).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Tuple

import numpy as np

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.data_common import (BatchShare, DataTransformer, layer_error, layer_rng, need_tops,
                                              read_list_file)
from cgvm.frontends.caffe.io import blobproto_to_array, resize_image


def _read_image(path: str, is_color: bool, height: int = 0, width: int = 0) -> np.ndarray:
    """An image file as C x H x W uint8, BGR channel order (as OpenCV gives Caffe)."""
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB" if is_color else "L")
        if height and width:
            img = img.resize((width, height), Image.BILINEAR)
        arr = np.asarray(img)
    return arr[:, :, ::-1].transpose(2, 0, 1).copy() if is_color else arr[None].copy()


class ImageDataLayer(BatchShare):
    """``type: "ImageData"``: images named in a list file ("path label" per line), through the transformer.

    With a share (``take_share``) the read position (and the reshuffle at each epoch's end)
    moves over the whole batch, but only the kept images are opened and decoded."""

    def __init__(self, layer: caffe_pb2.LayerParameter, phase: int, ctx: Any = None):
        need_tops(layer, (2,), ctx)
        try:
            import PIL  # noqa: F401
        except ImportError:
            raise layer_error(ctx, layer, "the ImageData layer needs Pillow: pip install Pillow") from None
        param = layer.image_data_param
        self.layer, self.tops = layer, list(layer.top)
        if bool(param.new_height) != bool(param.new_width):
            raise layer_error(ctx, layer, "image_data_param: give both new_height and new_width, or neither")
        self.batch_size = int(param.batch_size)
        self.new_hw = (int(param.new_height), int(param.new_width))
        self.is_color, self.root = bool(param.is_color), param.root_folder
        self.lines: List[Tuple[str, int]] = []
        for line in read_list_file(param.source, layer, ctx):
            path, _, label = line.rpartition(" ")
            if not path:
                raise layer_error(ctx, layer, f"list file line {line!r} needs 'path label'")
            self.lines.append((path, int(label)))
        if not self.lines:
            raise layer_error(ctx, layer, f"the list file {param.source!r} names no images")
        self.rng = layer_rng(ctx)
        self.shuffle = bool(param.shuffle)
        self.order = np.arange(len(self.lines))
        if self.shuffle:
            self.rng.shuffle(self.order)
        self.pos = int(self.rng.integers(0, param.rand_skip)) % len(self.lines) if param.rand_skip else 0
        first = self._image(self.lines[self.order[self.pos]][0], layer, ctx)
        self.image_shape = first.shape
        self.transform = DataTransformer(layer.transform_param, phase, self.rng, layer, ctx)

    def _image(self, path: str, layer: Any = None, ctx: Any = None) -> np.ndarray:
        full = os.path.join(self.root, path) if self.root else path
        if not os.path.isfile(full):
            raise layer_error(ctx, self.layer, f"image {full!r} not found")
        return _read_image(full, self.is_color, *self.new_hw)

    def top_shapes(self) -> List[Tuple[int, ...]]:
        n = self.share_size
        return [(n,) + self.transform.output_shape(*self.image_shape), (n,)]

    def next_batch(self) -> Dict[str, np.ndarray]:
        keep = self.kept()
        images, labels = [], np.empty(self.share_size, np.float32)
        for i in range(self.batch_size):
            if keep[i]:
                path, labels[len(images)] = self.lines[self.order[self.pos]]
                img = self._image(path)
                if img.shape != self.image_shape:
                    # Caffe reshapes per image; a batch needs one size, so later images are resized to the first
                    img = resize_image(img.transpose(1, 2, 0), self.image_shape[1:]).transpose(2, 0, 1)
                images.append(img)
            self.pos += 1
            if self.pos >= len(self.lines):
                self.pos = 0
                if self.shuffle:
                    self.rng.shuffle(self.order)
        self.records_decoded += len(images)
        return {self.tops[0]: self.transform(np.stack(images), self.positions, self.batch_size), self.tops[1]: labels}

    def get_state(self) -> Dict[str, Any]:
        return {"pos": self.pos, "order": self.order.tolist()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.pos, self.order = int(state["pos"]), np.asarray(state["order"], np.int64)


class WindowDataLayer(BatchShare):
    """``type: "WindowData"``: R-CNN's window sampler.

    The source file lists, per image, ``# index``, the path, channels, height, width, the
    window count, then ``class overlap x1 y1 x2 y2`` per window. Each batch holds
    ``fg_fraction`` foreground windows (overlap >= fg_threshold, labelled with their class) and
    background windows (overlap < bg_threshold, label 0), each cropped with ``context_pad``
    (``crop_mode`` warp: stretched to crop_size; square: the tightest square around it),
    mirrored at random, mean-subtracted and scaled.
    """

    def __init__(self, layer: caffe_pb2.LayerParameter, phase: int, ctx: Any = None):
        need_tops(layer, (2,), ctx)
        p = layer.window_data_param
        tp = layer.transform_param
        self.layer, self.tops = layer, list(layer.top)
        self.batch_size = int(p.batch_size)
        self.crop = int(tp.crop_size or p.crop_size)
        if self.crop <= 0:
            raise layer_error(ctx, layer, "WindowData needs crop_size > 0 (in transform_param)")
        self.scale = float(tp.scale if tp.HasField("scale") else p.scale)
        self.mirror = bool(tp.mirror or p.mirror)
        self.context_pad, self.square = int(p.context_pad), p.crop_mode == "square"
        self.fg_fraction, self.root = float(p.fg_fraction), p.root_folder
        self.rng = layer_rng(ctx)
        mean_file = tp.mean_file or p.mean_file
        self.mean_values = np.asarray(tp.mean_value, np.float32) if len(tp.mean_value) else None
        self.mean_image = None
        if mean_file:
            from cgvm.frontends.caffe.prototxt import read_blobproto

            m = blobproto_to_array(read_blobproto(mean_file)).astype(np.float32)
            self.mean_image = m.reshape(m.shape[-3:])
        self.images: List[Tuple[str, int]] = []
        self.fg: List[Tuple[int, int, float, Tuple[int, int, int, int]]] = []
        self.bg: List[Tuple[int, int, float, Tuple[int, int, int, int]]] = []
        lines = iter(read_list_file(p.source, layer, ctx))
        for head in lines:
            if not head.startswith("#"):
                raise layer_error(ctx, layer, f"window file: expected '# image_index', got {head!r}")
            path, channels = next(lines), int(next(lines))
            next(lines), next(lines)  # height, width: read from the image itself
            self.images.append((os.path.join(self.root, path) if self.root else path, channels))
            for _ in range(int(next(lines))):
                cls, overlap, x1, y1, x2, y2 = next(lines).split()
                box = (int(x1), int(y1), int(x2), int(y2))
                entry = (len(self.images) - 1, int(cls), float(overlap), box)
                if float(overlap) >= p.fg_threshold:
                    self.fg.append(entry)
                elif float(overlap) < p.bg_threshold:
                    self.bg.append((entry[0], 0, entry[2], box))
        if not self.fg and not self.bg:
            raise layer_error(ctx, layer, f"the window file {p.source!r} has no usable windows")
        self.channels = self.images[0][1]

    def top_shapes(self) -> List[Tuple[int, ...]]:
        return [(self.share_size, self.channels, self.crop, self.crop), (self.share_size,)]

    def _crop_window(self, image: np.ndarray, box: Tuple[int, int, int, int]) -> np.ndarray:
        """The window with context, warped to crop x crop; parts outside the image stay 0."""
        c, h, w = image.shape
        x1, y1, x2, y2 = (float(v) for v in box)
        size = self.crop
        if self.context_pad or self.square:
            cx, cy = (x1 + x2) / 2.0, (y1 + y2) / 2.0
            half_w, half_h = (x2 - x1 + 1) / 2.0, (y2 - y1 + 1) / 2.0
            if self.square:
                half_w = half_h = max(half_w, half_h)
            scale = size / max(size - 2.0 * self.context_pad, 1.0)
            x1, x2 = cx - half_w * scale, cx + half_w * scale - 1
            y1, y2 = cy - half_h * scale, cy + half_h * scale - 1
        bw, bh = x2 - x1 + 1, y2 - y1 + 1
        cx1, cy1, cx2, cy2 = max(0, int(round(x1))), max(0, int(round(y1))), \
            min(w - 1, int(round(x2))), min(h - 1, int(round(y2)))
        out = np.zeros((c, size, size), np.float32)
        if cx2 < cx1 or cy2 < cy1:
            return out
        sx, sy = size / bw, size / bh
        ox, oy = int(round((cx1 - x1) * sx)), int(round((cy1 - y1) * sy))
        tw = max(1, min(size - ox, int(round((cx2 - cx1 + 1) * sx))))
        th = max(1, min(size - oy, int(round((cy2 - cy1 + 1) * sy))))
        patch = image[:, cy1:cy2 + 1, cx1:cx2 + 1].transpose(1, 2, 0)
        out[:, oy:oy + th, ox:ox + tw] = resize_image(patch, (th, tw)).transpose(2, 0, 1)
        return out

    def next_batch(self) -> Dict[str, np.ndarray]:
        n_fg = int(self.batch_size * self.fg_fraction) if self.fg else 0
        if not self.bg:
            n_fg = self.batch_size
        picks = [self.fg[i] for i in self.rng.integers(0, len(self.fg), n_fg)] if n_fg else []
        picks += [self.bg[i] for i in self.rng.integers(0, len(self.bg), self.batch_size - n_fg)]
        keep = self.kept()
        data = np.empty((self.share_size, self.channels, self.crop, self.crop), np.float32)
        labels = np.empty(self.share_size, np.float32)
        cache: Dict[int, np.ndarray] = {}
        j = -1
        for i, (img_index, label, _, box) in enumerate(picks):
            if not keep[i]:   # another rank's window: draw its mirror coin as the whole batch would
                if self.mirror:
                    self.rng.random()
                continue
            j += 1
            if img_index not in cache:
                path, channels = self.images[img_index]
                cache[img_index] = _read_image(path, channels == 3).astype(np.float32)
            window = self._crop_window(cache[img_index], box)
            if self.mirror and self.rng.random() < 0.5:
                window = window[:, :, ::-1]
            if self.mean_image is not None:
                off_h = (self.mean_image.shape[1] - self.crop) // 2
                off_w = (self.mean_image.shape[2] - self.crop) // 2
                window = window - self.mean_image[:, off_h:off_h + self.crop, off_w:off_w + self.crop]
            elif self.mean_values is not None:
                window = window - (self.mean_values.reshape(-1, 1, 1) if self.mean_values.size > 1
                                   else self.mean_values[0])
            data[j] = window * np.float32(self.scale)
            labels[j] = label
        self.records_decoded += j + 1
        return {self.tops[0]: data, self.tops[1]: labels}
