"""SummaryWriter: one TensorBoard run (a directory of event files) written from cgvm values.

The events are written by the tensorboard package's own ``EventFileWriter`` and built from its
protos and summary helpers (``scalar_pb``, ``histogram_pb``, ``text_pb``, the image plugin's
format), so TensorBoard and its EventAccumulator read them as they read TensorFlow's. Values may
be NumPy or CuPy arrays, Python numbers, cgvm.Tensor (DLPack), Theano shared variables and Keras
variables; graphs may be IR graphs or compiled functions (see add_graph).

    from cgvm.board import SummaryWriter
    with SummaryWriter("logs/run1") as w:
        w.add_scalar("loss", 0.25, step=10)
        w.add_histogram("W", shared_w, step=10)
        w.add_graph(train_fn)          # after the passes (the run graph) and as written
"""
from __future__ import annotations

import io
import time
from typing import Any, Optional, Sequence

import numpy as np

from ..backend import host_array
from ..ir.graph import CONST, Graph, Value
from ._deps import tb
from .graph import GraphDefBuilder, function_graphs

BEFORE_PASSES_TAG = "before_passes"


def as_numpy(value: Any) -> np.ndarray:
    """A host NumPy array of a concrete value (not a symbolic one: evaluate that first)."""
    if isinstance(value, Value):
        if value.kind == CONST:
            return np.asarray(value.data)
        raise TypeError(f"{value.label()} is symbolic (a graph value): compile and run it, then log the result")
    if hasattr(value, "get_value"):          # Theano shared variable
        value = value.get_value()
    elif hasattr(value, "numpy") and callable(value.numpy):   # Keras variable, cgvm.Tensor
        value = value.numpy()
    return host_array(value)


class SummaryWriter:
    """Writes events for one run directory (``log_dir``); see the module docstring."""

    def __init__(self, log_dir: str, *, max_queue: int = 50, flush_secs: float = 10.0, filename_suffix: str = ""):
        self.log_dir = str(log_dir)
        efw = tb("summary.writer.event_file_writer")
        self._writer = efw.EventFileWriter(self.log_dir, max_queue_size=max_queue, flush_secs=flush_secs,
                                           filename_suffix=filename_suffix)
        self._event_pb2 = tb("compat.proto.event_pb2")
        self._summary_pb2 = tb("compat.proto.summary_pb2")
        self._closed = False

    # -- events
    def add_event(self, event: Any) -> None:
        if self._closed:
            raise RuntimeError(f"SummaryWriter for {self.log_dir!r} is closed")
        self._writer.add_event(event)

    def add_summary(self, summary: Any, step: int, walltime: Optional[float] = None) -> None:
        event = self._event_pb2.Event(wall_time=time.time() if walltime is None else walltime, step=int(step))
        event.summary.CopyFrom(summary)
        self.add_event(event)

    # -- data
    def add_scalar(self, tag: str, value: Any, step: int, *, walltime: Optional[float] = None,
                   description: Optional[str] = None) -> None:
        """One point of the curve ``tag``."""
        data = as_numpy(value)
        if data.size != 1:
            raise ValueError(f"add_scalar({tag!r}): expected one value, got shape {data.shape}")
        scalar_pb = tb("plugins.scalar.summary_v2").scalar_pb
        self.add_summary(scalar_pb(tag, float(data.reshape(())), description=description), step, walltime)

    def add_histogram(self, tag: str, values: Any, step: int, *, buckets: Optional[int] = None,
                      walltime: Optional[float] = None, description: Optional[str] = None) -> None:
        """The distribution of ``values`` (TensorBoard's histogram and distribution dashboards)."""
        histogram_pb = tb("plugins.histogram.summary_v2").histogram_pb
        data = as_numpy(values).astype(np.float64).ravel()
        self.add_summary(histogram_pb(tag, data, buckets=buckets, description=description), step, walltime)

    def add_text(self, tag: str, text: str, step: int, *, walltime: Optional[float] = None) -> None:
        text_pb = tb("plugins.text.summary_v2").text_pb
        self.add_summary(text_pb(tag, text), step, walltime)

    def add_images(self, tag: str, images: Any, step: int, *, max_outputs: int = 3,
                   walltime: Optional[float] = None, description: Optional[str] = None) -> None:
        """A batch ``[k, h, w, c]`` (c = 1, 3 or 4; floats in [0, 1] or uint8) as PNG images.

        Written as TensorFlow's image summary is (a string tensor: width, height, PNGs), with
        Pillow encoding the PNGs.
        """
        batch = as_numpy(images)
        if batch.ndim != 4 or batch.shape[-1] not in (1, 3, 4):
            raise ValueError(f"add_images({tag!r}): expected [k, h, w, c] with c in 1, 3, 4; got {batch.shape}")
        try:
            from PIL import Image
        except ImportError:
            raise ImportError("add_images encodes PNGs with Pillow: pip install Pillow") from None
        if batch.dtype != np.uint8:
            batch = (np.clip(batch.astype(np.float64), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)
        pngs = []
        for img in batch[:max_outputs]:
            buf = io.BytesIO()
            Image.fromarray(img[:, :, 0] if img.shape[-1] == 1 else img).save(buf, format="PNG")
            pngs.append(buf.getvalue())
        tensor_pb2 = tb("compat.proto.tensor_pb2")
        shape_pb2 = tb("compat.proto.tensor_shape_pb2")
        types_pb2 = tb("compat.proto.types_pb2")
        tensor = tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING,
            tensor_shape=shape_pb2.TensorShapeProto(dim=[shape_pb2.TensorShapeProto.Dim(size=2 + len(pngs))]),
            string_val=[str(batch.shape[2]).encode(), str(batch.shape[1]).encode()] + pngs)
        meta = tb("plugins.image.metadata").create_summary_metadata(display_name=tag, description=description or "")
        summary = self._summary_pb2.Summary()
        summary.value.add(tag=tag, tensor=tensor, metadata=meta)
        self.add_summary(summary, step, walltime)

    def add_image(self, tag: str, image: Any, step: int, *, dataformats: str = "HWC", **kwargs: Any) -> None:
        """One image, ``HWC``, ``CHW`` or ``HW``."""
        img = as_numpy(image)
        if dataformats == "CHW":
            img = np.moveaxis(img, 0, -1)
        elif dataformats == "HW":
            img = img[:, :, None]
        elif dataformats != "HWC":
            raise ValueError(f"add_image: dataformats must be HWC, CHW or HW, got {dataformats!r}")
        self.add_images(tag, img[None], step, **kwargs)

    # -- graphs
    def add_graph(self, graph: Any, *, before_passes: bool = True, n_outputs: Optional[int] = None,
                  update_names: Sequence[str] = (), expand_fused: bool = True) -> Any:
        """The graph cgvm runs, for the graph dashboard; returns the builder of the graph written.

        ``graph`` is a compiled function (cgvm.compile, theano.function, a Caffe solver's or a
        Keras model's step): its graph after the passes becomes the run's graph and, with
        ``before_passes``, the graph as written becomes the op graph of tag "before_passes"
        (pick it in the dashboard's Tag menu). An IR Graph is written as given.
        """
        if isinstance(graph, Graph):
            builder = GraphDefBuilder(graph, n_outputs=n_outputs, update_names=update_names,
                                      expand_fused=expand_fused)
            self.add_graph_def(builder.out)
            return builder
        g = function_graphs(graph)
        builder = GraphDefBuilder(g.graph, n_outputs=g.n_outputs, update_names=g.update_names,
                                  expand_fused=expand_fused, param_labels=g.param_labels)
        self.add_graph_def(builder.out)
        if before_passes:
            source = GraphDefBuilder(g.source, n_outputs=g.n_outputs, update_names=g.update_names,
                                     param_labels=g.param_labels)
            self.add_graph_def(source.out, tag=BEFORE_PASSES_TAG)
        return builder

    def add_graph_def(self, graph_def: Any, *, tag: Optional[str] = None, step: int = 0) -> None:
        """A GraphDef as the run's graph (``tag`` None) or as the op graph of ``tag``."""
        if tag is None:
            self.add_event(self._event_pb2.Event(wall_time=time.time(), step=int(step),
                                                 graph_def=graph_def.SerializeToString()))
            return
        config_pb2 = tb("compat.proto.config_pb2")
        run_metadata = config_pb2.RunMetadata()
        run_metadata.function_graphs.add().pre_optimization_graph.CopyFrom(graph_def)
        self._add_blob_summary(tag, run_metadata.SerializeToString(), "graph_run_metadata_graph", step)

    def add_run_metadata(self, tag: str, run_metadata: Any, step: int = 0,
                         graph_def: Optional[Any] = None) -> None:
        """Per-node times (``RunMetadata.step_stats``) the graph dashboard colours nodes by; with
        ``graph_def`` the graph rides along (tag shows as op graph and profile)."""
        if graph_def is not None:
            run_metadata.function_graphs.add().pre_optimization_graph.CopyFrom(graph_def)
            self._add_blob_summary(tag, run_metadata.SerializeToString(), "graph_run_metadata", step)
            return
        event = self._event_pb2.Event(wall_time=time.time(), step=int(step))
        event.tagged_run_metadata.tag = tag
        event.tagged_run_metadata.run_metadata = run_metadata.SerializeToString()
        self.add_event(event)

    def add_keras_model(self, model_json: str, *, tag: str = "keras", step: int = 0) -> None:
        """A Keras model config (``model.to_json()``): the dashboard's conceptual graph."""
        self._add_blob_summary(tag, model_json.encode(), "graph_keras_model", step)

    def _add_blob_summary(self, tag: str, blob: bytes, plugin: str, step: int) -> None:
        tensor_pb2 = tb("compat.proto.tensor_pb2")
        types_pb2 = tb("compat.proto.types_pb2")
        meta = self._summary_pb2.SummaryMetadata(
            plugin_data=self._summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin, content=b"1"))
        summary = self._summary_pb2.Summary()
        summary.value.add(tag=tag, metadata=meta,
                          tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[blob]))
        self.add_summary(summary, step)

    # -- lifetime
    def flush(self) -> None:
        if not self._closed:
            self._writer.flush()

    def close(self) -> None:
        if not self._closed:
            self._writer.close()
            self._closed = True

    def __enter__(self) -> "SummaryWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
