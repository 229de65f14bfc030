"""Lowering of cgvm's control ops to ONNX control flow: ``cond`` -> If, ``scan`` -> Loop.

A ``cond``'s branch graphs become If branches (they take no inputs in ONNX: the operands are read
from the enclosing graph by name). A ``scan`` becomes a Loop whose trip count is the scan's step
count (its ``n_steps``, its run-time step count, or the shortest sequence's length), whose body
gathers row ``iter`` (``M - 1 - iter`` going backwards) of each sequence, carries the carries, and
returns the stacked carries and per-step outputs as the Loop's scan outputs; ``until`` becomes the
Loop condition, negated. The forms only gradients build (``truncate``) have no ONNX lowering.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from cgvm.ir.graph import CONST, PARAM
from cgvm.ops.control import split_sizes

from .errors import OnnxExportError
from .export_ops import INT_MAX, lowering


def _info(name: str, v: Any) -> Any:
    import onnx.helper

    elem = onnx.helper.np_dtype_to_tensor_dtype(v.dtype.np)
    return onnx.helper.make_tensor_value_info(name, elem, list(v.shape))


def _body(ctx: Any, graph: Any, bound: Sequence[str], outputs: Sequence[Any], name: str,
          inputs: Sequence[Any] = (), prefix: Sequence[str] = ()) -> Any:
    """``graph`` lowered as an ONNX sub-graph: its inputs named ``bound``, its outputs ``outputs``
    (Values of ``graph``, or names already made in the sub-graph); ``inputs`` are the ONNX
    sub-graph's own declared inputs (ValueInfos)."""
    import onnx.helper

    from .export import lower_nodes

    sub = ctx.child()
    for v, n in zip(graph.inputs, bound):
        sub.names[id(v)] = n
    for hook in prefix:
        hook(sub)
    lower_nodes(sub, graph.nodes)
    infos: List[Any] = []
    for out in outputs:
        if isinstance(out, tuple):          # (a name made in the sub-graph, its ValueInfo builder)
            have, info = out[0](sub), out[1]
        else:
            have = sub.name(out) if out.kind in (CONST, PARAM) else sub.names.get(id(out))
            if have is None:
                raise OnnxExportError(f"{graph.name}: output {out.label()} is never computed")
            info = out
        fresh = sub.fresh("out")
        sub.node("Identity", [have], outputs=[fresh])
        infos.append(_info(fresh, info) if not isinstance(info, str) else
                     onnx.helper.make_tensor_value_info(fresh, onnx.TensorProto.BOOL, []))
    return onnx.helper.make_graph(sub.nodes, name, list(inputs), infos)


@lowering("cond")
def _cond(ctx, node, ins):
    import onnx

    pred = ins[0]
    if node.inputs[0].dtype.np != np.bool_:
        pred = ctx.one("Cast", [pred], to=onnx.TensorProto.BOOL)
    a = node.attrs
    then_g = _body(ctx, a["then_graph"], ins[1:], a["then_graph"].outputs, ctx.fresh("then"))
    else_g = _body(ctx, a["else_graph"], ins[1:], a["else_graph"].outputs, ctx.fresh("else"))
    return ctx.node("If", [pred], n_out=len(node.outputs), then_branch=then_g, else_branch=else_g)


def _scalar(ctx, name: str, v: Any, dtype: Any) -> str:
    """``name`` (the value ``v``) as the 0-d ``dtype`` scalar ONNX wants for a trip count or condition."""
    from onnx.helper import np_dtype_to_tensor_dtype

    if v.dtype.np != dtype:
        name = ctx.one("Cast", [name], to=np_dtype_to_tensor_dtype(np.dtype(dtype)))
    return ctx.one("Reshape", [name, ctx.ints([])]) if v.ndim else name


def _reversed(ctx, name: str) -> str:
    """``name`` with its first axis reversed."""
    return ctx.one("Slice", [name, ctx.ints([-1]), ctx.ints([-INT_MAX]), ctx.ints([0]), ctx.ints([-1])])


@lowering("scan")
def _scan(ctx, node, ins):
    import onnx

    a = node.attrs
    if a["truncate"] >= 0:
        raise OnnxExportError(f"{node.where()}: a truncated scan (built for gradients) has no ONNX lowering")
    body = a["body"]
    S, C, until = a["n_seqs"], a["n_carry"], a["has_until"]
    seqs, inits, rest = split_sizes(list(ins), S, C)
    nonseqs = rest[:-1] if a["dyn_steps"] else rest
    n_ys = len(body.outputs) - C - (1 if until else 0)
    kept = list(range(C)) if a["stacked"] is None else list(a["stacked"])
    # the trip count
    if a["dyn_steps"]:
        trip: Optional[str] = _scalar(ctx, ins[-1], node.inputs[-1], np.int64)
    elif a["n_steps"] is not None:
        trip = ctx.const(np.asarray(a["n_steps"], np.int64), "trip")
    elif seqs:
        lengths = [ctx.one("Shape", [s], start=0, end=1) for s in seqs]
        trip = ctx.one("Reshape", [lengths[0] if len(lengths) == 1 else ctx.one("Min", lengths), ctx.ints([])])
    else:
        raise OnnxExportError(f"{node.where()}: a scan without sequences needs a step count")
    if seqs and (a["n_steps"] is not None or a["dyn_steps"]):   # a bound longer than a sequence: the sequence
        lengths = [ctx.one("Shape", [s], start=0, end=1) for s in seqs]
        trip = ctx.one("Reshape", [ctx.one("Min", [ctx.one("Reshape", [trip, ctx.ints([1])])] + lengths),
                                   ctx.ints([])])
    iter_name, cond_name = ctx.fresh("iter"), ctx.fresh("cond_in")
    carry_names = [ctx.fresh("carry") for _ in range(C)]
    row_names = [ctx.fresh("row") for _ in range(S)]

    def gather_rows(sub):
        idx = iter_name
        if a["go_backwards"]:
            last = sub.one("Sub", [trip, sub.const(np.asarray(1, np.int64), "one")])
            idx = sub.one("Sub", [last, iter_name])
        for s, r in zip(seqs, row_names):
            sub.node("Gather", [s, idx], outputs=[r], axis=0)

    step_outs = list(body.outputs[:C])
    if until:
        stop = body.outputs[-1]
        step_outs.insert(0, (lambda sub: sub.one("Not", [_scalar(sub, sub.names.get(id(stop)) or sub.name(stop),
                                                                 stop, np.bool_)]), "cond"))
    else:
        step_outs.insert(0, (lambda sub: cond_name, "cond"))
    step_outs += [body.outputs[k] for k in kept] + list(body.outputs[C:C + n_ys])
    declared = [onnx.helper.make_tensor_value_info(iter_name, onnx.TensorProto.INT64, []),
                onnx.helper.make_tensor_value_info(cond_name, onnx.TensorProto.BOOL, [])]
    declared += [_info(n, v) for n, v in zip(carry_names, body.inputs[S:S + C])]
    loop_body = _body(ctx, body, row_names + carry_names + list(nonseqs), step_outs, ctx.fresh("loop_body"),
                      inputs=declared, prefix=[gather_rows] if seqs else [])
    cond_in = ctx.const(np.asarray(True), "cond") if until else ""
    outs = ctx.node("Loop", [trip, cond_in] + list(inits), n_out=C + len(kept) + n_ys, body=loop_body)
    if a["seq_order"] and a["go_backwards"]:   # stacks in sequence order: the iteration order reversed
        outs = outs[:C] + [_reversed(ctx, o) for o in outs[C:]]
    return outs


@lowering("reverse")
def _reverse(ctx, node, ins):
    return _reversed(ctx, ins[0])
