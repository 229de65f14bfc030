"""``type: "Data"``: Caffe's Datum records read from an LMDB database (LevelDB is not supported)."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Tuple

import numpy as np

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.data_common import BatchShare, DataTransformer, layer_error, layer_rng, need_tops
from cgvm.frontends.caffe.errors import CaffeNetError
from cgvm.frontends.caffe.io import datum_to_array

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


class LMDBDataLayer(BatchShare):
    """``type: "Data"``: Datum records from an LMDB database, in key order, wrapping at the end.

    With a share (``take_share``) the cursor steps over every record of the batch but only the
    kept records are fetched and parsed."""

    def __init__(self, layer: caffe_pb2.LayerParameter, phase: int, ctx: Any = None):
        need_tops(layer, (1, 2), ctx)
        param = layer.data_param
        self.layer, self.tops = layer, list(layer.top)
        self.batch_size = int(param.batch_size)
        if self.batch_size <= 0:
            raise layer_error(ctx, layer, "data_param.batch_size must be positive")
        source = param.source
        if not os.path.exists(source):
            raise layer_error(ctx, layer, f"data_param.source {source!r} not found (paths are relative to the "
                              f"working directory {os.getcwd()!r}; `cgvm data digits --out DIR` writes an example)")
        is_lmdb = os.path.isfile(os.path.join(source, "data.mdb")) or source.endswith(".mdb")
        if param.backend != caffe_pb2.DataParameter.LMDB and not is_lmdb:
            raise layer_error(ctx, layer, f"{source!r} is not an LMDB database and LevelDB is not supported; "
                              "convert it to LMDB and set `backend: LMDB`")
        try:
            import lmdb
        except ImportError:
            raise layer_error(ctx, layer, "the Data layer needs the lmdb package: pip install lmdb") from None
        self.rng = layer_rng(ctx)
        self._env = _open_lmdb(lmdb, source)
        self._txn = self._env.begin(buffers=False)
        self._cursor = self._txn.cursor()
        if not self._cursor.first():
            raise layer_error(ctx, layer, f"the LMDB database {source!r} is empty")
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
        n = self.share_size
        shapes = [(n,) + self.transform.output_shape(*self.datum_shape)]
        return shapes + [(n,)] if len(self.tops) > 1 else shapes

    def next_batch(self) -> Dict[str, np.ndarray]:
        keep = self.kept()
        n = self.share_size
        raw = np.empty((n,) + tuple(self.datum_shape), dtype=np.float32)
        labels = np.empty(n, dtype=np.float32)
        j = 0
        for i in range(self.batch_size):
            if keep[i]:
                item = self._datum()
                if item.shape != self.datum_shape:
                    raise CaffeNetError(f"layer {self.layer.name!r}: record {self._cursor.key()!r} has shape "
                                        f"{item.shape}, the first had {self.datum_shape}")
                raw[j], labels[j] = item, self._label
                j += 1
            self._advance()
        self.records_decoded += n
        out = {self.tops[0]: self.transform(raw, self.positions, self.batch_size)}
        if len(self.tops) > 1:
            out[self.tops[1]] = labels
        return out
