"""Caffe frontend: prototxt and caffemodel reading, legacy upgrades, net filtering, converters."""
from cgvm.frontends.caffe.graph_export import graph_from_prototxt  # noqa: E402,F401  (cgvm info/compile hook)
