"""Lowering of cgvm ops to ai.onnx ops (opset 17), one small function per op:
``lower(ctx, node, input_names) -> output name(s)``.

Fused ops lower to the ops they fuse (conv_bias_act -> Conv + activation, gemm_bias_act -> Gemm +
activation, fused_elementwise -> its program step by step). Ops that only steer training
(stop_gradient, grad_scale, grad_clip) and copies (contiguous) are Identity at inference.
"""
from __future__ import annotations

from typing import Any, Callable, Dict

import numpy as np

from cgvm.ops.conv_geometry import pad_pairs

from .errors import OnnxExportError

LOWERINGS: Dict[str, Callable[..., Any]] = {}

INT_MAX = 2 ** 63 - 1


def lowering(*names: str):
    def deco(fn):
        for n in names:
            LOWERINGS[n] = fn
        return fn
    return deco


def _simple(op_type: str):
    def lower(ctx, node, ins):
        # cgvm's kernels promote mixed operands as NumPy does (a float64 x times a float32 weight);
        # ONNX ops take one type, so the operands are cast to the common type first
        data = node.inputs[1:] if op_type == "Where" else node.inputs
        common = np.result_type(*[v.dtype.np for v in data]) if len(data) > 1 else None
        if common is not None and any(v.dtype.np != common for v in data):
            import onnx

            to = onnx.helper.np_dtype_to_tensor_dtype(common)
            skip = 1 if op_type == "Where" else 0
            ins = list(ins[:skip]) + [ctx.one("Cast", [n], to=to) if v.dtype.np != common else n
                                      for v, n in zip(data, ins[skip:])]
        return ctx.one(op_type, ins)
    return lower


for _cg, _onnx in {"add": "Add", "sub": "Sub", "mul": "Mul", "pow": "Pow", "maximum": "Max", "minimum": "Min",
                   "eq": "Equal", "gt": "Greater", "lt": "Less", "ge": "GreaterOrEqual", "le": "LessOrEqual",
                   "logical_and": "And", "logical_or": "Or", "logical_xor": "Xor", "logical_not": "Not",
                   "neg": "Neg", "abs": "Abs", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "tanh": "Tanh",
                   "sigmoid": "Sigmoid", "erf": "Erf", "floor": "Floor", "ceil": "Ceil", "sign": "Sign",
                   "reciprocal": "Reciprocal", "sin": "Sin", "cos": "Cos", "tan": "Tan", "arcsin": "Asin",
                   "arccos": "Acos", "arctan": "Atan", "sinh": "Sinh", "cosh": "Cosh", "arcsinh": "Asinh",
                   "arccosh": "Acosh", "arctanh": "Atanh", "softplus": "Softplus", "matmul": "MatMul",
                   "where": "Where", "bitwise_and": "BitwiseAnd", "bitwise_or": "BitwiseOr",
                   "bitwise_xor": "BitwiseXor", "invert": "BitwiseNot", "shape_of": "Shape"}.items():
    LOWERINGS[_cg] = _simple(_onnx)


@lowering("stop_gradient", "grad_scale", "grad_clip", "contiguous")
def _identity(ctx, node, ins):
    return ctx.one("Identity", ins[:1])


@lowering("div")
def _div(ctx, node, ins):
    a, b = node.inputs
    if a.dtype.is_float:
        return ctx.one("Div", ins)
    # NumPy's int / int is float64
    f = [ctx.one("Cast", [i], to=11) for i in ins]
    return ctx.one("Div", f)


@lowering("floordiv")
def _floordiv(ctx, node, ins):
    if node.inputs[0].dtype.is_float:
        return ctx.one("Floor", [ctx.one("Div", ins)])
    # floor of the quotient for integers: a - mod(a, b) divides exactly
    return ctx.one("Div", [ctx.one("Sub", [ins[0], ctx.one("Mod", ins, fmod=0)]), ins[1]])


@lowering("mod")
def _mod(ctx, node, ins):
    if node.inputs[0].dtype.is_float:
        # NumPy's remainder has the divisor's sign: a - floor(a / b) * b
        q = ctx.one("Floor", [ctx.one("Div", ins)])
        return ctx.one("Sub", [ins[0], ctx.one("Mul", [q, ins[1]])])
    return ctx.one("Mod", ins, fmod=0)


@lowering("ne")
def _ne(ctx, node, ins):
    return ctx.one("Not", [ctx.one("Equal", ins)])


@lowering("square")
def _square(ctx, node, ins):
    return ctx.one("Mul", [ins[0], ins[0]])


@lowering("rsqrt")
def _rsqrt(ctx, node, ins):
    return ctx.one("Reciprocal", [ctx.one("Sqrt", ins)])


def _scalar(ctx, v, value):
    return ctx.const(np.asarray(value, v.dtype.np))


@lowering("log1p")
def _log1p(ctx, node, ins):
    return ctx.one("Log", [ctx.one("Add", [ins[0], _scalar(ctx, node.inputs[0], 1)])])


@lowering("expm1")
def _expm1(ctx, node, ins):
    return ctx.one("Sub", [ctx.one("Exp", ins), _scalar(ctx, node.inputs[0], 1)])


@lowering("log2", "log10")
def _log_base(ctx, node, ins):
    base = 2.0 if node.op.name == "log2" else 10.0
    return ctx.one("Div", [ctx.one("Log", ins), _scalar(ctx, node.inputs[0], np.log(base))])


@lowering("round")
def _round(ctx, node, ins):
    d = node.attrs["decimals"]
    if not d:
        return ctx.one("Round", ins)
    k = _scalar(ctx, node.inputs[0], 10.0 ** d)
    return ctx.one("Div", [ctx.one("Round", [ctx.one("Mul", [ins[0], k])]), k])


def _act(ctx, v, name, act, negative_slope=0.0):
    if act in ("", "none", None):
        return name
    if act == "relu":
        return ctx.one("LeakyRelu", [name], alpha=negative_slope) if negative_slope else ctx.one("Relu", [name])
    table = {"sigmoid": "Sigmoid", "tanh": "Tanh"}
    if act in table:
        return ctx.one(table[act], [name])
    raise OnnxExportError(f"activation {act!r} has no ONNX lowering")


@lowering("relu")
def _relu(ctx, node, ins):
    return _act(ctx, node.inputs[0], ins[0], "relu", node.attrs["negative_slope"])


@lowering("elu")
def _elu(ctx, node, ins):
    return ctx.one("Elu", ins, alpha=node.attrs["alpha"])


@lowering("clip")
def _clip(ctx, node, ins):
    x = node.inputs[0]
    if len(ins) == 3:
        return ctx.one("Min", [ctx.one("Max", [ins[0], ins[1]]), ins[2]])
    lo, hi = node.attrs["lo"], node.attrs["hi"]
    if x.dtype.is_int:
        lo = None if lo is None else np.ceil(lo)
        hi = None if hi is None else np.floor(hi)
    args = [ins[0], "" if lo is None else _scalar(ctx, x, lo), "" if hi is None else _scalar(ctx, x, hi)]
    while args and args[-1] == "":
        args.pop()
    return ctx.one("Clip", args)


@lowering("cast")
def _cast(ctx, node, ins):
    import onnx.helper

    return ctx.one("Cast", ins, to=onnx.helper.np_dtype_to_tensor_dtype(node.attrs["dtype"].np))


# --------------------------------------------------------------------------- nn


def _conv_attrs(node, nsp):
    a = node.attrs

    def spatial(v):
        v = tuple(v)
        return list(v * nsp if len(v) == 1 else v)
    pairs = pad_pairs(a["pad"], nsp)
    return dict(strides=spatial(a["stride"]), pads=[b for b, _ in pairs] + [e for _, e in pairs],
                dilations=spatial(a["dilation"]), group=a["groups"])


@lowering("conv")
def _conv(ctx, node, ins):
    return ctx.one("Conv", ins, **_conv_attrs(node, node.inputs[0].ndim - 2))


@lowering("conv_bias_act")
def _conv_bias_act(ctx, node, ins):
    y = ctx.one("Conv", ins, **_conv_attrs(node, node.inputs[0].ndim - 2))
    return _act(ctx, node.outputs[0], y, node.attrs["act"])


@lowering("conv_transpose")
def _conv_transpose(ctx, node, ins):
    nsp = node.inputs[0].ndim - 2
    attrs = _conv_attrs(node, nsp)
    op = tuple(node.attrs["output_padding"])
    attrs["output_padding"] = list(op * nsp if len(op) == 1 else op)
    return ctx.one("ConvTranspose", ins, **attrs)


@lowering("gemm")
def _gemm(ctx, node, ins):
    a = node.attrs
    if node.inputs[0].ndim != 2 or node.inputs[1].ndim != 2:
        raise OnnxExportError("gemm of operands that are not matrices")
    return ctx.one("Gemm", ins, transA=int(a["trans_a"]), transB=int(a["trans_b"]), alpha=float(a["alpha"]),
                   beta=float(a["beta"]))


@lowering("gemm_bias_act")
def _gemm_bias_act(ctx, node, ins):
    a = node.attrs
    y = ctx.one("Gemm", ins, transA=int(a["trans_a"]), transB=int(a["trans_b"]))
    return _act(ctx, node.outputs[0], y, a["act"])


def _pool_attrs(node):
    a = node.attrs
    nsp = node.inputs[0].ndim - 2

    def spatial(v):
        v = tuple(v)
        return list(v * nsp if len(v) == 1 else v)
    pairs = pad_pairs(a["pad"], nsp)
    attrs = dict(kernel_shape=spatial(a["kernel"]), strides=spatial(a["stride"]),
                 pads=[b for b, _ in pairs] + [e for _, e in pairs],
                 ceil_mode=int(a["ceil_mode"]))
    if any(d != 1 for d in a.get("dilation", (1,))):
        attrs["dilations"] = spatial(a["dilation"])
    return attrs


@lowering("max_pool")
def _max_pool(ctx, node, ins):
    if node.attrs["return_mask"]:
        raise OnnxExportError("max_pool with return_mask has no ONNX lowering")
    return ctx.one("MaxPool", ins, **_pool_attrs(node))


@lowering("avg_pool")
def _avg_pool(ctx, node, ins):
    if any(d != 1 for d in node.attrs.get("dilation", (1,))):
        raise OnnxExportError("avg_pool with dilation needs AveragePool of opset 19; cgvm exports opset 17")
    return ctx.one("AveragePool", ins, count_include_pad=int(node.attrs["count_include_pad"]), **_pool_attrs(node))


@lowering("global_avg_pool")
def _gap(ctx, node, ins):
    return ctx.one("GlobalAveragePool", ins)


@lowering("global_max_pool")
def _gmp(ctx, node, ins):
    return ctx.one("GlobalMaxPool", ins)


def _axis(a, ndim):
    return a + ndim if a < 0 else a


@lowering("softmax", "log_softmax")
def _softmax(ctx, node, ins):
    return ctx.one("Softmax" if node.op.name == "softmax" else "LogSoftmax", ins,
                   axis=_axis(node.attrs["axis"], node.inputs[0].ndim))


@lowering("batch_norm")
def _batch_norm(ctx, node, ins):
    if node.attrs["training"]:
        raise OnnxExportError("batch_norm in training mode has no inference lowering")
    x = node.inputs[0]
    c = x.shape[_axis(node.attrs["axis"], x.ndim)]
    if _axis(node.attrs["axis"], x.ndim) != 1:
        raise OnnxExportError("batch_norm over an axis other than 1")
    mean, var = ins[1], ins[2]
    scale = ins[3] if len(ins) > 3 else ctx.const(np.ones(c, x.dtype.np))
    bias = ins[4] if len(ins) > 4 else ctx.const(np.zeros(c, x.dtype.np))
    return ctx.one("BatchNormalization", [ins[0], scale, bias, mean, var], epsilon=float(node.attrs["eps"]))


@lowering("lrn")
def _lrn(ctx, node, ins):
    a = node.attrs
    if a["norm_region"] != "ACROSS_CHANNELS":
        raise OnnxExportError("LRN within channels has no ONNX lowering")
    return ctx.one("LRN", ins, size=int(a["local_size"]), alpha=float(a["alpha"]), beta=float(a["beta"]),
                   bias=float(a["k"]))


@lowering("prelu")
def _prelu(ctx, node, ins):
    x, slope = node.inputs
    axis = _axis(node.attrs["axis"], x.ndim)
    s = ins[1]
    if slope.ndim >= 1 and slope.shape != (1,):
        trailing = x.ndim - axis - slope.ndim
        if trailing:
            s = ctx.one("Reshape", [s, ctx.ints(list(slope.shape) + [1] * trailing)])
    return ctx.one("PRelu", [ins[0], s])


@lowering("dropout")
def _dropout(ctx, node, ins):
    # inference export: dropout is the identity (its seed input is dropped)
    return ctx.one("Identity", ins[:1])


@lowering("embedding")
def _embedding(ctx, node, ins):
    return ctx.one("Gather", [ins[1], ins[0]], axis=0)


# --------------------------------------------------------------------------- shapes


def _target_shape(ctx, node):
    """A Reshape target for ``node``'s output: known dims as they are, one unknown as -1."""
    shape = node.outputs[0].shape
    if sum(d is None for d in shape) > 1:
        raise OnnxExportError(f"reshape to {shape}: more than one unknown dimension")
    return ctx.ints([-1 if d is None else d for d in shape], "shape")


@lowering("reshape", "flatten", "reshape_like")
def _reshape(ctx, node, ins):
    return ctx.one("Reshape", [ins[0], _target_shape(ctx, node)])


@lowering("reshape_dyn")
def _reshape_dyn(ctx, node, ins):
    return ctx.one("Reshape", [ins[0], ctx.one("Cast", [ins[1]], to=7)])


@lowering("transpose")
def _transpose(ctx, node, ins):
    perm = node.attrs["perm"]
    perm = list(perm) if perm is not None else list(reversed(range(node.inputs[0].ndim)))
    return ctx.one("Transpose", ins, perm=perm)


@lowering("expand_dims")
def _expand_dims(ctx, node, ins):
    return ctx.one("Unsqueeze", [ins[0], ctx.ints(node.attrs["axis"])])


@lowering("squeeze")
def _squeeze(ctx, node, ins):
    axes = node.attrs["axis"]
    if axes is None:
        return ctx.one("Squeeze", ins)
    return ctx.one("Squeeze", [ins[0], ctx.ints(axes)])


@lowering("broadcast_to")
def _broadcast_to(ctx, node, ins):
    return ctx.one("Expand", [ins[0], ctx.ints(node.attrs["shape"])])


@lowering("broadcast_like")
def _broadcast_like(ctx, node, ins):
    return ctx.one("Expand", [ins[0], ctx.one("Shape", [ins[1]])])


@lowering("concat")
def _concat(ctx, node, ins):
    return ctx.one("Concat", ins, axis=_axis(node.attrs["axis"], node.inputs[0].ndim))


@lowering("split")
def _split(ctx, node, ins):
    axis = _axis(node.attrs["axis"], node.inputs[0].ndim)
    sizes = [o.shape[axis] for o in node.outputs]
    if None in sizes:
        raise OnnxExportError("split of an axis of unknown length")
    return ctx.node("Split", [ins[0], ctx.ints(sizes)], n_out=len(sizes), axis=axis)


@lowering("slice")
def _slice(ctx, node, ins):
    a = node.attrs
    nd = node.inputs[0].ndim
    n = len(a["axes"]) if a["axes"] is not None else max(len(v) for v in (a["starts"], a["stops"], a["steps"])
                                                            if v is not None)
    axes = list(a["axes"]) if a["axes"] is not None else list(range(n))
    steps = list(a["steps"]) if a["steps"] is not None else [1] * n
    steps = [1 if s is None else s for s in steps]
    starts = list(a["starts"]) if a["starts"] is not None else [None] * n
    stops = list(a["stops"]) if a["stops"] is not None else [None] * n
    starts = [(0 if st > 0 else INT_MAX) if s is None else s for s, st in zip(starts, steps)]
    stops = [(INT_MAX if st > 0 else -INT_MAX) if s is None else s for s, st in zip(stops, steps)]
    return ctx.one("Slice", [ins[0], ctx.ints(starts), ctx.ints(stops), ctx.ints([_axis(x, nd) for x in axes]),
                             ctx.ints(steps)])


@lowering("dynamic_slice")
def _dynamic_slice(ctx, node, ins):
    a = node.attrs
    bounds = [ctx.one("Reshape", [v, ctx.ints([1])]) for v in ins[1:]]   # 0-d start and stop as 1-vectors
    return ctx.one("Slice", [ins[0], *bounds, ctx.ints([_axis(a["axis"], node.inputs[0].ndim)]), ctx.ints([a["step"]])])


@lowering("take")
def _take(ctx, node, ins):
    axis = node.attrs["axis"]
    if axis is None:
        return ctx.one("Gather", [ctx.one("Reshape", [ins[0], ctx.ints([-1])]), ins[1]], axis=0)
    return ctx.one("Gather", ins, axis=_axis(axis, node.inputs[0].ndim))


@lowering("take_along_axis")
def _take_along(ctx, node, ins):
    return ctx.one("GatherElements", ins, axis=_axis(node.attrs["axis"], node.inputs[0].ndim))


@lowering("pad")
def _pad(ctx, node, ins):
    pads = list(node.attrs["pads"])
    nd = node.inputs[0].ndim
    pairs = [(pads[2 * i], pads[2 * i + 1]) for i in range(len(pads) // 2)]
    pairs = [(0, 0)] * (nd - len(pairs)) + pairs
    mode = node.attrs["mode"]
    if mode not in ("constant", "edge", "reflect"):
        raise OnnxExportError(f"pad mode {mode!r} has no opset-{17} lowering")
    args = [ins[0], ctx.ints([b for b, _ in pairs] + [a for _, a in pairs])]
    if mode == "constant":
        args.append(_scalar(ctx, node.inputs[0], node.attrs["value"]))
    return ctx.one("Pad", args, mode=mode)


@lowering("tile")
def _tile(ctx, node, ins):
    reps = list(node.attrs["reps"])
    nd = node.inputs[0].ndim
    reps = [1] * (nd - len(reps)) + reps
    return ctx.one("Tile", [ins[0], ctx.ints(reps)])


from . import export_ops_more  # noqa: E402,F401  (reductions, fused chains, ops added for ONNX)
from . import export_control  # noqa: E402,F401  (cond -> If, scan -> Loop)
