"""``caffe.proto.caffe_pb2``: the generated protobuf classes of cgvm's caffe.proto."""
from cgvm.frontends.caffe import caffe_pb2  # noqa: F401

__all__ = ["caffe_pb2"]
