"""Errors of the ONNX frontend: every one names the file, and the node and op where there is one."""
from __future__ import annotations

from typing import Optional

from cgvm.errors import GraphBuildError, SerializationError


class OnnxImportError(GraphBuildError):
    """An ONNX model cannot be translated: unknown op or domain, an opset newer than supported, an
    attribute or input that does not fit the op, an initializer whose data disagrees with its shape."""


class OnnxFileError(OnnxImportError, SerializationError):
    """An ONNX file cannot be read: missing, malformed or truncated, or external data missing."""


class OnnxExportError(GraphBuildError):
    """A cgvm graph cannot be written as ONNX (an op without an ONNX lowering, an unknown shape)."""


def node_where(node, model_name: Optional[str] = None) -> str:
    """``node 'conv1' (op Conv, #3)`` as an error names an ONNX NodeProto."""
    op = node.op_type if not node.domain or node.domain == "ai.onnx" else f"{node.domain}.{node.op_type}"
    name = f"node {node.name!r} " if node.name else ""
    out = f", output {node.output[0]!r}" if len(node.output) and node.output[0] else ""
    where = f" in {model_name}" if model_name else ""
    return f"{name}(op {op}{out}){where}"
