"""ONNX function ops (Attention, RMSNormalization, RotaryEmbedding, CenterCropPad, window functions,
...) without a cgvm rule of their own, expanded into the function body the ONNX standard defines for
them (``onnx.defs`` schemas, context-dependent ones built for the node's input types), then
translated node by node like any graph. ONNX Runtime does the same for ops it has no kernel for.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from cgvm.ir import Value

from .errors import OnnxImportError, node_where


def _schema(op_type: str, opset: int, domain: str = ""):
    import onnx.defs

    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except Exception:
        return None


def has_function(op_type: str, opset: int, domain: str = "") -> bool:
    s = _schema(op_type, opset, domain)
    return s is not None and (s.has_function or s.has_context_dependent_function)


def _type_proto(v: Optional[Value]) -> bytes:
    import onnx
    import onnx.helper

    tp = onnx.TypeProto()
    if v is None:
        return tp.SerializeToString()
    tt = tp.tensor_type
    tt.elem_type = onnx.helper.np_dtype_to_tensor_dtype(v.dtype.np)
    for d in v.shape:
        dim = tt.shape.dim.add()
        if d is not None:
            dim.dim_value = int(d)
    return tp.SerializeToString()


def function_body(node: Any, opset: int, inputs: Sequence[Optional[Value]], file: Optional[str]) -> Any:
    """The FunctionProto that defines ``node``'s op at ``opset`` for these inputs."""
    import onnx

    s = _schema(node.op_type, opset, node.domain or "")
    if s is None:
        raise OnnxImportError(f"{node_where(node, file)}: op {node.op_type} is not supported by cgvm's ONNX frontend")
    fn = onnx.FunctionProto()
    if s.has_function:
        body = s.get_function_with_opset_version(opset) if s.function_opset_versions else None
        if body is None:
            body = s.function_body.SerializeToString()
        fn.ParseFromString(body if isinstance(body, bytes) else body.SerializeToString())
    else:
        versions = [v for v in s.context_dependent_function_opset_versions if v <= opset]
        use = max(versions) if versions else opset
        data = s.get_context_dependent_function_with_opset_version(
            use, node.SerializeToString(), [_type_proto(v) for v in inputs])
        if not data:
            raise OnnxImportError(f"{node_where(node, file)}: ONNX defines no function body of {node.op_type} for "
                                  "these input types")
        fn.ParseFromString(data)
    return fn


def bind_attributes(fn: Any, node: Any) -> List[Any]:
    """The function's nodes with attribute references (``ref_attr_name``) replaced by the caller's
    attributes, or the function's defaults, or dropped (the op's own default then applies)."""
    import onnx

    given = {a.name: a for a in node.attribute}
    defaults = {a.name: a for a in fn.attribute_proto}
    out = []
    for n in fn.node:
        m = onnx.NodeProto()
        m.CopyFrom(n)
        del m.attribute[:]
        for a in n.attribute:
            if a.ref_attr_name:
                src = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if src is None:
                    continue
                b = m.attribute.add()
                b.CopyFrom(src)
                b.name = a.name
            else:
                m.attribute.add().CopyFrom(a)
        out.append(m)
    return out


__all__ = ["has_function", "function_body", "bind_attributes", "np"]
