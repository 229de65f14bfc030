"""Identity ops that steer gradients: stop_gradient, grad_scale, grad_clip.

Each is the identity in the forward pass (a view of its input, so it costs nothing at run
time); only its gradient rule differs. Theano's ``zero_grad``/``disconnected_grad``,
``grad_scale`` and ``grad_clip`` are these.
"""
from __future__ import annotations

from ..ir.attrs import Float
from . import elementwise as ew
from .registry import defop
from .rules import same_as_input

stop_gradient = defop("stop_gradient", view=True, differentiable=False, infer=same_as_input,
                      doc="identity whose gradient is zero")


@stop_gradient.kernel
def _(xp, x):
    return x


grad_scale = defop("grad_scale", view=True, infer=same_as_input, attrs={"scale": Float()},
                   doc="identity whose gradient is multiplied by `scale`")


@grad_scale.kernel
def _(xp, x, *, scale):
    return x


@grad_scale.grad
def _(node, g):
    return [ew.mul(g, node.attrs["scale"])]


grad_clip = defop("grad_clip", view=True, infer=same_as_input,
                  attrs={"lower": Float(), "upper": Float()},
                  doc="identity whose gradient is clipped to [lower, upper]")


@grad_clip.kernel
def _(xp, x, *, lower, upper):
    return x


@grad_clip.grad
def _(node, g):
    return [ew.clip(g, lo=node.attrs["lower"], hi=node.attrs["upper"])]
