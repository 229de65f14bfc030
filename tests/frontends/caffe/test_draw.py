"""caffe.draw: DOT text always (no dependency); PNG/SVG only where Graphviz's `dot` is installed."""
from __future__ import annotations

import os

import pytest

from cgvm.frontends.caffe import caffe_pb2, draw
from cgvm.frontends.caffe.errors import CaffeError
from cgvm.frontends.caffe.prototxt import read_net

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "models")
LENET = os.path.join(MODELS, "lenet", "lenet_train_test.prototxt")


def test_dot_source_has_layers_blobs_and_params():
    net = read_net(LENET)
    text = draw.get_dot_source(net, "TB", display_lrm=True)
    assert text.startswith('digraph "LeNet" {') and "rankdir=TB" in text
    assert '"blob_data"' in text and "shape=octagon" in text
    assert "conv1\\n(Convolution)\\nkernel size: 5\\nstride: 1\\npad: 0\\nlr mult: 1, 2" in text
    assert "pool MAX" in text
    # relu1 rewrites ip1 in place: a second ip1 node keeps the drawing acyclic
    assert '"layer_7_relu1" -> "blob_ip1_1"' in text


def test_phase_filter():
    net = read_net(LENET)
    train = draw.get_dot_source(net, phase=caffe_pb2.TRAIN)
    test = draw.get_dot_source(net, phase=caffe_pb2.TEST)
    assert "(Accuracy)" not in train and "(Accuracy)" in test
    assert train.count("(Data)") == 1 and draw.get_dot_source(net).count("(Data)") == 2


def test_draw_to_dot_file(tmp_path):
    out = tmp_path / "lenet.dot"
    draw.draw_net_to_file(read_net(LENET), str(out))
    assert out.read_text().startswith("digraph")


@pytest.mark.skipif(draw.can_render(), reason="Graphviz's dot is installed here")
def test_png_without_dot_says_what_to_install(tmp_path):
    with pytest.raises(CaffeError, match="needs Graphviz's `dot` program"):
        draw.draw_net_to_file(read_net(LENET), str(tmp_path / "lenet.png"))


@pytest.mark.skipif(not draw.can_render(), reason="Graphviz's dot is not installed")
@pytest.mark.parametrize("ext,magic", [("png", b"\x89PNG"), ("svg", b"<?xml")])
def test_render_with_dot(tmp_path, ext, magic):
    out = tmp_path / f"lenet.{ext}"
    draw.draw_net_to_file(read_net(LENET), str(out))
    assert out.read_bytes().startswith(magic)
