"""Scan plumbing: ops that move per-step stacks along axis 0 for scan's gradient (BPTT).

shift_in gives each step the carry it started from; reverse puts a backwards loop's sequences
in iteration order; pad_steps_like pads a loop that stopped early (``has_until``) back to its
sequence length. Each gradient is another op here (its adjoint), so a backward loop built from
them can be differentiated again.
"""
from __future__ import annotations

from ..ir.types import TensorType
from .registry import defop


def _shift_infer(types):
    init, stack = types
    return stack


shift_in = defop("shift_in", num_inputs=2, infer=_shift_infer,
                 doc="concat(init[None], stack[:-1]): the carry each scan step started from.")


@shift_in.kernel
def _(xp, init, stack, out=None):
    out = xp.empty_like(stack) if out is None else out
    if stack.shape[0]:
        out[0] = init
        out[1:] = stack[:-1]
    return out


@shift_in.grad
def _(node, g):
    return [first_of(g), shift_out(g)]


first_of = defop("first_of", writes_out=False,
                 infer=lambda types: TensorType(types[0].shape[1:], types[0].dtype), doc="x[0]")


@first_of.kernel
def _(xp, x):
    return x[0].copy()


@first_of.grad
def _(node, g):
    return [place_first(g, node.inputs[0])]


place_first = defop("place_first", num_inputs=2, writes_out=False, shape_only=(1,),
                    infer=lambda types: TensorType(types[1].shape, types[0].dtype),
                    doc="zeros shaped like the second input, with the first input at index 0")


@place_first.kernel
def _(xp, g, like):
    out = xp.zeros(like.shape, g.dtype)
    out[0] = g
    return out


@place_first.grad
def _(node, gg):
    return [first_of(gg), None]


shift_out = defop("shift_out", infer=lambda types: types[0],
                  doc="the adjoint of the stack part of shift_in: out[:-1] = g[1:], out[-1] = 0")


@shift_out.kernel
def _(xp, g, out=None):
    out = xp.empty_like(g) if out is None else out
    if g.shape[0]:
        out[:-1] = g[1:]
        out[-1] = 0
    return out


@shift_out.grad
def _(node, gg):
    return [shift_back(gg)]


shift_back = defop("shift_back", infer=lambda types: types[0],
                   doc="out[1:] = g[:-1], out[0] = 0 (the adjoint of shift_out)")


@shift_back.kernel
def _(xp, g, out=None):
    out = xp.empty_like(g) if out is None else out
    if g.shape[0]:
        out[1:] = g[:-1]
        out[0] = 0
    return out


@shift_back.grad
def _(node, gg):
    return [shift_out(gg)]


reverse = defop("reverse", infer=lambda types: types[0], doc="x reversed along axis 0")


@reverse.kernel
def _(xp, x, out=None):
    if out is None:
        return x[::-1].copy()
    out[...] = x[::-1]
    return out


@reverse.grad
def _(node, g):
    return [reverse(g)]


def _pad_steps_infer(types):
    return TensorType(types[1].shape[:1] + types[0].shape[1:], types[0].dtype)


pad_steps_like = defop("pad_steps_like", num_inputs=2, writes_out=False, shape_only=(1,),
                       infer=_pad_steps_infer, doc="g zero-padded at the end of axis 0 to the length of like")


@pad_steps_like.kernel
def _(xp, g, like):
    if g.shape[0] == like.shape[0]:
        return g
    out = xp.zeros((like.shape[0],) + g.shape[1:], g.dtype)
    out[:g.shape[0]] = g
    return out


@pad_steps_like.grad
def _(node, gg):
    return [steps_like(gg, node.inputs[0]), None]


steps_like = defop("steps_like", num_inputs=2, view=True, shape_only=(1,),
                   infer=lambda types: TensorType(types[1].shape[:1] + types[0].shape[1:], types[0].dtype),
                   doc="the first len(like) entries of x along axis 0")


@steps_like.kernel
def _(xp, x, like):
    return x[:like.shape[0]]


@steps_like.grad
def _(node, gg):
    return [pad_steps_like(gg, node.inputs[0]), None]
