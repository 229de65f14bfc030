"""Caffe frontend: prototxt and caffemodel reading, legacy upgrades, net filtering, converters."""
