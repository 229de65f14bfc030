"""The pycaffe surface: ``import cgvm.caffe as caffe`` and pycaffe scripts run unchanged.

``Net`` adds pycaffe's name-based methods (forward, backward, forward_all, ...) to the
graph-backed net of net.py. ``set_mode_gpu`` switches new nets to the CuPy backend.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from cgvm.errors import BackendUnavailable
from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe import net as _net
from cgvm.frontends.caffe import weights as _weights
from cgvm.frontends.caffe.blob import Blob
from cgvm.frontends.caffe.errors import CaffeError
from cgvm.frontends.caffe.layers import CONVERTERS, DATA_LAYERS
from cgvm.frontends.caffe.layers.python_layer import Layer

TRAIN = caffe_pb2.TRAIN
TEST = caffe_pb2.TEST
__version__ = "1.0.0"

#: backend None: $CGVM_BACKEND (checked: an unknown value is an error), else NumPy, until set_mode_* says
_mode = {"backend": None, "device": 0}


def set_mode_cpu() -> None:
    """New nets run on NumPy."""
    _mode["backend"] = "numpy"


def set_mode_gpu() -> None:
    """New nets run on CuPy; an error says so when CuPy or a GPU is missing."""
    from cgvm.backend import get_backend

    try:
        get_backend("cupy")
    except BackendUnavailable:
        raise
    except Exception as exc:  # an import or driver failure inside CuPy
        raise BackendUnavailable(f"set_mode_gpu needs CuPy and a CUDA device: {exc}") from exc
    from cgvm.backend.cupy import use_device

    use_device(_mode["device"], "caffe.set_device")   # set_device may come before set_mode_gpu
    _mode["backend"] = "cupy"


def set_device(device_id: int) -> None:
    """The CUDA device for GPU mode (CuPy's current device)."""
    _mode["device"] = int(device_id)
    if _mode["backend"] == "cupy":
        from cgvm.backend.cupy import use_device

        use_device(int(device_id), "caffe.set_device")


def set_random_seed(seed: int) -> None:
    """Seed for new nets' fillers and dropout."""
    _mode["seed"] = int(seed)


def layer_type_list() -> List[str]:
    """Every layer type cgvm knows."""
    return sorted(set(CONVERTERS) | set(DATA_LAYERS) | {"Python"})


class Net(_net.Net):
    """caffe.Net: ``Net(file, phase)``, ``Net(file, weights, phase)``, ``Net(file, phase, level=, stages=,
    weights=)``. See net.Net for cgvm's extra keywords."""

    def __init__(self, network_file: Any, *args: Any, **kwargs: Any):
        kwargs.setdefault("backend", _mode["backend"])
        if "seed" not in kwargs and "seed" in _mode:
            kwargs["seed"] = _mode["seed"]
        if isinstance(network_file, (str, os.PathLike)) and not os.path.exists(network_file) \
                and "\n" not in str(network_file) and "{" not in str(network_file):
            raise FileNotFoundError(f"Could not open file {network_file}")
        super().__init__(network_file, *args, **kwargs)

    # -- forward / backward -----------------------------------------------------------
    def _range(self, start: Optional[str], end: Optional[str]) -> tuple:
        lo = self.layer_index(start) if start is not None else 0
        hi = self.layer_index(end) if end is not None else len(self.layer_infos) - 1
        return lo, hi

    def forward(self, blobs: Optional[Sequence[str]] = None, start: Optional[str] = None,
                end: Optional[str] = None, **kwargs: Any) -> Dict[str, Any]:
        """Run layers start..end (names, inclusive); return {output: data} (or end's tops) plus ``blobs``."""
        if kwargs:
            if set(kwargs) != set(self.inputs):
                raise Exception("Input blob arguments do not match net inputs.")
            for name, value in kwargs.items():
                blob = self.blobs[name]
                if np.shape(value)[0] != blob.shape[0]:
                    raise Exception("Input is not batch sized")
                blob.data[...] = value
        lo, hi = self._range(start, end)
        self._forward(lo, hi)
        names = set(self.top_names[self.layer_infos[hi].name] if end is not None else self.outputs)
        names.update(blobs or ())
        blob_map = self.blobs
        return {name: blob_map[name].data for name in names}

    def _forward_indices(self, start: int, end: int) -> float:
        return self._forward(start, end)

    def after_backward(self, callback: Any) -> None:
        """pycaffe's per-layer hook, for ``caffe.NCCL`` (python/train.py's layer-wise reduction): the
        gradient reduction is compiled into the solver's step, so an NCCL object needs no call here."""
        from cgvm.frontends.caffe.solver_parallel import NCCL

        if not isinstance(callback, NCCL):
            raise CaffeError("Net.after_backward: per-layer Python callbacks are not supported (a net's backward "
                             "pass is one compiled program); only a caffe.NCCL object is accepted")

    def backward(self, diffs: Optional[Sequence[str]] = None, start: Optional[str] = None,
                 end: Optional[str] = None, **kwargs: Any) -> Dict[str, Any]:
        """Backward from layer start down to end; return {input: diff} (or end's bottoms) plus ``diffs``."""
        if kwargs:
            if set(kwargs) != set(self.outputs):
                raise Exception("Top diff arguments do not match net outputs.")
            for name, value in kwargs.items():
                blob = self.blobs[name]
                if np.shape(value)[0] != blob.shape[0]:
                    raise Exception("Diff is not batch sized")
                blob.diff[...] = value
        start_index = self.layer_index(start) if start is not None else len(self.layer_infos) - 1
        end_index = self.layer_index(end) if end is not None else 0
        self._backward(start_index, end_index)
        names = set(self.bottom_names[self.layer_infos[end_index].name] if end is not None else self.inputs)
        names.update(diffs or ())
        blob_map = self.blobs
        return {name: blob_map[name].diff for name in names}

    def forward_backward_all(self, blobs: Optional[Sequence[str]] = None, diffs: Optional[Sequence[str]] = None,
                             **kwargs: Any):
        """forward_all then backward per batch; returns (outputs, diffs) concatenated over batches."""
        return self._run_batches(blobs, diffs, kwargs, backward=True)

    def forward_all(self, blobs: Optional[Sequence[str]] = None, **kwargs: Any) -> Dict[str, np.ndarray]:
        """Forward arbitrarily many inputs in batches of the net's size (the last one zero-padded)."""
        return self._run_batches(blobs, None, kwargs, backward=False)[0]

    def _run_batches(self, blobs, diffs, kwargs, backward: bool):
        out_names = list(self.outputs) + list(blobs or ())
        diff_names = list(self.inputs) + list(diffs or ())
        inputs = {k: v for k, v in kwargs.items() if k in self.inputs}
        top_diffs = {k: v for k, v in kwargs.items() if k in self.outputs}
        outs: Dict[str, List[np.ndarray]] = {name: [] for name in out_names}
        grads: Dict[str, List[np.ndarray]] = {name: [] for name in diff_names}
        first = next(iter(inputs.values())) if inputs else None
        total = len(first) if first is not None else 1
        batch = self.blobs[next(iter(inputs))].shape[0] if inputs else 1
        for lo in range(0, total, batch):
            feed = {k: _padded(v, lo, batch) for k, v in inputs.items()}
            result = self.forward(blobs=blobs, **feed)
            for name in out_names:
                outs[name].append(np.array(result[name], copy=True))
            if backward:
                feed_diffs = {k: _padded(v, lo, batch) for k, v in top_diffs.items()}
                grad = self.backward(diffs=diffs, **feed_diffs)
                for name in diff_names:
                    grads[name].append(np.array(grad[name], copy=True))
        pad = (-total) % batch if inputs else 0

        def joined(parts):
            array = np.concatenate(parts) if parts and parts[0].ndim else np.asarray(parts)
            return array[:len(array) - pad] if pad and array.ndim else array
        return ({k: joined(v) for k, v in outs.items()}, {k: joined(v) for k, v in grads.items()})

    def reshape(self) -> None:
        """Propagate input shapes: every blob takes the shape the next forward will give it."""
        build = self._build(0, len(self.layer_infos) - 1)
        for i, t, value in build.versions:
            self._ensure_blob(self._version_entry[(i, t)], value.shape)
            self._ensure_blob(self._entry(self.layer_infos[i].tops[t]), value.shape)

    def save_hdf5(self, path: str) -> None:
        _weights.save_hdf5(self, path)

    def load_hdf5(self, path: str) -> None:
        self.copy_from(path)

    def set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        """Feed a MemoryData layer (the net's first layer)."""
        first = self.layer_infos[0]
        if first.type != "MemoryData":
            raise RuntimeError("set_input_arrays may only be called if the first layer is a MemoryData layer")
        first.data.set_input_arrays(data, labels)

    @property
    def _blobs(self) -> List[Blob]:
        return list(self.blobs.values())

    @property
    def _inputs(self) -> List[int]:
        names = self._blob_names
        return [names.index(n) for n in self.inputs]

    @property
    def _outputs(self) -> List[int]:
        names = self._blob_names
        return [names.index(n) for n in self.outputs]

    @property
    def _blob_loss_weights(self) -> List[float]:
        return list(self.blob_loss_weights.values())


def _padded(array: np.ndarray, lo: int, batch: int) -> np.ndarray:
    part = np.asarray(array[lo:lo + batch])
    if len(part) < batch:
        part = np.concatenate([part, np.zeros((batch - len(part),) + part.shape[1:], part.dtype)])
    return part


__all__ = ["Net", "Layer", "TRAIN", "TEST", "set_mode_cpu", "set_mode_gpu", "set_device", "set_random_seed",
           "layer_type_list", "Blob", "__version__"]
