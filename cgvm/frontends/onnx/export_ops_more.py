"""Lowerings of cgvm's reductions, fused elementwise chains and the ops added for ONNX (einsum, det,
cumsum, bit_shift, scatter_reduce, nonzero, unique), registered in export_ops.LOWERINGS."""
from __future__ import annotations

from typing import List

import numpy as np

from .errors import OnnxExportError
from .export_ops import LOWERINGS, _axis, lowering


# --------------------------------------------------------------------------- reductions


def _axes_of(node):
    axis = node.attrs["axis"]
    nd = node.inputs[0].ndim
    if axis is None:
        return list(range(nd))
    axis = (axis,) if isinstance(axis, int) else axis
    return sorted(_axis(a, nd) for a in axis)


@lowering("sum")
def _sum(ctx, node, ins):
    x = ins[0]
    if node.outputs[0].dtype != node.inputs[0].dtype:
        import onnx.helper

        x = ctx.one("Cast", [x], to=onnx.helper.np_dtype_to_tensor_dtype(node.outputs[0].dtype.np))
    return ctx.one("ReduceSum", [x, ctx.ints(_axes_of(node))], keepdims=int(node.attrs["keepdims"]))


@lowering("sum_squares")
def _sum_squares(ctx, node, ins):
    return ctx.one("ReduceSumSquare", ins, keepdims=0)   # no axes: every axis


def _reduce(op_type):
    def lower(ctx, node, ins):
        return ctx.one(op_type, ins, axes=_axes_of(node), keepdims=int(node.attrs["keepdims"]))
    return lower


for _cg, _onnx in {"mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "prod": "ReduceProd",
                   "logsumexp": "ReduceLogSumExp"}.items():
    LOWERINGS[_cg] = _reduce(_onnx)


@lowering("argmax", "argmin")
def _arg(ctx, node, ins):
    axis = node.attrs["axis"]
    x = ins[0]
    if axis is None:
        x, axis = ctx.one("Reshape", [x, ctx.ints([-1])]), 0
    return ctx.one("ArgMax" if node.op.name == "argmax" else "ArgMin", [x],
                   axis=_axis(axis, node.inputs[0].ndim if node.attrs["axis"] is not None else 1),
                   keepdims=int(node.attrs["keepdims"]))


@lowering("zeros_like", "ones_like", "full_like")
def _fill_like(ctx, node, ins):
    import onnx

    value = {"zeros_like": 0, "ones_like": 1}.get(node.op.name, node.attrs.get("value", 0))
    dtype = node.outputs[0].dtype.np
    t = onnx.numpy_helper.from_array(np.asarray([value], dtype))
    return ctx.one("ConstantOfShape", [ctx.one("Shape", ins)], value=t)


# --------------------------------------------------------------------------- fused chains

_UFUNCS = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div", "true_divide": "Div",
           "power": "Pow", "maximum": "Max", "minimum": "Min", "negative": "Neg", "absolute": "Abs", "exp": "Exp",
           "log": "Log", "sqrt": "Sqrt", "tanh": "Tanh", "reciprocal": "Reciprocal", "floor": "Floor",
           "ceil": "Ceil", "sign": "Sign", "sin": "Sin", "cos": "Cos", "greater": "Greater", "less": "Less",
           "equal": "Equal"}


@lowering("fused_elementwise")
def _fused(ctx, node, ins):
    """A fused elementwise chain, step by step (the accumulator is the previous step's result)."""
    acc = None
    dtype = node.outputs[0].dtype.np
    for step, operands in node.attrs["program"]:
        names: List[str] = []
        for r in operands:
            if r == "acc":
                names.append(acc)
            elif isinstance(r, tuple):
                names.append(ctx.const(np.asarray(r[1], np.dtype(r[2]))))
            else:
                names.append(ins[r])
        if step in _UFUNCS:
            acc = ctx.one(_UFUNCS[step], names)
        elif step == "square":
            acc = ctx.one("Mul", [names[0], names[0]])
        elif step == "sigmoid" or step == "expit":
            acc = ctx.one("Sigmoid", names)
        elif step == "relu":
            acc = ctx.one("Relu", names)
        else:
            raise OnnxExportError(f"fused step {step!r} has no ONNX lowering")
    return acc if dtype == node.outputs[0].dtype.np else acc


# --------------------------------------------------------------------------- ops added for ONNX


@lowering("einsum")
def _einsum(ctx, node, ins):
    return ctx.one("Einsum", ins, equation=node.attrs["equation"].replace(" ", ""))


@lowering("det")
def _det(ctx, node, ins):
    return ctx.one("Det", ins)


@lowering("cumsum")
def _cumsum(ctx, node, ins):
    axis = node.attrs["axis"]
    x = ins[0]
    if axis is None:
        x, axis = ctx.one("Reshape", [x, ctx.ints([-1])]), 0
    if node.outputs[0].dtype != node.inputs[0].dtype:
        import onnx.helper

        x = ctx.one("Cast", [x], to=onnx.helper.np_dtype_to_tensor_dtype(node.outputs[0].dtype.np))
    return ctx.one("CumSum", [x, ctx.ints([axis])[:]], reverse=int(node.attrs["reverse"]))


@lowering("bit_shift")
def _bit_shift(ctx, node, ins):
    return ctx.one("BitShift", ins, direction=node.attrs["direction"].upper())


# --------------------------------------------------------------------------- sampling, spectral, detection

@lowering("grid_sample")
def _grid_sample(ctx, node, ins):
    a = node.attrs
    if node.inputs[0].ndim != 4:
        raise OnnxExportError("grid_sample over other than 2 spatial axes needs GridSample of opset 20; cgvm "
                              "exports opset 17")
    mode = {"linear": "bilinear", "cubic": "bicubic"}.get(a["mode"], a["mode"])
    return ctx.one("GridSample", ins, mode=mode, padding_mode=a["padding_mode"],
                   align_corners=int(a["align_corners"]))


@lowering("dft")
def _dft(ctx, node, ins):
    a = node.attrs
    inputs = list(ins)
    if a["length"] is not None:
        inputs.append(ctx.const(np.asarray(a["length"], np.int64), "dft_length"))
    return ctx.one("DFT", inputs, axis=int(a["axis"]), inverse=int(a["inverse"]), onesided=int(a["onesided"]))


@lowering("roi_align")
def _roi_align(ctx, node, ins):
    a = node.attrs
    return ctx.one("RoiAlign", ins, mode=a["mode"], output_height=a["output_height"], output_width=a["output_width"],
                   sampling_ratio=a["sampling_ratio"], spatial_scale=a["spatial_scale"],
                   coordinate_transformation_mode="half_pixel" if a["half_pixel"] else "output_half_pixel")


@lowering("non_max_suppression")
def _nms(ctx, node, ins):
    a = node.attrs
    extra = [ctx.const(np.asarray([a["max_output_boxes_per_class"]], np.int64), "max_boxes"),
             ctx.const(np.asarray([a["iou_threshold"]], np.float32), "iou_threshold")]
    if a["score_threshold"] is not None:
        extra.append(ctx.const(np.asarray([a["score_threshold"]], np.float32), "score_threshold"))
    return ctx.one("NonMaxSuppression", list(ins) + extra, center_point_box=int(a["center_point_box"]))


# --------------------------------------------------------------------------- scatters and data-dependent shapes


@lowering("scatter_reduce")
def _scatter_reduce(ctx, node, ins):
    reduction = node.attrs["reduction"]
    if reduction not in ("add", "mul"):
        # ScatterElements reduces by max and min from opset 18 on; the export writes opset 17
        raise OnnxExportError(f"scatter_reduce with reduction {reduction!r} needs ONNX opset 18 "
                              "(ScatterElements max/min); the export writes opset 17")
    return ctx.one("ScatterElements", ins, axis=_axis(node.attrs["axis"], node.inputs[0].ndim), reduction=reduction)


@lowering("nonzero")
def _nonzero(ctx, node, ins):
    return ctx.one("NonZero", ins)


@lowering("unique")
def _unique(ctx, node, ins):
    axis = node.attrs["axis"]
    return ctx.node("Unique", ins, n_out=4, sorted=int(node.attrs["sorted"]),
                    axis=None if axis is None else _axis(axis, node.inputs[0].ndim))
