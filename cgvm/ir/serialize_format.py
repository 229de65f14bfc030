"""What the writer and the reader of serialized graphs agree on: the format version, how value kinds
and array dtypes are stored, and how an error is placed in the graph.

Helpers of both directions raise ``SerializationError`` with a message about the thing at hand;
callers that know the context (graph, node, attribute) catch it and prefix that with ``located``,
so no location text is built unless something is wrong.
"""
from __future__ import annotations

from ..errors import SerializationError
from . import cgvm_pb2 as pb
from .graph import CONST, INPUT, NODE, PARAM

#: the GraphProto.format_version written; reading accepts this one and older ones
FORMAT_VERSION = 1

KIND_TO_PROTO = {INPUT: pb.ValueProto.INPUT, PARAM: pb.ValueProto.PARAM, CONST: pb.ValueProto.CONST,
                 NODE: pb.ValueProto.NODE}
KIND_FROM_PROTO = {v: k for k, v in KIND_TO_PROTO.items()}
ARRAY_KINDS = "biufc"  # bool, signed, unsigned, float, complex: fixed-size numbers only


def storable(dtype) -> bool:
    """Whether arrays of NumPy ``dtype`` can be saved: numbers and bools, and the narrow storage
    formats the IR knows (bfloat16, float8, int4, ... from ml_dtypes)."""
    from .types import _STORAGE_KINDS

    return dtype.kind in ARRAY_KINDS or dtype.name in _STORAGE_KINDS


def located(prefix: str, exc: SerializationError) -> SerializationError:
    """``exc`` with ``prefix`` (where it happened) in front of its message."""
    return SerializationError(f"{prefix}: {exc}")
