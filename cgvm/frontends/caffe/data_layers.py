"""Host-side Caffe data layers: Data (LMDB), HDF5Data, HDF5Output, ImageData, WindowData.

A data layer makes no graph nodes: the net asks it for ``top_shapes()`` once and for
``next_batch()`` (a ``{top name: float32 array}`` dict) before every forward, and feeds those
arrays to the compiled program. Importing this module registers the factories
``factory(layer_param, phase, ctx) -> layer`` in ``layers.base.DATA_LAYERS``. HDF5Output is a sink: it has
no tops and ``write({bottom name: array})`` appends what it is given.

Paths are relative to the working directory, as in Caffe. Layers that read in sequence have
``get_state()``/``set_state()`` (a JSON-able read position) for solver snapshots. Random choices (crop offsets,
mirroring, shuffling, window sampling) come from the net's generator ``ctx.rng`` (else one
seeded by ``set_random_seed``), so seeded runs repeat.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeNetError
from cgvm.frontends.caffe.io import blobproto_to_array, datum_to_array, resize_image
from cgvm.frontends.caffe.layers.base import DATA_LAYERS, register_data_layer

DataLayerFactory = Callable[[caffe_pb2.LayerParameter, int, Any], Any]

_seed: Optional[int] = None


def set_random_seed(seed: Optional[int]) -> None:
    """Seed every data layer created from now on (None: fresh entropy each time)."""
    global _seed
    _seed = seed


def _rng(ctx: Any) -> np.random.Generator:
    """The net's generator when it gives one (runs repeat under caffe.set_random_seed), else a fresh one."""
    rng = getattr(ctx, "rng", None)
    return rng if rng is not None else np.random.default_rng(_seed)


def _error(ctx: Any, layer: caffe_pb2.LayerParameter, message: str) -> CaffeNetError:
    if ctx is not None and hasattr(ctx, "error"):
        return ctx.error(message)
    return CaffeNetError(f"layer {layer.name!r} ({layer.type}): {message}")


def _need_tops(layer: caffe_pb2.LayerParameter, counts: Sequence[int], ctx: Any) -> None:
    if len(layer.top) not in counts:
        raise _error(ctx, layer, f"takes {' or '.join(map(str, counts))} top blob(s), got {len(layer.top)}")


def _read_list_file(path: str, layer: caffe_pb2.LayerParameter, ctx: Any) -> List[str]:
    if not os.path.isfile(path):
        raise _error(ctx, layer, f"source list file {path!r} not found (paths are relative to the working "
                     f"directory {os.getcwd()!r})")
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


# --------------------------------------------------------------------------- DataTransformer

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
            raise _error(ctx, layer, "transform_param: give mean_file or mean_value, not both")
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

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        """N x C x H x W (any dtype) -> N x C x h x w float32."""
        n, c, h, w = batch.shape
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
        flips = self.rng.random(n) < 0.5 if self.mirror else np.zeros(n, bool)
        for i in range(n):
            if size:
                if self.phase == caffe_pb2.TRAIN:
                    top, left = int(self.rng.integers(0, h - size + 1)), int(self.rng.integers(0, w - size + 1))
                else:
                    top, left = (h - size) // 2, (w - size) // 2
                rows, cols = slice(top, top + size), slice(left, left + size)
            else:
                rows, cols = slice(None), slice(None)
            item = batch[i, :, rows, cols].astype(np.float32)
            if self.mean_image is not None:
                item -= self.mean_image[:, rows, cols]
            if flips[i]:
                item = item[:, :, ::-1]
            out[i] = item
        return self._mean_and_scale(out, c)

    def _mean_and_scale(self, out: np.ndarray, channels: int) -> np.ndarray:
        if self.mean_values is not None:
            out -= self.mean_values.reshape(-1, 1, 1) if self.mean_values.size == channels else self.mean_values[0]
        if self.scale != 1.0:
            out *= np.float32(self.scale)
        return out


# --------------------------------------------------------------------------- Data (LMDB)

_lmdb_envs: Dict[str, Any] = {}


def _open_lmdb(lmdb: Any, source: str) -> Any:
    """One read-only environment per database and process (lmdb refuses a second open); every
    layer reading it has its own transaction and cursor."""
    key = os.path.realpath(source)
    env = _lmdb_envs.get(key)
    if env is None:
        env = _lmdb_envs[key] = lmdb.open(source, readonly=True, lock=False, readahead=False,
                                          subdir=os.path.isdir(source), max_readers=126)
    return env


def forget_lmdb(source: str) -> None:
    """Close the shared environment of ``source`` (before the database is rewritten)."""
    env = _lmdb_envs.pop(os.path.realpath(source), None)
    if env is not None:
        env.close()


class LMDBDataLayer:
    """``type: "Data"``: Datum records from an LMDB database, in key order, wrapping at the end."""

    def __init__(self, layer: caffe_pb2.LayerParameter, phase: int, ctx: Any = None):
        _need_tops(layer, (1, 2), ctx)
        param = layer.data_param
        self.layer, self.tops = layer, list(layer.top)
        self.batch_size = int(param.batch_size)
        if self.batch_size <= 0:
            raise _error(ctx, layer, "data_param.batch_size must be positive")
        source = param.source
        if not os.path.exists(source):
            raise _error(ctx, layer, f"data_param.source {source!r} not found (paths are relative to the "
                         f"working directory {os.getcwd()!r}; `cgvm data digits --out DIR` writes an example)")
        is_lmdb = os.path.isfile(os.path.join(source, "data.mdb")) or source.endswith(".mdb")
        if param.backend != caffe_pb2.DataParameter.LMDB and not is_lmdb:
            raise _error(ctx, layer, f"{source!r} is not an LMDB database and LevelDB is not supported; "
                         "convert it to LMDB and set `backend: LMDB`")
        try:
            import lmdb
        except ImportError:
            raise _error(ctx, layer, "the Data layer needs the lmdb package: pip install lmdb") from None
        self.rng = _rng(ctx)
        self._env = _open_lmdb(lmdb, source)
        self._txn = self._env.begin(buffers=False)
        self._cursor = self._txn.cursor()
        if not self._cursor.first():
            raise _error(ctx, layer, f"the LMDB database {source!r} is empty")
        if param.rand_skip:
            for _ in range(int(self.rng.integers(0, param.rand_skip))):
                self._advance()
        first = self._datum()
        self.datum_shape = first.shape
        self.transform = DataTransformer(layer.transform_param, phase, self.rng, layer, ctx)

    def _advance(self) -> None:
        if not self._cursor.next():
            self._cursor.first()

    def get_state(self) -> Dict[str, Any]:
        """The read position (a solver snapshot keeps it, so a restored run reads on from there)."""
        return {"key": self._cursor.key().hex()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        if not self._cursor.set_key(bytes.fromhex(state["key"])):
            self._cursor.first()

    def _datum(self) -> np.ndarray:
        datum = caffe_pb2.Datum()
        datum.ParseFromString(self._cursor.value())
        self._label = datum.label
        return datum_to_array(datum)

    def top_shapes(self) -> List[Tuple[int, ...]]:
        shapes = [(self.batch_size,) + self.transform.output_shape(*self.datum_shape)]
        return shapes + [(self.batch_size,)] if len(self.tops) > 1 else shapes

    def next_batch(self) -> Dict[str, np.ndarray]:
        raw = np.empty((self.batch_size,) + tuple(self.datum_shape), dtype=np.float32)
        labels = np.empty(self.batch_size, dtype=np.float32)
        for i in range(self.batch_size):
            item = self._datum()
            if item.shape != self.datum_shape:
                raise CaffeNetError(f"layer {self.layer.name!r}: record {self._cursor.key()!r} has shape "
                                    f"{item.shape}, the first had {self.datum_shape}")
            raw[i], labels[i] = item, self._label
            self._advance()
        out = {self.tops[0]: self.transform(raw)}
        if len(self.tops) > 1:
            out[self.tops[1]] = labels
        return out


# --------------------------------------------------------------------------- HDF5

class HDF5DataLayer:
    """``type: "HDF5Data"``: each top reads the dataset named like it from the files of a list file.

    Rows are read in order (or shuffled, with the file order, when ``shuffle``); a batch runs
    on into the next file, and the last file wraps to the first.
    """

    def __init__(self, layer: caffe_pb2.LayerParameter, phase: int, ctx: Any = None):
        if not layer.top:
            raise _error(ctx, layer, "HDF5Data needs at least one top")
        try:
            import h5py  # noqa: F401
        except ImportError:
            raise _error(ctx, layer, "the HDF5Data layer needs h5py: pip install h5py") from None
        param = layer.hdf5_data_param
        self.layer, self.tops = layer, list(layer.top)
        self.batch_size = int(param.batch_size)
        if self.batch_size <= 0:
            raise _error(ctx, layer, "hdf5_data_param.batch_size must be positive")
        self.files = _read_list_file(param.source, layer, ctx)
        if not self.files:
            raise _error(ctx, layer, f"the list file {param.source!r} names no HDF5 files")
        self.shuffle = bool(param.shuffle)
        self.rng = _rng(ctx)
        self.ctx = ctx
        self.file_order = np.arange(len(self.files))
        if self.shuffle:
            self.rng.shuffle(self.file_order)
        self.file_pos = 0
        self._load(self.file_order[0])

    def _load(self, index: int) -> None:
        import h5py

        path = self.files[index]
        if not os.path.isfile(path):
            raise _error(self.ctx, self.layer, f"HDF5 file {path!r} (listed in {self.layer.hdf5_data_param.source!r}) "
                         "not found")
        with h5py.File(path, "r") as f:
            missing = [t for t in self.tops if t not in f]
            if missing:
                raise _error(self.ctx, self.layer, f"{path!r} has no dataset {missing[0]!r} (each top reads the "
                             f"dataset of its name; the file has {sorted(f.keys())})")
            self.current = {t: np.asarray(f[t], dtype=np.float32) for t in self.tops}
        rows = {len(a) for a in self.current.values()}
        if len(rows) != 1:
            raise _error(self.ctx, self.layer, f"the datasets of {path!r} have different numbers of rows {rows}")
        self.rows = rows.pop()
        self.row_order = np.arange(self.rows)
        if self.shuffle:
            self.rng.shuffle(self.row_order)
        self.row = 0

    def top_shapes(self) -> List[Tuple[int, ...]]:
        return [(self.batch_size,) + self.current[t].shape[1:] for t in self.tops]

    def get_state(self) -> Dict[str, Any]:
        return {"file_order": self.file_order.tolist(), "file_pos": self.file_pos, "row": self.row,
                "row_order": self.row_order.tolist()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.file_order = np.asarray(state["file_order"], np.int64)
        self.file_pos = int(state["file_pos"])
        self._load(self.file_order[self.file_pos])
        self.row, self.row_order = int(state["row"]), np.asarray(state["row_order"], np.int64)

    def next_batch(self) -> Dict[str, np.ndarray]:
        out = {t: np.empty((self.batch_size,) + a.shape[1:], np.float32) for t, a in self.current.items()}
        for i in range(self.batch_size):
            if self.row >= self.rows:
                self.file_pos += 1
                if self.file_pos >= len(self.files):
                    self.file_pos = 0
                    if self.shuffle:
                        self.rng.shuffle(self.file_order)
                if len(self.files) > 1:
                    self._load(self.file_order[self.file_pos])
                else:
                    self.row = 0
                    if self.shuffle:
                        self.rng.shuffle(self.row_order)
            r = self.row_order[self.row]
            for t in self.tops:
                out[t][i] = self.current[t][r]
            self.row += 1
        return out


class HDF5OutputLayer:
    """``type: "HDF5Output"``: writes its bottoms (data, label) to ``hdf5_output_param.file_name``.

    Each ``write`` appends the batch to datasets named ``data`` and ``label`` (Caffe's names),
    growing them along the first axis.
    """

    dataset_names = ("data", "label")

    def __init__(self, layer: caffe_pb2.LayerParameter, phase: int, ctx: Any = None):
        try:
            import h5py  # noqa: F401
        except ImportError:
            raise _error(ctx, layer, "the HDF5Output layer needs h5py: pip install h5py") from None
        if len(layer.bottom) != 2:
            raise _error(ctx, layer, f"HDF5Output takes 2 bottoms (data, label), got {len(layer.bottom)}")
        self.layer, self.bottoms = layer, list(layer.bottom)
        self.file_name = layer.hdf5_output_param.file_name
        if not self.file_name:
            raise _error(ctx, layer, "hdf5_output_param.file_name is required")
        import h5py

        with h5py.File(self.file_name, "w"):
            pass  # Caffe truncates the file when the layer is set up

    def top_shapes(self) -> List[Tuple[int, ...]]:
        return []

    def next_batch(self) -> Dict[str, np.ndarray]:
        return {}

    def write(self, bottoms: Mapping[str, np.ndarray]) -> None:
        import h5py

        with h5py.File(self.file_name, "a") as f:
            for bottom, name in zip(self.bottoms, self.dataset_names):
                arr = np.asarray(bottoms[bottom], dtype=np.float32)
                if name not in f:
                    f.create_dataset(name, data=arr, maxshape=(None,) + arr.shape[1:])
                else:
                    ds = f[name]
                    ds.resize(ds.shape[0] + arr.shape[0], axis=0)
                    ds[-arr.shape[0]:] = arr


# --------------------------------------------------------------------------- images

def _read_image(path: str, is_color: bool, height: int = 0, width: int = 0) -> np.ndarray:
    """An image file as C x H x W uint8, BGR channel order (as OpenCV gives Caffe)."""
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB" if is_color else "L")
        if height and width:
            img = img.resize((width, height), Image.BILINEAR)
        arr = np.asarray(img)
    return arr[:, :, ::-1].transpose(2, 0, 1).copy() if is_color else arr[None].copy()


class ImageDataLayer:
    """``type: "ImageData"``: images named in a list file ("path label" per line), through the transformer."""

    def __init__(self, layer: caffe_pb2.LayerParameter, phase: int, ctx: Any = None):
        _need_tops(layer, (2,), ctx)
        try:
            import PIL  # noqa: F401
        except ImportError:
            raise _error(ctx, layer, "the ImageData layer needs Pillow: pip install Pillow") from None
        param = layer.image_data_param
        self.layer, self.tops = layer, list(layer.top)
        if bool(param.new_height) != bool(param.new_width):
            raise _error(ctx, layer, "image_data_param: give both new_height and new_width, or neither")
        self.batch_size = int(param.batch_size)
        self.new_hw = (int(param.new_height), int(param.new_width))
        self.is_color, self.root = bool(param.is_color), param.root_folder
        self.lines: List[Tuple[str, int]] = []
        for line in _read_list_file(param.source, layer, ctx):
            path, _, label = line.rpartition(" ")
            if not path:
                raise _error(ctx, layer, f"list file line {line!r} needs 'path label'")
            self.lines.append((path, int(label)))
        if not self.lines:
            raise _error(ctx, layer, f"the list file {param.source!r} names no images")
        self.rng = _rng(ctx)
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
            raise _error(ctx, self.layer, f"image {full!r} not found")
        return _read_image(full, self.is_color, *self.new_hw)

    def top_shapes(self) -> List[Tuple[int, ...]]:
        return [(self.batch_size,) + self.transform.output_shape(*self.image_shape), (self.batch_size,)]

    def next_batch(self) -> Dict[str, np.ndarray]:
        images, labels = [], np.empty(self.batch_size, np.float32)
        for i in range(self.batch_size):
            path, labels[i] = self.lines[self.order[self.pos]]
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
        return {self.tops[0]: self.transform(np.stack(images)), self.tops[1]: labels}

    def get_state(self) -> Dict[str, Any]:
        return {"pos": self.pos, "order": self.order.tolist()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.pos, self.order = int(state["pos"]), np.asarray(state["order"], np.int64)


class WindowDataLayer:
    """``type: "WindowData"``: R-CNN's window sampler.

    The source file lists, per image, ``# index``, the path, channels, height, width, the
    window count, then ``class overlap x1 y1 x2 y2`` per window. Each batch holds
    ``fg_fraction`` foreground windows (overlap >= fg_threshold, labelled with their class) and
    background windows (overlap < bg_threshold, label 0), each cropped with ``context_pad``
    (``crop_mode`` warp: stretched to crop_size; square: the tightest square around it),
    mirrored at random, mean-subtracted and scaled.
    """

    def __init__(self, layer: caffe_pb2.LayerParameter, phase: int, ctx: Any = None):
        _need_tops(layer, (2,), ctx)
        p = layer.window_data_param
        tp = layer.transform_param
        self.layer, self.tops = layer, list(layer.top)
        self.batch_size = int(p.batch_size)
        self.crop = int(tp.crop_size or p.crop_size)
        if self.crop <= 0:
            raise _error(ctx, layer, "WindowData needs crop_size > 0 (in transform_param)")
        self.scale = float(tp.scale if tp.HasField("scale") else p.scale)
        self.mirror = bool(tp.mirror or p.mirror)
        self.context_pad, self.square = int(p.context_pad), p.crop_mode == "square"
        self.fg_fraction, self.root = float(p.fg_fraction), p.root_folder
        self.rng = _rng(ctx)
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
        lines = iter(_read_list_file(p.source, layer, ctx))
        for head in lines:
            if not head.startswith("#"):
                raise _error(ctx, layer, f"window file: expected '# image_index', got {head!r}")
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
            raise _error(ctx, layer, f"the window file {p.source!r} has no usable windows")
        self.channels = self.images[0][1]

    def top_shapes(self) -> List[Tuple[int, ...]]:
        return [(self.batch_size, self.channels, self.crop, self.crop), (self.batch_size,)]

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
        data = np.empty((self.batch_size, self.channels, self.crop, self.crop), np.float32)
        labels = np.empty(self.batch_size, np.float32)
        cache: Dict[int, np.ndarray] = {}
        for i, (img_index, label, _, box) in enumerate(picks):
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
            data[i] = window * np.float32(self.scale)
            labels[i] = label
        return {self.tops[0]: data, self.tops[1]: labels}


# --------------------------------------------------------------------------- registry

FACTORIES: Dict[str, DataLayerFactory] = {
    "Data": LMDBDataLayer,
    "HDF5Data": HDF5DataLayer,
    "HDF5Output": HDF5OutputLayer,
    "ImageData": ImageDataLayer,
    "WindowData": WindowDataLayer,
}

for _name, _factory in FACTORIES.items():
    if _name not in DATA_LAYERS:
        register_data_layer(_name)(_factory)
