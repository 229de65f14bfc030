"""keras.callbacks.TensorBoard: Keras 3's runs and tags, read back with TensorBoard's EventAccumulator and
compared with what fit returned; weight paths compared with real Keras 3's (torch backend)."""
from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.compat.proto import config_pb2  # noqa: E402
from tensorboard.util import tensor_util  # noqa: E402

import cgvm.keras as keras  # noqa: E402

RNG = np.random.default_rng(5)
X = RNG.standard_normal((64, 4)).astype(np.float32)
Y = (X[:, 0] + X[:, 1] > 0).astype(np.int64)


def read(path) -> EventAccumulator:
    ea = EventAccumulator(str(path), size_guidance={"tensors": 0})
    ea.Reload()
    return ea


def values(ea, tag):
    return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in ea.Tensors(tag)]


def _model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_fit_writes_keras_runs_and_tags(tmp_path):
    model = _model()
    batches = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: batches.append(dict(logs)))
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch: 0.1 / (epoch + 1))
    board = keras.callbacks.TensorBoard(tmp_path, histogram_freq=1, write_images=True, update_freq=2,
                                        profile_batch=(2, 3))
    hist = model.fit(X, Y, batch_size=16, epochs=3, validation_split=0.25, verbose=0,
                     callbacks=[schedule, record, board]).history
    assert sorted(os.listdir(tmp_path)) == ["train", "validation"]
    train, val = read(tmp_path / "train"), read(tmp_path / "validation")

    # epoch_ scalars: one per epoch, equal to fit's history; the learning rate of each epoch
    for name in ("loss", "accuracy"):
        assert values(train, f"epoch_{name}") == [(e, pytest.approx(v, rel=1e-6)) for e, v in enumerate(hist[name])]
        assert values(val, f"epoch_{name}") == [(e, pytest.approx(v, rel=1e-6))
                                                for e, v in enumerate(hist[f"val_{name}"])]
    assert values(train, "epoch_learning_rate") == [(e, pytest.approx(0.1 / (e + 1))) for e in range(3)]
    # batch_ scalars every 2 global batches (3 per epoch: batches 1..9), the running means fit reported
    assert [s for s, _ in values(train, "batch_loss")] == [2, 4, 6, 8]
    assert [v for _, v in values(train, "batch_loss")] == pytest.approx([batches[s - 1]["loss"] for s in (2, 4, 6, 8)])
    # validation after each epoch, at the optimizer's iteration count
    assert values(val, "evaluation_loss_vs_iterations") == [(3 * (e + 1), pytest.approx(v, rel=1e-6))
                                                            for e, v in enumerate(hist["val_loss"])]

    # weight histograms and images under Keras' weight paths, the last one of the final weights
    weights = {f"{model.name}/{layer.name}/{w.name}": w.numpy() for layer in model.layers for w in layer.weights}
    tags = train.Tags()["tensors"]
    assert {t[:-len("/histogram")] for t in tags if t.endswith("/histogram")} == set(weights)
    for path, w in weights.items():
        events = train.Tensors(f"{path}/histogram")
        assert [e.step for e in events] == [0, 1, 2]
        h = tensor_util.make_ndarray(events[-1].tensor_proto)
        assert h[:, 2].sum() == w.size
        assert h[0, 0] == pytest.approx(w.min(), rel=1e-6) and h[-1, 1] == pytest.approx(w.max(), rel=1e-6)
    kernel_png = train.Tensors(f"{model.name}/{model.layers[0].name}/kernel/image")[-1].tensor_proto.string_val
    from PIL import Image
    assert Image.open(io.BytesIO(kernel_png[2])).size == (8, 4)   # a (4, 8) kernel: 4 rows of 8

    # the graph: the training step after the passes, with layer scopes, gradients and updates
    graph = train.Graph()
    names = [n.name for n in graph.node]
    assert all(any(n.startswith(f"{layer.name}/") for n in names) for layer in model.layers)
    assert any(n.startswith("loss/") for n in names) and any(n.startswith("accuracy/") for n in names)
    assert any(n.startswith("gradients/") for n in names) and any(n.startswith("updates/") for n in names)
    step_fn = next(hit[0] for key, hit in model._functions.items() if key[0] is True)
    plain = [n for n in step_fn.graph.nodes if n.op.name not in ("fused_elementwise", "conv_bias_act",
                                                                 "gemm_bias_act", "gemm_accumulate")]
    assert len([n for n in graph.node if n.op not in ("Input", "Parameter", "Const")]) >= len(plain)
    conceptual = train.Tensors("keras")[0].tensor_proto.string_val[0]
    assert json.loads(conceptual) == json.loads(model.to_json())

    # the profile of batches 2 and 3: per-node times on the graph, and a Chrome trace
    meta = config_pb2.RunMetadata.FromString(train.Tensors("batch_3")[0].tensor_proto.string_val[0])
    stat_names = {s.node_name for s in meta.step_stats.dev_stats[0].node_stats}
    assert stat_names and stat_names <= {n.name for n in meta.function_graphs[0].pre_optimization_graph.node}
    trace = json.load(open(tmp_path / "train" / "profile_batch_3.trace.json"))["traceEvents"]
    assert [e["name"] for e in trace if e.get("cat") == "step"] == ["batch 2", "batch 3"]
    (frame,) = step_fn.executable.frames.values()   # one signature: the program it specialized to
    assert len([e for e in trace if e.get("ph") == "X"]) == 2 + 2 * frame.program.n_calls


def test_weight_paths_are_real_keras_paths():
    os.environ.setdefault("KERAS_BACKEND", "torch")
    real = pytest.importorskip("keras")
    pytest.importorskip("torch")
    ref = real.Sequential([real.Input((4,)), real.layers.Dense(8, activation="relu"), real.layers.Dense(2)])
    ours = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    ours.compile("sgd", "mse")
    board = keras.callbacks.TensorBoard("unused")
    board.model = ours
    ours_paths = [p for p, _, _ in board._weight_paths()]
    # layer names count up per session; compare the paths with the layer names in them replaced
    ref_paths = [w.path for layer in ref.layers for w in layer.weights]
    rename = lambda paths, layers: [p.replace(f"/{l.name}/", f"/L{i}/") for p in paths  # noqa: E731
                                    for i, l in enumerate(layers) if f"/{l.name}/" in p]
    assert [p.split("/", 1)[1] for p in rename(ours_paths, ours.layers)] == \
        [p.split("/", 1)[1] for p in rename(ref_paths, ref.layers)]
    assert all(p.startswith(f"{ours.name}/") for p in ours_paths) and all(p.startswith(f"{ref.name}/")
                                                                          for p in ref_paths)


def test_embeddings_for_the_projector(tmp_path):
    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 4),
                              keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = RNG.integers(0, 10, (16, 3))
    model.fit(x, RNG.standard_normal((16, 1)).astype(np.float32), epochs=2, verbose=0,
              callbacks=[keras.callbacks.TensorBoard(tmp_path, embeddings_freq=1, write_graph=False)])
    from google.protobuf import text_format
    from tensorboard.plugins.projector.projector_config_pb2 import ProjectorConfig

    config = text_format.Parse(open(tmp_path / "projector_config.pbtxt").read(), ProjectorConfig())
    (entry,) = config.embeddings
    layer = model.layers[0]
    assert entry.tensor_name == f"{model.name}/{layer.name}/embeddings"
    table = np.loadtxt(tmp_path / entry.tensor_path, delimiter="\t")
    np.testing.assert_allclose(table, layer.weights[0].numpy(), rtol=1e-6)


def test_bad_arguments_as_keras_says():
    with pytest.raises(ValueError, match="profile_batch must be a non-negative integer"):
        keras.callbacks.TensorBoard(profile_batch=(3, 1))
    with pytest.raises(ValueError, match="profile_batch"):
        keras.callbacks.TensorBoard(profile_batch="a,b")
    with pytest.raises(ValueError, match="update_freq"):
        keras.callbacks.TensorBoard(update_freq="sometimes")


def test_steps_per_second_every_batch(tmp_path):
    model = _model()
    model.fit(X, Y, batch_size=32, epochs=2, verbose=0,
              callbacks=[keras.callbacks.TensorBoard(tmp_path, write_steps_per_second=True, update_freq="batch",
                                                     write_graph=False)])
    train = read(tmp_path / "train")
    assert [s for s, _ in values(train, "batch_steps_per_second")] == [1, 2, 3, 4]
    assert [s for s, _ in values(train, "epoch_steps_per_second")] == [0, 1]
    assert all(v > 0 for _, v in values(train, "epoch_steps_per_second"))
    assert "keras" not in train.Tags()["tensors"] and not train.Tags()["graph"]
