"""Weights in and out of a Net: .caffemodel (binary NetParameter) and HDF5, and weight sharing.

Loading follows Caffe's CopyTrainedLayersFrom: source layers are matched to the net's layers by
name (unknown ones are skipped), the blob count must match and each shape must match (legacy
num/channels/height/width shapes align from the end, as Blob::ShapeEquals allows). Everything is
read and checked into temporaries first and committed only when all of it fits, so a corrupt or
mismatched file never half-loads.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Dict, List, Tuple

import numpy as np

from cgvm.backend import host_array
from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeNetError, CaffeParseError
from cgvm.frontends.caffe.io import set_packed_floats
from cgvm.frontends.caffe.prototxt import HDF5_SIGNATURE, blobproto_shape, read_net_binary, write_net_binary

if TYPE_CHECKING:
    from cgvm.frontends.caffe.net import Net


def shape_fits(target: Tuple[int, ...], blob: caffe_pb2.BlobProto) -> bool:
    """Blob::ShapeEquals: legacy 4-D shapes compare right-aligned against the target padded with 1s."""
    if any(blob.HasField(f) for f in ("num", "channels", "height", "width")):
        if len(target) > 4:
            return False
        return (1,) * (4 - len(target)) + tuple(target) == (blob.num, blob.channels, blob.height, blob.width)
    return tuple(target) == tuple(blob.shape.dim)


def _blob_array(blob: caffe_pb2.BlobProto) -> np.ndarray:
    values = blob.double_data if len(blob.double_data) else blob.data
    return np.asarray(values, dtype=np.float64 if len(blob.double_data) else np.float32).reshape(blobproto_shape(blob))


def _is_hdf5(path: str) -> bool:
    try:
        with open(path, "rb") as stream:
            return stream.read(8) == HDF5_SIGNATURE
    except IsADirectoryError:
        raise CaffeParseError("this is a directory, not a weights file", filename=path) from None
    except OSError as exc:
        raise CaffeParseError(f"cannot read the file: {exc}", filename=path) from exc


def copy_from(net: "Net", path: str) -> None:
    """Load weights by layer name from a .caffemodel (binary) or an HDF5 weights file.

    ``path`` may be a comma-separated list (as Caffe accepts): every file is read and checked
    first, later files overriding earlier ones; the net changes only when all of them fit.
    """
    staged: Dict[str, np.ndarray] = {}
    for part in stage_weights(net, path).values():
        staged.update(part)
    commit_weights(net, staged)


def stage_weights(net: "Net", path: str) -> Dict[str, Dict[str, np.ndarray]]:
    """Every file of the comma list ``path`` read and checked against ``net``: file -> {entry: array}.
    Nothing of the net changes; raise (a CaffeError naming the file and layer) when one does not fit."""
    parts = [p for p in str(path).split(",") if p] or [str(path)]
    for part in parts:
        if not os.path.exists(part):
            raise FileNotFoundError(f"Could not open file {part}")
    staged: Dict[str, Dict[str, np.ndarray]] = {}
    for part in parts:
        staged[part] = _stage_hdf5(net, part) if _is_hdf5(part) else _stage_caffemodel(net, part)
    return staged


def commit_weights(net: "Net", staged: Dict[str, np.ndarray]) -> None:
    """Write checked arrays into the net's learnable blobs (shapes were checked by staging)."""
    ws = net.workspace
    for name, array in staged.items():
        ws[name][...] = array


def _layer_params(net: "Net") -> Dict[str, list]:
    return {info.name: info.params for info in net.layer_infos}


def _stage_caffemodel(net: "Net", path: str) -> Dict[str, np.ndarray]:
    source = read_net_binary(path)
    targets = _layer_params(net)
    staged: Dict[str, np.ndarray] = {}
    for layer in source.layer:
        params = targets.get(layer.name)
        if params is None:
            continue   # Caffe: "Ignoring source layer"
        if len(layer.blobs) != len(params):
            raise CaffeNetError(f"{path}: layer '{layer.name}' has {len(layer.blobs)} blob(s) in the file, the "
                                f"net's layer has {len(params)} ({net.filename}); rename the layer to keep its "
                                "initialization")
        for index, (blob, param) in enumerate(zip(layer.blobs, params)):
            if not shape_fits(param.shape, blob):
                raise CaffeNetError(
                    f"{path}: cannot copy param {index} weights from layer '{layer.name}': shape mismatch. "
                    f"The file has {blobproto_shape(blob)}, the net ({net.filename}) needs {param.shape}; "
                    "to learn this layer's parameters from scratch rather than copying from a saved net, "
                    "rename the layer")
            staged[param.name] = _blob_array(blob).reshape(param.shape).astype(net.dtype)
    return staged


def read_numeric_dataset(dataset: object, where: str, path: str, total: int, limit: int) -> Tuple[np.ndarray, int]:
    """An HDF5 numeric dataset's values, and ``total`` plus its bytes, counted against ``limit``
    before anything is read (CGVM_MAX_BYTES); a CaffeParseError naming ``where`` otherwise."""
    import h5py

    if not isinstance(dataset, h5py.Dataset) or dataset.dtype.kind not in "fiu":
        raise CaffeParseError(f"{where} is not a numeric dataset (or is missing)", filename=path)
    total += int(np.prod(dataset.shape, dtype=object)) * dataset.dtype.itemsize
    if total > limit:
        raise CaffeParseError(f"{where}: the datasets need {total} bytes, past the limit of {limit} "
                              "(CGVM_MAX_BYTES)", filename=path)
    return np.asarray(dataset[()]), total


def read_hdf5_groups(path: str, group_name: str, wanted: List[str], limit: int) -> Dict[str, Dict[str, np.ndarray]]:
    """``/<group_name>/<layer>/<i>`` datasets of the layers in ``wanted`` as arrays (run in a guarded child).

    Each dataset must be numeric and the total at most ``limit`` bytes, checked before it is read.
    Raises CaffeParseError naming the dataset; h5py's own errors are chained.
    """
    import h5py

    out: Dict[str, Dict[str, np.ndarray]] = {}
    total = 0
    where = f"/{group_name}"
    try:
        with h5py.File(path, "r") as handle:
            group = handle.get(group_name)
            if not isinstance(group, h5py.Group):
                raise CaffeParseError(f"no {where} group: not Caffe HDF5 weights", filename=path)
            for layer_name in list(group.keys()):
                if layer_name not in wanted:
                    continue
                where = f"/{group_name}/{layer_name}"
                layer_group = group[layer_name]
                if not isinstance(layer_group, h5py.Group):
                    raise CaffeParseError(f"{where} is not a group of blobs", filename=path)
                blobs: Dict[str, np.ndarray] = {}
                for key in list(layer_group.keys()):
                    where = f"/{group_name}/{layer_name}/{key}"
                    if not key.isdigit():
                        raise CaffeParseError(f"{where}: blob names are 0, 1, ...", filename=path)
                    blobs[key], total = read_numeric_dataset(layer_group[key], where, path, total, limit)
                out[layer_name] = blobs
    except CaffeParseError:
        raise
    except Exception as exc:   # h5py's KeyError / OSError / RuntimeError / ValueError on a corrupt file
        raise CaffeParseError(f"cannot read HDF5 weights at {where}: {type(exc).__name__}: {exc}",
                              filename=path) from exc
    return out


def _stage_hdf5(net: "Net", path: str) -> Dict[str, np.ndarray]:
    import h5py  # noqa: F401  (imported here once, not again in every guarded reader)

    from cgvm.env import max_bytes
    from cgvm.guard import call_with_deadline

    targets = _layer_params(net)
    layers = call_with_deadline(read_hdf5_groups, path, "data", list(targets), max_bytes(),
                                what=f"{path}: reading HDF5 weights", path=path)
    staged: Dict[str, np.ndarray] = {}
    for layer_name, group in layers.items():
        params = targets[layer_name]
        if len(group) > len(params):
            raise CaffeNetError(f"{path}: layer '{layer_name}' has {len(group)} blobs in the file, the net "
                                f"has {len(params)}")
        for index, param in enumerate(params):
            key = str(index)
            if key not in group:
                if param.layer != layer_name:
                    continue   # shared, owned by another layer
                raise CaffeNetError(f"{path}: layer '{layer_name}' lacks blob {index}")
            array = group[key]
            if tuple(array.shape) != param.shape:
                raise CaffeNetError(f"{path}: cannot copy param {index} weights from layer '{layer_name}': "
                                    f"shape {tuple(array.shape)} in the file, the net needs {param.shape}")
            staged[param.name] = array.astype(net.dtype)
    return staged


def to_proto(net: "Net", write_diff: bool = False) -> caffe_pb2.NetParameter:
    """The net's layers with their blobs (Net::ToProto): shape + data, diffs when asked."""
    out = caffe_pb2.NetParameter()
    out.name = net.name
    ws = net.workspace
    for info in net.layer_infos:
        layer = out.layer.add()
        layer.CopyFrom(info.param)
        del layer.blobs[:]
        for param in info.params:
            blob = layer.blobs.add()
            blob.shape.dim.extend(param.shape)
            set_packed_floats(blob, "data", host_array(ws[param.name]))
            if write_diff:
                set_packed_floats(blob, "diff", host_array(ws[param.diff_name]))
    return out


def save(net: "Net", path: str, write_diff: bool = False) -> None:
    """Write a binary .caffemodel (replaced atomically)."""
    write_net_binary(to_proto(net, write_diff), path)


def save_hdf5(net: "Net", path: str, write_diff: bool = False) -> None:
    """Caffe's HDF5 weights: /data/<layer>/<i> (and /diff/... when asked)."""
    import h5py

    ws = net.workspace
    with h5py.File(path, "w") as handle:
        groups = [("data", "name")] + ([("diff", "diff_name")] if write_diff else [])
        for group_name, attr in groups:
            group = handle.create_group(group_name)
            for info in net.layer_infos:
                layer_group = group.create_group(info.name)
                for index, param in enumerate(info.params):
                    if param.layer == info.name:
                        layer_group.create_dataset(str(index), data=host_array(ws[getattr(param, attr)]))


def share_with(net: "Net", other: "Net") -> None:
    """Point ``net``'s learnable blobs at ``other``'s same-named layers' arrays (shapes must agree).

    Both nets must use one Workspace for the sharing to survive updates that rebind entries;
    with separate workspaces the arrays are shared until one side stores a new array.
    """
    theirs = {info.name: info.params for info in other.layer_infos}
    pairs: List[tuple] = []
    for info in net.layer_infos:
        source = theirs.get(info.name)
        if source is None:
            continue
        if len(source) != len(info.params):
            raise CaffeNetError(f"share_with: layer '{info.name}' has {len(info.params)} blobs here and "
                                f"{len(source)} in the other net")
        for mine, other_param in zip(info.params, source):
            if mine.shape != other_param.shape:
                raise CaffeNetError(f"share_with: layer '{info.name}' blob {mine.index} has shape {mine.shape} here "
                                    f"and {other_param.shape} in the other net")
            pairs.append((mine, other_param))
    for mine, other_param in pairs:
        if net.workspace is other.workspace and mine.name == other_param.name:
            continue
        net.workspace.set(mine.name, other.workspace[other_param.name])
