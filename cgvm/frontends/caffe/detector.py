"""``caffe.Detector``: a deploy net run on windows cut from images (R-CNN style), as pycaffe's.

Each window (ymin, xmin, ymax, xmax) is cut from its image, optionally with a border of
context (``context_pad`` pixels of the net input are context: the window is grown by
``input_size / (input_size - 2 * context_pad)`` about its centre, clipped to the image, and the
part outside the image is filled with the mean in raw image space); the Transformer then warps
it to the net's input size and preprocesses it. ``detect_windows`` returns one dict per window:
``{'window', 'prediction', 'filename'}``.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from cgvm.frontends.caffe import io as cio
from cgvm.frontends.caffe.pycaffe import TEST, Net

__all__ = ["Detector"]


class Detector(Net):
    """``Detector(model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None,
    channel_swap=None, context_pad=None)``."""

    def __init__(self, model_file: str, pretrained_file: Optional[str], mean: Optional[np.ndarray] = None,
                 input_scale: Optional[float] = None, raw_scale: Optional[float] = None,
                 channel_swap: Optional[Sequence[int]] = None, context_pad: Optional[int] = None, **kwargs: Any):
        super().__init__(model_file, TEST, weights=pretrained_file, **kwargs)
        in_ = self.inputs[0]
        self.transformer = cio.Transformer({in_: self.blobs[in_].data.shape})
        self.transformer.set_transpose(in_, (2, 0, 1))
        for value, setter in ((mean, self.transformer.set_mean), (input_scale, self.transformer.set_input_scale),
                              (raw_scale, self.transformer.set_raw_scale),
                              (channel_swap, self.transformer.set_channel_swap)):
            if value is not None:
                setter(in_, value)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows: Iterable[Tuple[str, Sequence[Sequence[int]]]]) -> List[dict]:
        """Predictions for every window of every (image filename, windows) pair, in order."""
        images_windows = [(name, list(windows)) for name, windows in images_windows]
        cuts = [self.crop(cio.load_image(name).astype(np.float32), window)
                for name, windows in images_windows for window in windows]
        if not cuts:
            return []
        in_ = self.inputs[0]
        batch = np.zeros((len(cuts), cuts[0].shape[2]) + tuple(self.blobs[in_].data.shape[2:]), dtype=np.float32)
        for i, cut in enumerate(cuts):
            batch[i] = self.transformer.preprocess(in_, cut)
        predictions = self.forward_all(**{in_: batch})[self.outputs[0]]
        found, i = [], 0
        for name, windows in images_windows:
            for window in windows:
                found.append({"window": window, "prediction": predictions[i], "filename": name})
                i += 1
        return found

    def detect_selective_search(self, image_fnames: Sequence[str]) -> List[dict]:
        """Windows proposed by Selective Search (the external ``selective_search_ijcv_with_python``)."""
        try:
            import selective_search_ijcv_with_python as selective_search
        except ImportError as exc:
            raise ImportError("detect_selective_search needs the selective_search_ijcv_with_python package "
                              "(and MATLAB), as pycaffe's does; use detect_windows with your own windows") from exc
        names = [os.path.abspath(f) for f in image_fnames]
        return self.detect_windows(zip(names, selective_search.get_windows(names, cmd="selective_search_rcnn")))

    def crop(self, im: np.ndarray, window: Sequence[int]) -> np.ndarray:
        """The window (ymin, xmin, ymax, xmax) of an H x W x K image, with context when configured."""
        ymin, xmin, ymax, xmax = (int(v) for v in window)
        if not self.context_pad:
            return im[ymin:ymax, xmin:xmax]
        size = self.blobs[self.inputs[0]].width   # square net inputs, as pycaffe assumes
        grow = size / (1.0 * size - 2 * self.context_pad)
        half = np.array([(ymax - ymin + 1) / 2.0, (xmax - xmin + 1) / 2.0])
        centre = np.array([ymin, xmin]) + half
        box = np.round(np.concatenate([centre - grow * half, centre + grow * half]))
        full = box[2:] - box[:2] + 1
        scale = size / full
        pad_y, pad_x = (int(round(max(0.0, -box[k]) * scale[k])) for k in (0, 1))
        height, width = im.shape[:2]
        box = np.clip(box, 0.0, [height, width, height, width])
        clipped = box[2:] - box[:2] + 1
        if not (clipped > 0).all():
            raise ValueError(f"window {tuple(window)} lies outside the {height}x{width} image")
        crop_h = min(int(round(clipped[0] * scale[0])), size - pad_y)
        crop_w = min(int(round(clipped[1] * scale[1])), size - pad_x)
        b = box.astype(int)
        context = cio.resize_image(im[b[0]:b[2], b[1]:b[3]], (crop_h, crop_w))
        out = np.ones(self.crop_dims, dtype=np.float32) * self.crop_mean
        out[pad_y:pad_y + crop_h, pad_x:pad_x + crop_w] = context
        return out

    def configure_crop(self, context_pad: Optional[int]) -> None:
        """Set the crop size (the net input as H x W x K) and, with context, the mean to pad with."""
        in_ = self.inputs[0]
        order = self.transformer.transpose[in_]
        back = [order[t] for t in order]
        self.crop_dims = np.array(self.blobs[in_].data.shape[1:])[back]
        self.context_pad = context_pad
        if not context_pad:
            return
        mean = self.transformer.mean.get(in_)
        if mean is None:
            self.crop_mean = np.zeros(self.crop_dims, dtype=np.float32)
            return
        # the padding is added before preprocessing, so it is the mean in raw image space
        raw = np.array(mean, dtype=np.float32).transpose(back)
        swap = self.transformer.channel_swap.get(in_)
        if swap is not None:
            raw = raw[:, :, [list(swap).index(i) for i in range(raw.shape[2])]]
        raw_scale = self.transformer.raw_scale.get(in_)
        if raw_scale is not None:
            raw = raw / raw_scale
        self.crop_mean = raw
