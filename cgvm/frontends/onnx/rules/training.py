"""The optimizer ops of the ai.onnx.preview.training domain (Adagrad, Adam, Momentum): one update
step of each (x, g, state...) group, as elementwise cgvm ops over the learning rate R and the step
count T (run-time scalars: the bias corrections that depend on T > 0 are selected at run time)."""
from __future__ import annotations


from cgvm.ops import elementwise as E
from cgvm.ops import elementwise_math as EM

from ..translate import rule
from .common import cast_to, const

_DOMAIN = "ai.onnx.preview.training"


def _groups(n, per_group: int):
    """The optimized tensors' inputs after R and T, regrouped as [(x, g, state...), ...]."""
    rest = n.inputs[2:]
    if len(rest) % per_group or not rest:
        raise n.error(f"expects R, T and then {per_group} lists of equal length (X, G, states), "
                      f"got {len(rest)} inputs after R and T")
    k = len(rest) // per_group
    return [tuple(rest[j * k + i] for j in range(per_group)) for i in range(k)], k


def _scalars(n, x):
    """R in x's dtype, T as a float of x's dtype, and the run-time test T > 0."""
    r = cast_to(n.input(0), x.dtype.np)
    t = n.input(1)
    return r, cast_to(t, x.dtype.np), E.gt(t, const(0, t))


def _regularized(x, g, norm):
    return E.add(E.mul(const(norm, x), x), g) if norm else g


@rule("Adagrad", domain=_DOMAIN)
def _adagrad(n):
    decay, eps, norm = n.attr("decay_factor", 0.0), n.attr("epsilon", 0.0), n.attr("norm_coefficient", 0.0)
    groups, _ = _groups(n, 3)
    xs, hs = [], []
    for x, g, h in groups:
        r, t, _ = _scalars(n, x)
        rate = E.div(r, E.add(const(1.0, x), E.mul(t, const(decay, x))))
        gr = _regularized(x, g, norm)
        h_new = E.add(h, E.mul(gr, gr))
        xs.append(E.sub(x, E.div(E.mul(rate, gr), E.add(EM.sqrt(h_new), const(eps, x)))))
        hs.append(h_new)
    return xs + hs


@rule("Adam", domain=_DOMAIN)
def _adam(n):
    alpha, beta = n.attr("alpha", 0.9), n.attr("beta", 0.999)
    eps, norm, post = n.attr("epsilon", 0.0), n.attr("norm_coefficient", 0.0), n.attr("norm_coefficient_post", 0.0)
    groups, _ = _groups(n, 4)
    xs, vs, hs = [], [], []
    for x, g, v, h in groups:
        r, t, started = _scalars(n, x)
        gr = _regularized(x, g, norm)
        v_new = E.add(E.mul(const(alpha, x), v), E.mul(const(1.0 - alpha, x), gr))
        h_new = E.add(E.mul(const(beta, x), h), E.mul(const(1.0 - beta, x), E.mul(gr, gr)))
        # bias correction once steps have been taken: R * sqrt(1 - beta^T) / (1 - alpha^T)
        one = const(1.0, x)
        corrected = E.div(E.mul(r, EM.sqrt(E.sub(one, E.pow(const(beta, x), t)))),
                          E.sub(one, E.pow(const(alpha, x), t)))
        rate = E.where(started, corrected, r)
        x_new = E.sub(x, E.mul(rate, E.div(v_new, E.add(EM.sqrt(h_new), const(eps, x)))))
        xs.append(E.mul(const(1.0 - post, x), x_new) if post else x_new)
        vs.append(v_new)
        hs.append(h_new)
    return xs + vs + hs


@rule("Momentum", domain=_DOMAIN)
def _momentum(n):
    alpha, beta, norm = n.attr("alpha"), n.attr("beta"), n.attr("norm_coefficient")
    if alpha is None or beta is None or norm is None:
        raise n.error("attributes alpha, beta and norm_coefficient are required")
    nesterov = n.attr("mode", "standard") == "nesterov"
    groups, _ = _groups(n, 3)
    xs, vs = [], []
    for x, g, v in groups:
        r, _, started = _scalars(n, x)
        gr = _regularized(x, g, norm)
        # the gradient's coefficient is 1 on the first step
        coeff = E.where(started, const(beta, x), const(1.0, x))
        v_new = E.add(E.mul(const(alpha, x), v), E.mul(coeff, gr))
        step = E.add(gr, E.mul(const(alpha, x), v_new)) if nesterov else v_new
        xs.append(E.sub(x, E.mul(r, step)))
        vs.append(v_new)
    return xs + vs
