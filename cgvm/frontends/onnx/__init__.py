"""The ONNX frontend: import ONNX models into cgvm IR (``load``), run ONNX's backend test suite
(``backend``), and write cgvm graphs as ONNX (``export``). Needs the ``onnx`` package (the onnx extra).

    import cgvm.onnx
    model = cgvm.onnx.load("model.onnx")           # float initializers -> Workspace parameters
    y = model(x)
    cgvm.onnx.export(fn, "out.onnx")               # a compiled Function, caffe.Net, Keras model, ...
"""
from .errors import OnnxExportError, OnnxFileError, OnnxImportError
from .model import OnnxModel, load
from .translate import MAX_OPSET, supported_ops


def export(obj, path=None, **kwargs):
    """Write ``obj`` (a compiled cgvm Function, a cgvm.caffe.Net, a Keras-style model, a Theano-style
    function, or a cgvm Graph) as an ONNX model; returns the ModelProto (see cgvm.frontends.onnx.export)."""
    from .export import export as _export

    return _export(obj, path, **kwargs)


__all__ = ["load", "export", "OnnxModel", "OnnxImportError", "OnnxFileError", "OnnxExportError", "MAX_OPSET",
           "supported_ops"]
