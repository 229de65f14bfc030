"""``caffe.io``: conversions between arrays and Caffe's protobuf records, and image preprocessing.

Mirrors pycaffe's ``caffe.io`` so scripts run with only the import changed: ``Transformer``
(transpose, channel swap, raw scale, mean, input scale, in pycaffe's order), ``load_image``,
``resize_image``, ``oversample``, and the BlobProto / Datum / BlobProtoVector converters.
Images are read with Pillow (pycaffe uses scikit-image); resizing is done here in NumPy with
the pixel-centre alignment scikit-image uses, so no image library is needed to preprocess.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeError

__all__ = ["blobproto_to_array", "array_to_blobproto", "arraylist_to_blobprotovector_str",
           "blobprotovector_str_to_arraylist", "array_to_datum", "datum_to_array", "Transformer",
           "load_image", "resize_image", "oversample"]


# --------------------------------------------------------------------------- protobuf records

class BlobShapeError(CaffeError, ValueError):
    """A BlobProto whose values do not fit its shape (a ValueError, as pycaffe raises)."""


def blobproto_to_array(blob: caffe_pb2.BlobProto, return_diff: bool = False) -> np.ndarray:
    """The blob's data (or diff) as a float array of its shape.

    The legacy (num, channels, height, width) fields win when any is set, as in Caffe; a blob
    with no shape and one value is a 0-d array; no shape and several values is an error.
    """
    doubles, floats = (blob.double_diff, blob.diff) if return_diff else (blob.double_data, blob.data)
    arr = np.asarray(doubles, dtype=np.float64) if len(doubles) else np.asarray(floats, dtype=np.float32)
    if any(blob.HasField(f) for f in ("num", "channels", "height", "width")):
        shape: Tuple[int, ...] = (blob.num, blob.channels, blob.height, blob.width)
    elif blob.HasField("shape"):
        shape = tuple(blob.shape.dim)
    elif arr.size == 1:
        shape = ()
    else:
        raise BlobShapeError(f"the BlobProto has {arr.size} values but no shape (neither num/channels/height/width "
                         "nor shape.dim)")
    if arr.size != int(np.prod(shape, dtype=np.int64)):
        raise BlobShapeError(f"the BlobProto's shape {shape} needs {int(np.prod(shape))} values, it holds {arr.size}")
    return arr.reshape(shape)


def array_to_blobproto(arr: np.ndarray, diff: Optional[np.ndarray] = None) -> caffe_pb2.BlobProto:
    """A BlobProto with ``shape`` and float data (and diff) from ``arr`` (written as Caffe writes them)."""
    arr = np.asarray(arr)
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend(int(d) for d in arr.shape)
    set_packed_floats(blob, "data", arr)
    if diff is not None:
        diff = np.asarray(diff)
        if diff.shape != arr.shape:
            raise ValueError(f"diff has shape {diff.shape}, data has {arr.shape}")
        set_packed_floats(blob, "diff", diff)
    return blob


def set_packed_floats(blob: caffe_pb2.BlobProto, field: str, values: np.ndarray) -> None:
    """Append ``values`` (as float32) to the packed repeated float ``field`` of ``blob``.

    Built as the wire bytes of a packed field and merged in, so protobuf copies the floats in C;
    extending the field from a Python list costs about a microsecond per value (seconds per snapshot).
    """
    number = caffe_pb2.BlobProto.DESCRIPTOR.fields_by_name[field].number
    payload = np.ascontiguousarray(values, dtype="<f4").tobytes()
    blob.MergeFromString(_varint((number << 3) | 2) + _varint(len(payload)) + payload)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def arraylist_to_blobprotovector_str(arraylist: Iterable[np.ndarray]) -> bytes:
    """Serialized BlobProtoVector holding each array (``blobprotovector_str_to_arraylist`` reads it)."""
    vec = caffe_pb2.BlobProtoVector()
    vec.blobs.extend(array_to_blobproto(a) for a in arraylist)
    return vec.SerializeToString()


def blobprotovector_str_to_arraylist(data: bytes) -> List[np.ndarray]:
    """The arrays of a serialized BlobProtoVector."""
    vec = caffe_pb2.BlobProtoVector()
    vec.ParseFromString(data)
    return [blobproto_to_array(b) for b in vec.blobs]


def array_to_datum(arr: np.ndarray, label: Optional[int] = None) -> caffe_pb2.Datum:
    """A Datum from a C x H x W array: uint8 arrays go to ``data`` bytes, others to ``float_data``."""
    arr = np.asarray(arr)
    if arr.ndim != 3:
        raise ValueError(f"array_to_datum needs a 3-D array (channels, height, width), got shape {arr.shape}")
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = (int(d) for d in arr.shape)
    if arr.dtype == np.uint8:
        datum.data = np.ascontiguousarray(arr).tobytes()
    else:
        datum.float_data.extend(arr.astype(np.float32).ravel().tolist())
    if label is not None:
        datum.label = int(label)
    return datum


def datum_to_array(datum: caffe_pb2.Datum) -> np.ndarray:
    """C x H x W uint8 array from ``data`` bytes, else a float32 array from ``float_data``."""
    shape = (datum.channels, datum.height, datum.width)
    if datum.encoded:
        return _decode_image(datum.data, shape[0] if shape[0] else None)
    if len(datum.data):
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(shape).copy()
    return np.asarray(datum.float_data, dtype=np.float32).reshape(shape)


def _decode_image(data: bytes, channels: Optional[int]) -> np.ndarray:
    """An encoded (JPEG/PNG) Datum as C x H x W uint8, BGR as OpenCV (Caffe's decoder) gives it."""
    import io as _io

    from PIL import Image

    img = Image.open(_io.BytesIO(data))
    gray = channels == 1 or (channels is None and img.mode in ("L", "I", "F", "1"))
    arr = np.asarray(img.convert("L" if gray else "RGB"))
    if gray:
        return arr[None].copy()
    return arr[:, :, ::-1].transpose(2, 0, 1).copy()


# --------------------------------------------------------------------------- images

def load_image(filename: str, color: bool = True) -> np.ndarray:
    """An image as float32 H x W x 3 RGB in [0, 1] (``color``), or H x W x 1 grey.

    Grey files are tiled to three channels when ``color``; an alpha channel is dropped.
    """
    try:
        from PIL import Image
    except ImportError:
        raise CaffeError("caffe.io.load_image needs Pillow: pip install Pillow") from None
    try:
        with Image.open(filename) as img:
            if color:
                arr = np.asarray(img.convert("RGB"), dtype=np.float32)
            else:
                arr = np.asarray(img.convert("L"), dtype=np.float32)[:, :, None]
    except (FileNotFoundError, IsADirectoryError):
        raise
    except Exception as exc:   # PIL's UnidentifiedImageError, OSError (truncated), DecompressionBombError...
        raise CaffeError(f"{filename}: cannot read the image: {type(exc).__name__}: {exc}") from exc
    return arr / 255.0


def resize_image(im: np.ndarray, new_dims: Sequence[int], interp_order: int = 1) -> np.ndarray:
    """Resize an H x W x K image to ``new_dims`` (height, width).

    ``interp_order`` 0 is nearest neighbour, anything else bilinear; sample positions are pixel
    centres, edges clamp (scikit-image's ``resize`` geometry, which pycaffe uses).
    """
    im = np.asarray(im)
    if im.ndim == 2:
        im = im[:, :, None]
    h, w = int(new_dims[0]), int(new_dims[1])
    if im.shape[:2] == (h, w):
        return im.astype(np.float32)
    src = im.astype(np.float32)
    if interp_order == 0:
        rows = np.minimum((np.arange(h) + 0.5) * im.shape[0] / h, im.shape[0] - 1).astype(np.int64)
        cols = np.minimum((np.arange(w) + 0.5) * im.shape[1] / w, im.shape[1] - 1).astype(np.int64)
        return src[rows][:, cols]
    r0, r1, rf = _linear_taps(im.shape[0], h)
    c0, c1, cf = _linear_taps(im.shape[1], w)
    top = src[r0] * (1 - rf)[:, None, None] + src[r1] * rf[:, None, None]
    return (top[:, c0] * (1 - cf)[None, :, None] + top[:, c1] * cf[None, :, None]).astype(np.float32)


def _linear_taps(n_in: int, n_out: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Left/right source indices and the right weight for linear interpolation at pixel centres."""
    pos = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
    left = np.floor(pos).astype(np.int64)
    right = np.minimum(left + 1, n_in - 1)
    return left, right, (pos - left).astype(np.float32)


def oversample(images: Sequence[np.ndarray], crop_dims: Sequence[int]) -> np.ndarray:
    """Ten crops per H x W x K image: four corners and the centre, then their mirrors -> (10N, h, w, K)."""
    im_shape = np.array(images[0].shape[:2])
    crop = np.array(crop_dims)
    centre = (im_shape - crop) / 2.0
    starts = [(0, 0), (0, im_shape[1] - crop[1]), (im_shape[0] - crop[0], 0),
              (im_shape[0] - crop[0], im_shape[1] - crop[1]), (int(centre[0]), int(centre[1]))]
    crops = np.empty((10 * len(images), crop[0], crop[1], images[0].shape[-1]), dtype=np.float32)
    k = 0
    for im in images:
        five = [im[r:r + crop[0], c:c + crop[1], :] for r, c in ((int(a), int(b)) for a, b in starts)]
        for c in five:
            crops[k] = c
            k += 1
        for c in five:
            crops[k] = c[:, ::-1, :]
            k += 1
    return crops


# --------------------------------------------------------------------------- Transformer

class Transformer:
    """Preprocess images for a net's input blobs (pycaffe's ``caffe.io.Transformer``).

    ``inputs`` maps a blob name to its shape (N, C, H, W). ``preprocess`` runs, in order: cast to
    float32, resize to H x W, transpose, channel swap, x raw_scale, - mean, x input_scale;
    ``deprocess`` undoes them in reverse.
    """

    def __init__(self, inputs: Dict[str, Sequence[int]]):
        self.inputs = {k: tuple(int(d) for d in v) for k, v in inputs.items()}
        self.transpose: Dict[str, Tuple[int, ...]] = {}
        self.channel_swap: Dict[str, Tuple[int, ...]] = {}
        self.raw_scale: Dict[str, float] = {}
        self.mean: Dict[str, np.ndarray] = {}
        self.input_scale: Dict[str, float] = {}

    def __check_input(self, in_: str) -> None:
        if in_ not in self.inputs:
            raise Exception(f"{in_} is not one of the net inputs: {list(self.inputs)}")

    def set_transpose(self, in_: str, order: Sequence[int]) -> None:
        self.__check_input(in_)
        if len(order) != len(self.inputs[in_]) - 1:
            raise Exception("Transpose order needs to have the same number of dimensions as the input.")
        self.transpose[in_] = tuple(order)

    def set_channel_swap(self, in_: str, order: Sequence[int]) -> None:
        self.__check_input(in_)
        if len(order) != self.inputs[in_][1]:
            raise Exception("Channel swap needs to have the same number of dimensions as the input channels.")
        self.channel_swap[in_] = tuple(order)

    def set_raw_scale(self, in_: str, scale: float) -> None:
        self.__check_input(in_)
        self.raw_scale[in_] = scale

    def set_mean(self, in_: str, mean: np.ndarray) -> None:
        """A per-channel mean (1-D, C values) or a mean image (C x H x W, resized to the input if needed)."""
        self.__check_input(in_)
        mean = np.asarray(mean, dtype=np.float32)
        channels, size = self.inputs[in_][1], self.inputs[in_][2:]
        if mean.ndim == 1:
            if mean.shape[0] != channels:
                raise ValueError("Mean channels incompatible with input.")
            mean = mean[:, None, None]
        else:
            if mean.ndim == 2:
                mean = mean[None]
            if mean.shape[0] != channels:
                raise ValueError("Mean channels incompatible with input.")
            if tuple(mean.shape[1:]) != tuple(size):
                mean = resize_image(mean.transpose(1, 2, 0), size).transpose(2, 0, 1)
        self.mean[in_] = mean

    def set_input_scale(self, in_: str, scale: float) -> None:
        self.__check_input(in_)
        self.input_scale[in_] = scale

    def preprocess(self, in_: str, data: np.ndarray) -> np.ndarray:
        """One H x W x K image -> a C x H x W float32 array ready for the blob ``in_``."""
        self.__check_input(in_)
        caffe_in = np.asarray(data, dtype=np.float32)
        in_dims = self.inputs[in_][2:]
        if caffe_in.shape[:2] != tuple(in_dims):
            caffe_in = resize_image(caffe_in, in_dims)
        if in_ in self.transpose:
            caffe_in = caffe_in.transpose(self.transpose[in_])
        if in_ in self.channel_swap:
            caffe_in = caffe_in[list(self.channel_swap[in_]), :, :]
        if in_ in self.raw_scale:
            caffe_in = caffe_in * self.raw_scale[in_]
        if in_ in self.mean:
            caffe_in = caffe_in - self.mean[in_]
        if in_ in self.input_scale:
            caffe_in = caffe_in * self.input_scale[in_]
        return np.ascontiguousarray(caffe_in, dtype=np.float32)

    def deprocess(self, in_: str, data: np.ndarray) -> np.ndarray:
        """Invert ``preprocess`` (except the resize): a C x H x W blob slice -> an H x W x K image."""
        self.__check_input(in_)
        decaf_in = np.array(data, dtype=np.float32).squeeze() if np.ndim(data) == 4 else \
            np.array(data, dtype=np.float32)
        if in_ in self.input_scale:
            decaf_in = decaf_in / self.input_scale[in_]
        if in_ in self.mean:
            decaf_in = decaf_in + self.mean[in_]
        if in_ in self.raw_scale:
            decaf_in = decaf_in / self.raw_scale[in_]
        if in_ in self.channel_swap:
            decaf_in = decaf_in[np.argsort(self.channel_swap[in_]), :, :]
        if in_ in self.transpose:
            decaf_in = decaf_in.transpose(np.argsort(self.transpose[in_]))
        return decaf_in
