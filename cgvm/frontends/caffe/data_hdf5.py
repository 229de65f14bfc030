"""``type: "HDF5Data"`` (reads batches from the HDF5 files of a list file) and ``type: "HDF5Output"``
(a sink appending its bottoms to one HDF5 file); both need h5py.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Tuple

import numpy as np

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.data_common import BatchShare, layer_error, layer_rng, read_list_file


class HDF5DataLayer(BatchShare):
    """``type: "HDF5Data"``: each top reads the dataset named like it from the files of a list file.

    Rows are read in order (or shuffled, with the file order, when ``shuffle``); a batch runs
    on into the next file, and the last file wraps to the first. With a share (``take_share``)
    only the kept rows are copied into the batch; each file is still loaded whole when the read
    position reaches it, as Caffe's HDF5 layer does in every solver.
    """

    def __init__(self, layer: caffe_pb2.LayerParameter, phase: int, ctx: Any = None):
        if not layer.top:
            raise layer_error(ctx, layer, "HDF5Data needs at least one top")
        try:
            import h5py  # noqa: F401
        except ImportError:
            raise layer_error(ctx, layer, "the HDF5Data layer needs h5py: pip install h5py") from None
        param = layer.hdf5_data_param
        self.layer, self.tops = layer, list(layer.top)
        self.batch_size = int(param.batch_size)
        if self.batch_size <= 0:
            raise layer_error(ctx, layer, "hdf5_data_param.batch_size must be positive")
        self.files = read_list_file(param.source, layer, ctx)
        if not self.files:
            raise layer_error(ctx, layer, f"the list file {param.source!r} names no HDF5 files")
        self.shuffle = bool(param.shuffle)
        self.rng = layer_rng(ctx)
        self.ctx = ctx
        self.file_order = np.arange(len(self.files))
        if self.shuffle:
            self.rng.shuffle(self.file_order)
        self.file_pos = 0
        self._load(self.file_order[0])

    def _load(self, index: int) -> None:
        from cgvm.env import max_bytes
        from cgvm.errors import CgvmError
        from cgvm.guard import call_with_deadline

        path = self.files[index]
        if not os.path.isfile(path):
            raise layer_error(self.ctx, self.layer,
                              f"HDF5 file {path!r} (listed in {self.layer.hdf5_data_param.source!r}) not found")
        try:   # in a guarded child: a corrupt file can send libhdf5 into a loop that never returns
            self.current = call_with_deadline(read_datasets, path, self.tops, max_bytes(),
                                              what=f"reading HDF5 data {path!r}", path=path)
        except CgvmError as exc:
            raise layer_error(self.ctx, self.layer, str(exc)) from exc
        rows = {len(a) for a in self.current.values()}
        if len(rows) != 1:
            raise layer_error(self.ctx, self.layer, f"the datasets of {path!r} have different numbers of rows {rows}")
        self.rows = rows.pop()
        self.row_order = np.arange(self.rows)
        if self.shuffle:
            self.rng.shuffle(self.row_order)
        self.row = 0

    def top_shapes(self) -> List[Tuple[int, ...]]:
        return [(self.share_size,) + self.current[t].shape[1:] for t in self.tops]

    def get_state(self) -> Dict[str, Any]:
        return {"file_order": self.file_order.tolist(), "file_pos": self.file_pos, "row": self.row,
                "row_order": self.row_order.tolist()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Resume at a saved read position (ValueError, and nothing changed, when it does not fit)."""
        file_order = np.asarray(state["file_order"], np.int64)
        file_pos = int(state["file_pos"])
        if sorted(file_order.tolist()) != list(range(len(self.files))) or not 0 <= file_pos < len(self.files):
            raise ValueError(f"saved file order {file_order.tolist()[:10]} / position {file_pos} do not fit the "
                             f"{len(self.files)} files of {self.layer.hdf5_data_param.source!r}")
        kept = (self.file_order, self.file_pos, self.current, self.rows, self.row_order, self.row)
        self.file_order, self.file_pos = file_order, file_pos
        self._load(self.file_order[self.file_pos])
        row, row_order = int(state["row"]), np.asarray(state["row_order"], np.int64)
        if sorted(row_order.tolist()) != list(range(self.rows)) or not 0 <= row <= self.rows:
            self.file_order, self.file_pos, self.current, self.rows, self.row_order, self.row = kept
            raise ValueError(f"saved row order / row {row} do not fit the {self.rows} rows of the current file")
        self.row, self.row_order = row, row_order

    def next_batch(self) -> Dict[str, np.ndarray]:
        keep = self.kept()
        out = {t: np.empty((self.share_size,) + a.shape[1:], np.float32) for t, a in self.current.items()}
        j = 0
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
            if keep[i]:
                r = self.row_order[self.row]
                for t in self.tops:
                    out[t][j] = self.current[t][r]
                j += 1
            self.row += 1
        self.records_decoded += j
        return out


def read_datasets(path: str, tops: List[str], limit: int) -> Dict[str, np.ndarray]:
    """The datasets named ``tops`` of one HDF5 file as float32 (checked: numeric, at most ``limit`` bytes)."""
    import h5py

    from cgvm.frontends.caffe.errors import CaffeParseError

    try:
        with h5py.File(path, "r") as f:
            missing = [t for t in tops if t not in f]
            if missing:
                raise CaffeParseError(f"no dataset {missing[0]!r} (each top reads the dataset of its name; the "
                                      f"file has {sorted(f.keys())})", filename=path)
            total = 0
            for t in tops:
                dataset = f[t]
                if not isinstance(dataset, h5py.Dataset) or dataset.dtype.kind not in "biuf" or not dataset.shape:
                    raise CaffeParseError(f"/{t} is not a numeric dataset with rows", filename=path)
                total += int(np.prod(dataset.shape, dtype=object)) * 4
                if total > limit:
                    raise CaffeParseError(f"/{t}: the datasets need {total} bytes as float32, past the limit of "
                                          f"{limit} (CGVM_MAX_BYTES)", filename=path)
            return {t: np.asarray(f[t], dtype=np.float32) for t in tops}
    except CaffeParseError:
        raise
    except Exception as exc:   # h5py's OSError / KeyError / RuntimeError on a corrupt file
        raise CaffeParseError(f"cannot read HDF5 data: {type(exc).__name__}: {exc}", filename=path) from exc


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
            raise layer_error(ctx, layer, "the HDF5Output layer needs h5py: pip install h5py") from None
        if len(layer.bottom) != 2:
            raise layer_error(ctx, layer, f"HDF5Output takes 2 bottoms (data, label), got {len(layer.bottom)}")
        self.layer, self.bottoms = layer, list(layer.bottom)
        self.file_name = layer.hdf5_output_param.file_name
        if not self.file_name:
            raise layer_error(ctx, layer, "hdf5_output_param.file_name is required")
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
