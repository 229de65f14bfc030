"""``cgvm.onnx.backend``: the onnx.backend.base protocol (prepare, run_model, run_node,
supports_device), so ONNX's own ``onnx.backend.test.BackendTest`` runs against cgvm.

A model is imported once in ``prepare`` (every op and initializer checked there), into a private
Workspace; ``rep.run`` translates and compiles per input signature (shapes, and the values of
inputs read as static) and caches the program.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

from cgvm.vm import Workspace

from .model import OnnxModel
from .translate import RULES, supported_ops


class CgvmRep(BackendRep):
    """A prepared model: ``run(inputs)`` returns the outputs as a namedtuple in graph-output order."""

    def __init__(self, model: OnnxModel):
        self.model = model

    def run(self, inputs: Any, **kwargs: Any) -> Tuple[Any, ...]:
        if isinstance(inputs, np.ndarray):
            inputs = [inputs]
        if isinstance(inputs, dict):
            outs = self.model.run(inputs)
        else:
            outs = self.model.run(list(inputs))
        # a sequence output is a list of arrays, an empty optional None (as onnxruntime returns them)
        return namedtupledict("Outputs", self.model.output_names)(
            *[o if o is None or isinstance(o, list) else np.asarray(o) for o in outs])


class CgvmBackend(Backend):
    """cgvm as an ONNX backend (CPU, and CUDA where CuPy is installed)."""

    @classmethod
    def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
        ops = supported_ops()
        return all(((n.domain or "") in ("", "ai.onnx") and n.op_type in ops) or (n.domain, n.op_type) in RULES
                   for n in model.graph.node)

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> CgvmRep:
        super().prepare(model, device, **kwargs)
        ws = Workspace(_backend_name(device))
        return CgvmRep(OnnxModel(model, workspace=ws))

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> Tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: Any, inputs: Any, device: str = "CPU", outputs_info: Optional[Sequence[Any]] = None,
                 **kwargs: Any) -> Tuple[Any, ...]:
        """One NodeProto on ``inputs`` (a list in the node's input order, or a name -> array dict)."""
        super().run_node(node, inputs, device=device, outputs_info=outputs_info)
        names = [i for i in node.input if i]
        arrays = [inputs[i] for i in names] if isinstance(inputs, dict) else list(inputs)
        graph_inputs = [onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(
            np.asarray(a).dtype), np.asarray(a).shape) for name, a in zip(names, arrays)]
        graph_outputs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
        graph = onnx.helper.make_graph([node], f"run_node_{node.op_type}", graph_inputs, graph_outputs)
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
        rep = CgvmRep(OnnxModel(model, workspace=Workspace(_backend_name(device))))
        return rep.run([np.asarray(a) for a in arrays])

    @classmethod
    def supports_device(cls, device: str) -> bool:
        d = Device(device)
        if d.type == DeviceType.CPU:
            return True
        if d.type == DeviceType.CUDA:
            from cgvm.backend import available_backends

            return "cupy" in available_backends()
        return False


def _backend_name(device: str) -> str:
    return "cupy" if Device(device).type == DeviceType.CUDA else "numpy"


prepare = CgvmBackend.prepare
run_model = CgvmBackend.run_model
run_node = CgvmBackend.run_node
supports_device = CgvmBackend.supports_device
is_compatible = CgvmBackend.is_compatible

__all__ = ["CgvmBackend", "CgvmRep", "prepare", "run_model", "run_node", "supports_device", "is_compatible"]
