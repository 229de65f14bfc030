"""Reading and writing Caffe text and binary files; errors that point at the offending text."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from cgvm.errors import CgvmError
from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeParseError
from cgvm.frontends.caffe.prototxt import (
    blobproto_shape, describe_fork_extension, net_to_text, parse_net_text, parse_solver_text,
    read_blobproto, read_net, read_net_binary, read_net_with_lines, read_solver, read_solver_state, write_blobproto,
    write_net_binary, write_net_text, write_solver_state,
)
from shared_paths import SHARED_CAFFE_MODELS

MODELS = SHARED_CAFFE_MODELS
needs_models = pytest.mark.skipif(not MODELS.is_dir(), reason="shared/models/caffe not present")
NET_FILES = sorted(p for p in MODELS.glob("*/*.prototxt") if "solver" not in p.name) if MODELS.is_dir() else []
SOLVER_FILES = sorted(MODELS.glob("*/*solver*.prototxt")) if MODELS.is_dir() else []


# ---------------------------------------------------------------------------------------------
# A protobuf wire encoder written from BVLC's field numbers, independent of the protobuf library
# ---------------------------------------------------------------------------------------------

def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def length_delimited(field: int, payload: bytes) -> bytes:
    return tag(field, 2) + varint(len(payload)) + payload


def string(field: int, text: str) -> bytes:
    return length_delimited(field, text.encode("utf-8"))


def uint(field: int, value: int) -> bytes:
    return tag(field, 0) + varint(value)


def packed_floats(field: int, values) -> bytes:
    return length_delimited(field, struct.pack(f"<{len(values)}f", *values))


def unpacked_floats(field: int, values) -> bytes:  # what writers without [packed] produced
    return b"".join(tag(field, 5) + struct.pack("<f", v) for v in values)


def blob_with_shape(values: np.ndarray, packed: bool = True) -> bytes:
    # BlobProto: data = 5, shape = 7; BlobShape: dim = 1 (packed int64)
    shape = length_delimited(1, b"".join(varint(d) for d in values.shape))
    floats = values.ravel().tolist()
    data = packed_floats(5, floats) if packed else unpacked_floats(5, floats)
    return data + length_delimited(7, shape)


def legacy_blob(values: np.ndarray) -> bytes:
    # BlobProto: num = 1, channels = 2, height = 3, width = 4, data = 5
    num, channels, height, width = values.shape
    return (uint(1, num) + uint(2, channels) + uint(3, height) + uint(4, width)
            + packed_floats(5, values.ravel().tolist()))


def v2_layer(name: str, type_name: str, bottoms, tops, blobs) -> bytes:
    # LayerParameter: name = 1, type = 2, bottom = 3, top = 4, blobs = 7
    body = string(1, name) + string(2, type_name)
    body += b"".join(string(3, b) for b in bottoms) + b"".join(string(4, t) for t in tops)
    body += b"".join(length_delimited(7, blob) for blob in blobs)
    return length_delimited(100, body)  # NetParameter.layer = 100


RNG = np.random.default_rng(7)
CONV_W = RNG.standard_normal((4, 1, 3, 3)).astype(np.float32)
CONV_B = RNG.standard_normal(4).astype(np.float32)
IP_W = RNG.standard_normal((2, 36)).astype(np.float32)


def handmade_caffemodel() -> bytes:
    return (string(1, "tiny")  # NetParameter.name = 1
            + v2_layer("data", "Input", [], ["data"], [])
            + v2_layer("conv1", "Convolution", ["data"], ["conv1"],
                       [blob_with_shape(CONV_W), blob_with_shape(CONV_B, packed=False)])
            + v2_layer("fc", "InnerProduct", ["conv1"], ["fc"], [blob_with_shape(IP_W)]))


def blob_array(blob: caffe_pb2.BlobProto) -> np.ndarray:
    return np.asarray(blob.data, dtype=np.float32).reshape(blobproto_shape(blob))


# ---------------------------------------------------------------------------------------------
# Real nets
# ---------------------------------------------------------------------------------------------

@needs_models
@pytest.mark.parametrize("path", NET_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_net_parses_and_upgrades_to_v2(path):
    raw = read_net(path, upgrade=False)
    assert raw.name
    net = read_net(path)
    assert len(net.layer) > 0 and len(net.layers) == 0 and len(net.input) == 0
    assert all(layer.name and layer.type for layer in net.layer)
    assert read_net(str(path)) == net  # a str path works as well as a Path


@needs_models
@pytest.mark.parametrize("path", SOLVER_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_solver_parses(path):
    solver = read_solver(path)
    assert solver.base_lr > 0 and solver.lr_policy
    assert solver.type in {"SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"}
    assert not solver.HasField("solver_type")


@needs_models
def test_known_contents_of_lenet():
    net = read_net(MODELS / "lenet" / "lenet_train_test.prototxt")
    assert [layer.name for layer in net.layer] == [
        "mnist", "mnist", "conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2",
        "accuracy", "loss"]
    conv1 = net.layer[2]
    assert conv1.convolution_param.num_output == 20
    assert list(conv1.convolution_param.kernel_size) == [5]
    assert [p.lr_mult for p in conv1.param] == [1.0, 2.0]
    assert net.layer[0].include[0].phase == caffe_pb2.TRAIN
    assert net.layer[0].transform_param.scale == pytest.approx(0.00390625)
    assert net.layer[0].data_param.backend == caffe_pb2.DataParameter.LMDB


# ---------------------------------------------------------------------------------------------
# Binary files
# ---------------------------------------------------------------------------------------------

def test_handmade_caffemodel_loads_names_and_values(tmp_path):
    path = tmp_path / "tiny.caffemodel"
    path.write_bytes(handmade_caffemodel())
    net = read_net_binary(path)
    assert net.name == "tiny"
    assert [(l.name, l.type) for l in net.layer] == [
        ("data", "Input"), ("conv1", "Convolution"), ("fc", "InnerProduct")]
    conv1, fc = net.layer[1], net.layer[2]
    np.testing.assert_array_equal(blob_array(conv1.blobs[0]), CONV_W)
    np.testing.assert_array_equal(blob_array(conv1.blobs[1]), CONV_B)  # unpacked floats load too
    np.testing.assert_array_equal(blob_array(fc.blobs[0]), IP_W)
    assert read_net_binary(handmade_caffemodel()) == net  # bytes work as well as a path


def test_legacy_v1_caffemodel_with_4d_blob_shapes_is_upgraded():
    weights = RNG.standard_normal((1, 1, 2, 36)).astype(np.float32)  # old InnerProduct layout
    # V1LayerParameter: bottom = 2, top = 3, name = 4, type = 5 (enum), blobs = 6, blobs_lr = 7
    v1 = (string(4, "fc") + uint(5, caffe_pb2.V1LayerParameter.INNER_PRODUCT)
          + string(2, "data") + string(3, "fc") + length_delimited(6, legacy_blob(weights))
          + unpacked_floats(7, [1.0]))
    data = string(1, "old") + string(3, "data") + length_delimited(2, v1)  # input = 3, layers = 2
    net = read_net_binary(data)
    assert [(l.name, l.type) for l in net.layer] == [("fc", "InnerProduct")]
    assert blobproto_shape(net.layer[0].blobs[0]) == (1, 1, 2, 36)
    np.testing.assert_array_equal(blob_array(net.layer[0].blobs[0]), weights)
    assert net.layer[0].param[0].lr_mult == 1.0
    assert len(net.input) == 0  # an input without shapes is simply dropped
    raw = read_net_binary(data, upgrade=False)
    assert raw.layers[0].type == caffe_pb2.V1LayerParameter.INNER_PRODUCT


def test_truncated_caffemodel_never_loads_half_a_layer():
    data = handmade_caffemodel()
    complete = read_net_binary(data, upgrade=False)
    for cut in range(1, len(data)):
        try:
            partial = read_net_binary(data[:cut], upgrade=False)
        except CaffeParseError as error:
            assert error.filename == "<bytes>"
            continue
        # Protobuf cannot tell a cut between two whole layers from a shorter file; all that
        # may come back then is whole layers.
        assert list(partial.layer) == list(complete.layer[:len(partial.layer)]), cut


def test_corrupt_and_wrong_kind_of_binary_files_are_reported(tmp_path):
    empty = tmp_path / "empty.caffemodel"
    empty.write_bytes(b"")
    with pytest.raises(CaffeParseError, match="empty"):
        read_net_binary(empty)
    hdf5 = tmp_path / "w.caffemodel.h5"
    hdf5.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\x00" * 64)
    with pytest.raises(CaffeParseError, match="HDF5"):
        read_net_binary(hdf5)
    with pytest.raises(CaffeParseError, match="text file"):
        read_net_binary(b'name: "x"\nlayer { name: "a" }\n')
    bad_length = string(1, "x") + tag(100, 2) + varint(1 << 20) + b"\x0a\x01a"
    with pytest.raises(CaffeParseError, match="truncated or corrupt"):
        read_net_binary(bad_length)
    with pytest.raises(FileNotFoundError, match="missing.caffemodel"):
        read_net_binary(tmp_path / "missing.caffemodel")


def test_blob_data_that_does_not_fit_its_shape_names_the_layer():
    short = length_delimited(7, length_delimited(1, varint(4) + varint(9))) + packed_floats(5, [1.0] * 35)
    data = v2_layer("conv1", "Convolution", [], ["c"], [short])
    with pytest.raises(CaffeParseError, match=r'"conv1" blob 0: shape \(4, 9\) needs 36 data values, '
                                              r"the file holds 35"):
        read_net_binary(data)


def test_net_with_blobs_round_trips_through_binary_and_text(tmp_path):
    net = caffe_pb2.NetParameter(name="rt")
    layer = net.layer.add(name="ip", type="InnerProduct", bottom=["x"], top=["y"])
    layer.inner_product_param.num_output = 3
    layer.param.add(lr_mult=1, decay_mult=1)
    layer.param.add(lr_mult=2, decay_mult=0)
    weights = layer.blobs.add()
    weights.shape.dim.extend([3, 2])
    weights.data.extend([0.5, -1.25, 3.0, 1e-7, -0.0, 42.0])
    bias = layer.blobs.add()
    bias.shape.dim.append(3)
    bias.double_data.extend([1.0 / 3, 2.0, 3.0])
    path = tmp_path / "rt.caffemodel"
    write_net_binary(net, path)
    assert path.read_bytes() == net.SerializeToString()
    assert read_net_binary(path) == net
    assert parse_net_text(net_to_text(net)) == net
    write_net_text(net, tmp_path / "rt.prototxt")
    assert read_net(tmp_path / "rt.prototxt") == net
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rt.caffemodel", "rt.prototxt"]  # no temp files


def test_blobproto_and_solverstate_round_trip(tmp_path):
    mean = caffe_pb2.BlobProto(num=1, channels=3, height=2, width=2)
    mean.data.extend(range(12))
    write_blobproto(mean, tmp_path / "mean.binaryproto")
    loaded = read_blobproto(tmp_path / "mean.binaryproto")
    assert blobproto_shape(loaded) == (1, 3, 2, 2) and list(loaded.data) == list(range(12))
    state = caffe_pb2.SolverState(iter=100, learned_net="x_iter_100.caffemodel", current_step=2)
    state.history.add().CopyFrom(mean)
    write_solver_state(state, tmp_path / "x.solverstate")
    assert read_solver_state(tmp_path / "x.solverstate") == state
    scalar = caffe_pb2.BlobProto(data=[2.5])  # no dims: a scalar of count 1
    assert read_blobproto(scalar.SerializeToString()).data == [2.5]


# ---------------------------------------------------------------------------------------------
# Text errors
# ---------------------------------------------------------------------------------------------

BROKEN_NET = """name: "broken"
layer {
  name: "conv1"
  type: "Convolution"
  convolution_param { num_output: 20 kernel_sise: 5 }
}
"""


def test_parse_error_gives_file_line_column_and_the_line():
    with pytest.raises(CaffeParseError) as caught:
        read_net(BROKEN_NET, filename="nets/broken.prototxt")
    error = caught.value
    assert isinstance(error, CgvmError)
    assert (error.filename, error.line, error.column) == ("nets/broken.prototxt", 5, 38)
    assert error.source_line == "  convolution_param { num_output: 20 kernel_sise: 5 }"
    text = str(error)
    assert text.startswith("nets/broken.prototxt:5:38: ")
    assert 'unknown field "kernel_sise" in caffe.ConvolutionParameter' in text
    assert 'did you mean "kernel_size"?' in text
    assert "  convolution_param { num_output: 20 kernel_sise: 5 }" in text
    caret_line = text.splitlines()[2]
    assert caret_line.index("^") == text.splitlines()[1].index("kernel_sise")


def test_parse_error_in_a_file_names_the_file(tmp_path):
    path = tmp_path / "net.prototxt"
    path.write_text('name: "x"\nlayer {\n  name: "a"\n  type: ReLU\n}\n')
    with pytest.raises(CaffeParseError) as caught:
        read_net(path)
    assert (caught.value.filename, caught.value.line, caught.value.column) == (str(path), 4, 9)
    assert 'write "ReLU"' in str(caught.value)


@pytest.mark.parametrize("field, origin", [
    ("multibox_loss_param { }", "SSD"),
    ("annotated_data_param { }", "SSD"),
    ("detection_evaluate_param { }", "SSD"),
    ("roi_pooling_param { pooled_h: 6 }", "Faster R-CNN"),
    ("bn_param { }", "BN"),
    ("interp_param { zoom_factor: 2 }", "Interp"),
    ("batch_renorm_param { }", "BatchReNorm"),
])
def test_fork_only_fields_are_named_and_attributed(field, origin):
    name = field.split()[0]
    with pytest.raises(CaffeParseError) as caught:
        parse_net_text(f'layer {{\n  name: "x"\n  {field}\n}}\n', "fork.prototxt")
    assert (caught.value.line, caught.value.column) == (3, 3)
    assert f'unknown field "{name}" in caffe.LayerParameter' in str(caught.value)
    assert "not BVLC Caffe" in str(caught.value) and origin in str(caught.value)


def test_fork_field_inside_a_bvlc_message_and_v1_spelling_in_v2_layer():
    with pytest.raises(CaffeParseError, match="non-inverted Dropout"):
        parse_net_text("layer { dropout_param { dropout_ratio: 0.5 scale_train: false } }")
    # ceil_mode is read (docs/caffe_forks.md)
    assert parse_net_text("layer { pooling_param { pool: MAX ceil_mode: false } }").layer[0].pooling_param.ceil_mode \
        is False
    with pytest.raises(CaffeParseError, match=r"param \{ lr_mult"):
        parse_net_text('layer { name: "c" blobs_lr: 1 }')


def test_python_layer_param_str_is_bvlc():
    net = parse_net_text('layer { type: "Python" python_param { module: "m" layer: "L" '
                         "param_str: \"{'k': 1}\" } }")
    assert net.layer[0].python_param.param_str == "{'k': 1}"
    assert describe_fork_extension("param_str") is None
    assert "SSD" in describe_fork_extension("Permute")


def test_other_text_errors():
    with pytest.raises(CaffeParseError, match="unknown value FOO for caffe.V1LayerParameter.LayerType"):
        parse_net_text("layers {\n  type: FOO\n}\n")
    with pytest.raises(CaffeParseError, match='multiple "name"'):
        parse_net_text('layer { name: "a" name: "b" }')
    with pytest.raises(CaffeParseError, match="ends inside a { } block") as caught:
        parse_net_text('layer {\n  name: "a"\n')
    assert caught.value.line is not None
    with pytest.raises(CaffeParseError, match="braces do not balance") as caught:
        parse_net_text('layer { type: "x" }}')
    assert (caught.value.line, caught.value.column) == (1, 20)
    with pytest.raises(CaffeParseError, match='"eval_type" is not BVLC Caffe.*SSD'):
        parse_solver_text('base_lr: 0.1 eval_type: "detection"', "solver.prototxt")
    with pytest.raises(CaffeParseError, match=r'missing required field.*layer\[0\]\.clip_param\.max '
                                              r'\(layer "clip"\)'):
        parse_net_text('layer { name: "clip" clip_param { min: 0 } }')


def test_read_net_tells_paths_from_text(tmp_path):
    assert read_net('name: "inline"').name == "inline"
    assert read_net("").layer == []  # empty text is an empty net
    with pytest.raises(FileNotFoundError, match="no_such.prototxt"):
        read_net("no_such.prototxt")
    binary = tmp_path / "w.caffemodel"
    binary.write_bytes(handmade_caffemodel())
    with pytest.raises(CaffeParseError, match="binary file"):
        read_net(binary)
    with_bom = tmp_path / "bom.prototxt"
    with_bom.write_bytes(b'\xef\xbb\xbfname: "bom"\n')
    assert read_net(with_bom).name == "bom"


def test_text_formats_seen_in_the_wild():
    net = parse_net_text("""
        # comment
        layer { name: 'single' type: "ReLU" include: { phase: TRAIN } }
        layer { name: "n" type: "Convolution" convolution_param { kernel_size: [3, 3] pad: 1 }
                param { lr_mult: 1. decay_mult: 1e-4 } loss_weight: .5 }
    """)
    assert net.layer[0].name == "single" and net.layer[0].include[0].phase == caffe_pb2.TRAIN
    assert list(net.layer[1].convolution_param.kernel_size) == [3, 3]
    assert net.layer[1].param[0].decay_mult == pytest.approx(1e-4)
    assert net.layer[1].loss_weight[0] == 0.5


def test_layer_source_lines_for_current_v1_v0_and_input_dim_nets():
    current = """name: "n"  # layer { in a comment }
layer { name: "a" type: "Input" top: "x"
        input_param { shape { dim: 1 } } }
layer {
  name: "weird{"  type: 'ReLU' bottom: "x" top: "y"
}
layer: { name: "b" type: "ReLU" bottom: "y" top: "z" include: { phase: TEST } }
"""
    net, lines = read_net_with_lines(current)
    assert [l.name for l in net.layer] == ["a", "weird{", "b"] and lines == [2, 4, 7]
    legacy = """input: "data"
input_dim: 1 input_dim: 3 input_dim: 8 input_dim: 8
layers { layer { name: "pad" type: "padding" pad: 1 } bottom: "data" top: "p" }
layers { layer { name: "conv" type: "conv" num_output: 2 kernelsize: 3 }
         bottom: "p" top: "c" }
layers {
  layer { name: "relu" type: "relu" } bottom: "c" top: "c" }
"""
    net, lines = read_net_with_lines(legacy)
    assert [l.name for l in net.layer] == ["input", "conv", "relu"] and lines == [1, 4, 6]


@needs_models
def test_layer_source_lines_of_a_shipped_v1_net():
    path = MODELS / "legacy_v1_lenet" / "lenet_train_test.prototxt"
    net, lines = read_net_with_lines(path)
    text = path.read_text().split("\n")
    assert len(lines) == len(net.layer)
    for layer, line in zip(net.layer, lines):
        assert text[line - 1].startswith("layers")
        assert f'name: "{layer.name}"' in text[line]
