"""``caffe.Classifier``: a deploy net that takes H x W x K images and returns class scores.

As pycaffe's: the images are resized to ``image_dims``, cut into the net's input size (ten
crops averaged with ``oversample``, else the centre crop), preprocessed by a Transformer
(transpose to C x H x W, channel swap, raw scale, mean, input scale) and forwarded.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from cgvm.frontends.caffe import io as cio
from cgvm.frontends.caffe.pycaffe import TEST, Net

__all__ = ["Classifier"]


class Classifier(Net):
    """``Classifier(model_file, pretrained_file, image_dims=None, mean=None, input_scale=None,
    raw_scale=None, channel_swap=None)``."""

    def __init__(self, model_file: str, pretrained_file: Optional[str], image_dims: Optional[Sequence[int]] = None,
                 mean: Optional[np.ndarray] = None, input_scale: Optional[float] = None,
                 raw_scale: Optional[float] = None, channel_swap: Optional[Sequence[int]] = None, **kwargs: Any):
        super().__init__(model_file, TEST, weights=pretrained_file, **kwargs)
        in_ = self.inputs[0]
        self.transformer = cio.Transformer({in_: self.blobs[in_].data.shape})
        self.transformer.set_transpose(in_, (2, 0, 1))
        if mean is not None:
            self.transformer.set_mean(in_, mean)
        if input_scale is not None:
            self.transformer.set_input_scale(in_, input_scale)
        if raw_scale is not None:
            self.transformer.set_raw_scale(in_, raw_scale)
        if channel_swap is not None:
            self.transformer.set_channel_swap(in_, channel_swap)
        self.crop_dims = np.array(self.blobs[in_].data.shape[2:])
        self.image_dims = np.array(image_dims if image_dims is not None else self.crop_dims)

    def predict(self, inputs: Sequence[np.ndarray], oversample: bool = True) -> np.ndarray:
        """Class scores (N x classes) for N images (H x W x K float arrays)."""
        channels = inputs[0].shape[2]
        resized = np.zeros((len(inputs), self.image_dims[0], self.image_dims[1], channels), dtype=np.float32)
        for i, image in enumerate(inputs):
            resized[i] = cio.resize_image(image, self.image_dims)
        if oversample:
            crops = cio.oversample(resized, self.crop_dims)
        else:
            centre = np.array(self.image_dims) / 2.0
            box = np.tile(centre, (1, 2))[0] + np.concatenate([-self.crop_dims / 2.0, self.crop_dims / 2.0])
            box = box.astype(int)
            crops = resized[:, box[0]:box[2], box[1]:box[3], :]
        in_ = self.inputs[0]
        data = np.zeros(np.array(crops.shape)[[0, 3, 1, 2]], dtype=np.float32)
        for i, crop in enumerate(crops):
            data[i] = self.transformer.preprocess(in_, crop)
        out = self.forward_all(**{in_: data})
        predictions = np.asarray(out[self.outputs[0]])
        if oversample:
            predictions = predictions.reshape((len(predictions) // 10, 10, -1)).mean(1)
        return predictions
