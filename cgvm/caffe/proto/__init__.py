"""``caffe.proto.caffe_pb2``: the generated protobuf classes of cgvm's caffe.proto.

``import cgvm.caffe.proto.caffe_pb2`` works as a module path too (the module is registered
under that name; the classes are those of cgvm/frontends/caffe/caffe_pb2.py)."""
import sys as _sys

from cgvm.frontends.caffe import caffe_pb2  # noqa: F401

_sys.modules[__name__ + ".caffe_pb2"] = caffe_pb2

__all__ = ["caffe_pb2"]
