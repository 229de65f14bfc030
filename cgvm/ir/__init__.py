"""The graph IR: types, values, nodes, graphs, building, verifying, printing, serializing."""
from .attrs import REQUIRED, Any_, Array, Bool, DTypeAttr, Float, Floats, GraphAttr, Int, Ints, Str
from .builder import apply, as_value, clone_node, rebuild
from .graph import (CONST, INPUT, NODE, PARAM, Graph, Node, Value, const_value, current_source,
                    input_value, param_value, source_scope, toposort, verify)
from .opschema import OPS, OpSchema, get_op
from .printer import format_graph
from .serialize import graph_to_proto, graph_from_proto, save_graph, load_graph
from .types import (DType, TensorType, bool_, float16, float32, float64, int8, int16, int32, int64,
                    result_dtype, uint8)

__all__ = [n for n in dir() if not n.startswith("_")]
