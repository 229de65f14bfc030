"""``keras.callbacks.TensorBoard``: Keras 3's callback, written through cgvm.board.

The run layout and tag names are Keras 3's (keras/src/callbacks/tensorboard.py):

* ``<log_dir>/train`` and ``<log_dir>/validation`` runs;
* ``epoch_<metric>`` at step = epoch (train: the epoch's logs plus ``epoch_learning_rate``;
  validation: the ``val_`` logs without the prefix), and with ``write_steps_per_second``
  ``epoch_steps_per_second``;
* with ``update_freq="batch"`` or N: ``batch_<metric>`` (the running means fit reports) every N
  global batches (counted from 1 across epochs), and ``batch_steps_per_second``;
* ``evaluation_<metric>_vs_iterations`` in the validation run at step = optimizer.iterations
  after each evaluation with this callback (and each validation pass of fit);
* ``histogram_freq``: ``<weight path>/histogram`` per weight of every layer (the path Keras
  gives: ``sequential/dense/kernel`` in a Sequential model, ``dense/kernel`` otherwise), and
  with ``write_images`` ``<weight path>/image`` where Keras makes one;
* ``write_graph``: the model config as the conceptual graph (tag ``keras``, Sequential and
  functional models, as Keras), and the op graph cgvm runs for a training step: after the
  passes as the train run's graph, as written under tag ``before_passes``;
* ``embeddings_freq``: every Embedding layer's matrix for the Projector (``projector_config.pbtxt``
  in log_dir pointing at a TSV file per layer, the latest epoch's);
* ``profile_batch=N`` or ``(start, stop)``: per-op times of those training batches (Keras
  cannot profile on its torch backend; cgvm can): the graph dashboard's tag ``batch_<stop>``
  (colour by compute time), the op table as text, and ``train/profile_batch_<stop>.trace.json``
  (Chrome trace events for Perfetto / chrome://tracing). The first batch compiles the step, so
  a profile that starts at batch 1 starts at batch 2.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Optional

import numpy as np

from ...board import OpProfiler, SummaryWriter
from .callbacks import Callback

_PROFILE_ERROR = ("profile_batch must be a non-negative integer or 2-tuple of positive integers. A pair of positive "
                  "integers signifies a range of batches to profile. Found: {}")


class TensorBoard(Callback):
    """Keras 3's TensorBoard callback (see the module docstring for what is written where)."""

    def __init__(self, log_dir: Any = "logs", histogram_freq: int = 0, write_graph: bool = True,
                 write_images: bool = False, write_steps_per_second: bool = False, update_freq: Any = "epoch",
                 profile_batch: Any = 0, embeddings_freq: int = 0, embeddings_metadata: Any = None):
        super().__init__()
        self.log_dir = str(log_dir)
        self.histogram_freq = histogram_freq
        self.write_graph = write_graph
        self.write_images = write_images
        self.write_steps_per_second = write_steps_per_second
        self.update_freq = 1 if update_freq == "batch" else update_freq
        if self.update_freq != "epoch" and not (isinstance(self.update_freq, int) and self.update_freq > 0):
            raise ValueError(f"update_freq must be 'epoch', 'batch' or a positive integer, got {update_freq!r}")
        self.embeddings_freq = embeddings_freq
        self.embeddings_metadata = embeddings_metadata
        self._start_batch, self._stop_batch = _profile_range(profile_batch)
        self._should_trace = not (self._start_batch == 0 and self._stop_batch == 0)
        self._writers: Dict[str, SummaryWriter] = {}
        self._global_train_batch = 0
        self._global_test_batch = 0
        self._profiler: Optional[OpProfiler] = None
        self._profile_step: Any = None

    # -- writers
    def set_model(self, model: Any) -> None:
        self.model = model
        self._train_dir = os.path.join(self.log_dir, "train")
        self._val_dir = os.path.join(self.log_dir, "validation")
        self._close_writers()
        self._should_write_train_graph = False
        if self.write_graph:
            if type(model).__name__ in ("Functional", "Sequential") and hasattr(model, "to_json"):
                self._train_writer.add_keras_model(model.to_json(), tag="keras", step=0)
            self._should_write_train_graph = True

    @property
    def _train_writer(self) -> SummaryWriter:
        if "train" not in self._writers:
            self._writers["train"] = SummaryWriter(self._train_dir)
        return self._writers["train"]

    @property
    def _val_writer(self) -> SummaryWriter:
        if "val" not in self._writers:
            self._writers["val"] = SummaryWriter(self._val_dir)
        return self._writers["val"]

    def _close_writers(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers = {}

    def _recording(self) -> bool:
        return self.update_freq != "epoch" and self._global_train_batch % self.update_freq == 0

    # -- training
    def on_train_begin(self, logs=None):
        self._global_train_batch = 0

    def on_train_end(self, logs=None):
        if self._profiler is not None:
            self._stop_profile()
        self._close_writers()

    def on_epoch_begin(self, epoch, logs=None):
        if self.write_steps_per_second:
            self._epoch_start_iterations = self.model.optimizer.iterations
            self._epoch_start_time = time.time()

    def on_train_batch_begin(self, batch, logs=None):
        self._global_train_batch += 1
        if self.write_steps_per_second:
            self._batch_start_time = time.time()
        if not self._should_trace:
            return
        if self._profiler is None and self._start_batch <= self._global_train_batch <= self._stop_batch:
            step_fn = self._train_function()
            if step_fn is not None:
                self._profiler = OpProfiler(step_fn).__enter__()
        if self._profiler is not None:
            self._profile_step = self._profiler.step(f"batch {self._global_train_batch}")
            self._profile_step.__enter__()

    def on_train_batch_end(self, batch, logs=None):
        if self._profile_step is not None:
            self._profile_step.__exit__(None, None, None)
            self._profile_step = None
        if self._should_write_train_graph:
            step_fn = self._train_function()
            if step_fn is not None:
                self._train_writer.add_graph(step_fn)
                self._should_write_train_graph = False
        if self._recording():
            writer = self._train_writer
            if self.write_steps_per_second:
                writer.add_scalar("batch_steps_per_second", 1.0 / max(time.time() - self._batch_start_time, 1e-9),
                                  self._global_train_batch)
            for name, value in (logs or {}).items():
                writer.add_scalar(f"batch_{name}", value, self._global_train_batch)
        if self._profiler is not None and self._global_train_batch >= self._stop_batch:
            self._stop_profile()

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        train_logs = {k: v for k, v in logs.items() if not k.startswith("val_")}
        val_logs = {k[4:]: v for k, v in logs.items() if k.startswith("val_")}
        train_logs["learning_rate"] = float(self.model.optimizer.learning_rate)
        if self.write_steps_per_second:
            done = self.model.optimizer.iterations - self._epoch_start_iterations
            train_logs["steps_per_second"] = done / max(time.time() - self._epoch_start_time, 1e-9)
        for name, value in train_logs.items():
            self._train_writer.add_scalar(f"epoch_{name}", value, epoch)
        for name, value in val_logs.items():
            self._val_writer.add_scalar(f"epoch_{name}", value, epoch)
        if self.histogram_freq and epoch % self.histogram_freq == 0:
            self._log_weights(epoch)
        if self.embeddings_freq and epoch % self.embeddings_freq == 0:
            self._log_embeddings(epoch)
        for writer in self._writers.values():
            writer.flush()

    # -- evaluation
    def on_test_begin(self, logs=None):
        pass

    def on_test_batch_begin(self, batch, logs=None):
        self._global_test_batch += 1

    def on_test_end(self, logs=None):
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            return
        for name, value in (logs or {}).items():
            self._val_writer.add_scalar(f"evaluation_{name}_vs_iterations", value, optimizer.iterations)
        self._val_writer.flush()

    # -- weights
    def _weight_paths(self):
        """(Keras' weight path, weight) for every weight of every layer."""
        sequential = type(self.model).__name__ == "Sequential"
        for layer in self.model.layers:
            for weight in layer.weights:
                path = f"{layer.name}/{weight.name}"
                yield (f"{self.model.name}/{path}" if sequential else path).replace(":", "_"), layer, weight

    def _log_weights(self, epoch: int) -> None:
        writer = self._train_writer
        for path, _, weight in self._weight_paths():
            writer.add_histogram(f"{path}/histogram", weight, epoch)
            if self.write_images:
                image = _weight_image(weight.numpy())
                if image is not None:
                    writer.add_images(f"{path}/image", image, epoch)
        writer.flush()

    def _log_embeddings(self, epoch: int) -> None:
        from google.protobuf import text_format
        from tensorboard.plugins.projector.projector_config_pb2 import ProjectorConfig

        config = ProjectorConfig()
        metadata = self.embeddings_metadata
        os.makedirs(self._train_dir, exist_ok=True)
        for path, layer, weight in self._weight_paths():
            if type(layer).__name__ != "Embedding":
                continue
            tsv = os.path.join("train", f"{layer.name}_embeddings_epoch_{epoch}.tsv")
            np.savetxt(os.path.join(self.log_dir, tsv), weight.numpy().reshape(weight.shape[0], -1),
                       delimiter="\t", fmt="%.8g")
            entry = config.embeddings.add(tensor_name=path, tensor_path=tsv)
            if isinstance(metadata, str):
                entry.metadata_path = metadata
            elif isinstance(metadata, dict) and layer.name in metadata:
                entry.metadata_path = metadata[layer.name]
        if isinstance(metadata, dict):
            unknown = set(metadata) - {layer.name for layer in self.model.layers}
            if unknown:
                raise ValueError("Unrecognized `Embedding` layer names passed to `keras.callbacks.TensorBoard` "
                                 f"`embeddings_metadata` argument: {sorted(unknown)}")
        with open(os.path.join(self.log_dir, "projector_config.pbtxt"), "w") as f:
            f.write(text_format.MessageToString(config))

    # -- the compiled step and its profile
    def _train_function(self) -> Any:
        for key, hit in getattr(self.model, "_functions", {}).items():
            if isinstance(key, tuple) and key and key[0] is True:
                return hit[0]
        return None

    def _stop_profile(self) -> None:
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        if profiler.steps:
            tag = f"batch_{self._stop_batch}"
            profiler.write(self._train_writer, tag=tag, step=self._stop_batch,
                           trace_path=os.path.join(self._train_dir, f"profile_{tag}.trace.json"))
            self._train_writer.flush()


def _profile_range(profile_batch: Any):
    """(start, stop) from Keras' profile_batch: N, (start, stop) or "start,stop"."""
    value = profile_batch
    if isinstance(value, str):
        try:
            value = [int(v) for v in value.split(",")]
        except ValueError:
            raise ValueError(_PROFILE_ERROR.format(profile_batch)) from None
        value = value[0] if len(value) == 1 else tuple(value)
    if isinstance(value, int) and not isinstance(value, bool):
        start = stop = value
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        start, stop = value
    else:
        raise ValueError(_PROFILE_ERROR.format(profile_batch))
    if start < 0 or stop < start:
        raise ValueError(_PROFILE_ERROR.format(profile_batch))
    return int(start), int(stop)


def _weight_image(w: np.ndarray) -> Optional[np.ndarray]:
    """A weight as Keras draws it: a bias as a 1 x n strip, a kernel as one image, a conv kernel
    as one image per output channel; None where Keras draws nothing."""
    img = np.squeeze(w)
    shape = img.shape
    if len(shape) == 1:
        img = img.reshape(1, shape[0], 1, 1)
    elif len(shape) == 2:
        if shape[0] > shape[1]:
            img = img.T
        img = img.reshape(1, img.shape[0], img.shape[1], 1)
    elif len(shape) == 3:
        img = np.transpose(img, (2, 0, 1))   # channels_last: one image per kernel
        img = img.reshape(img.shape[0], img.shape[1], img.shape[2], 1)
    return img if img.ndim == 4 and img.shape[-1] in (1, 3, 4) else None
