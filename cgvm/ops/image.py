"""Decoding an encoded image held in a uint8 tensor: decode_image (ONNX ImageDecoder).

    decode_image(data, pixel_format="RGB") -> (height, width, 3 | 1) uint8

``data`` is the file's bytes (JPEG, PNG, BMP, TIFF, WebP, JPEG 2000, PNM: whatever the installed
Pillow reads); the result is RGB, BGR or 8-bit grayscale (Pillow's "L" conversion). Its height and
width come from the file, so they are known only at run time; the kernel runs on the host and
hands back an array of the input's backend. Pillow's pixel limit guards against files that claim
huge sizes. Pillow (the ``data`` extra) is imported when the
kernel first runs, and a missing Pillow or an unreadable file is a clear error. Not differentiable.
"""
from __future__ import annotations

import io
import numpy as np

from ..errors import ExecutionError, ShapeError
from ..ir.attrs import Str
from ..ir.types import TensorType
from .registry import OPAQUE, defop

PIXEL_FORMATS = ("RGB", "BGR", "Grayscale")


def _decode_infer(types, pixel_format):
    data = types[0]
    if data.ndim != 1 or data.dtype.np != np.uint8:
        raise ShapeError(f"decode_image: the encoded image must be a 1-D uint8 tensor of its bytes, got {data!r}")
    return TensorType((None, None, 1 if pixel_format == "Grayscale" else 3), "uint8")


decode_image = defop("decode_image", num_inputs=1, pattern=OPAQUE, writes_out=False, differentiable=False,
                     attrs={"pixel_format": Str("RGB", choices=PIXEL_FORMATS)}, infer=_decode_infer,
                     doc="The image whose encoded bytes `data` holds, decoded with Pillow: (H, W, 3) RGB or BGR, "
                         "or (H, W, 1) grayscale, uint8.")


def decode_bytes(data: bytes, pixel_format: str) -> np.ndarray:
    """The decoded pixels of an encoded image, as decode_image returns them (host NumPy)."""
    try:
        import PIL.Image
    except ImportError:
        raise ExecutionError("decode_image needs Pillow (pip install 'cgvm[data]' or pip install pillow)") from None
    try:
        with PIL.Image.open(io.BytesIO(data)) as img:
            if pixel_format == "Grayscale":
                return np.asarray(img.convert("L"))[:, :, None].copy()
            rgb = np.asarray(img if img.mode == "RGB" else img.convert("RGB"))
    except (OSError, ValueError, SyntaxError, PIL.Image.DecompressionBombError) as exc:
        # Pillow's errors for files it cannot read, and for ones claiming more pixels than its limit
        raise ExecutionError(f"decode_image: the {len(data)} bytes are not an image Pillow can decode: {exc}") from None
    return np.ascontiguousarray(rgb[:, :, ::-1] if pixel_format == "BGR" else rgb)


@decode_image.kernel
def _(xp, data, *, pixel_format, out=None):
    host = data.get() if hasattr(data, "get") and not isinstance(data, np.ndarray) else np.asarray(data)
    return xp.asarray(decode_bytes(host.tobytes(), pixel_format))
