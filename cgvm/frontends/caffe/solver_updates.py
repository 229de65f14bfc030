"""Caffe's solver arithmetic: learning-rate policies (host) and update rules (graph nodes).

``learning_rate`` evaluates an ``lr_policy`` at an iteration exactly as Caffe's
``SGDSolver::GetLearningRate`` does. ``build_updates`` turns each learnable blob's gradient into
Caffe's update, as graph nodes: clip (global L2 norm) -> normalize by iter_size -> L1/L2
regularization with ``decay_mult`` -> the solver type's ComputeUpdateValue -> ``w - step``.
History blobs (momentum, squared-gradient averages) are workspace entries, so the whole
update runs inside the one compiled training step and lives beside the weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from cgvm.frontends.caffe import caffe_pb2
from cgvm.frontends.caffe.errors import CaffeError
from cgvm.ir import Value
from cgvm.ops import elementwise as ew
from cgvm.ops import reduce as red

#: solver type -> number of history blobs per learnable blob (Caffe's history_ layout:
#: AdaDelta and Adam keep two, stored as all first halves then all second halves).
HISTORY_COUNT = {"SGD": 1, "Nesterov": 1, "AdaGrad": 1, "RMSProp": 1, "AdaDelta": 2, "Adam": 2}

LR_POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


def learning_rate(param: caffe_pb2.SolverParameter, iteration: int, current_step: int) -> Tuple[float, int]:
    """(rate, new current_step) for ``iteration`` completed updates.

    ``current_step`` is multistep's position; it advances by at most one per call, as in Caffe.
    The arithmetic is done in double precision and the result rounded to float32, as Caffe's
    ``Dtype rate`` is.
    """
    policy = param.lr_policy
    base = float(param.base_lr)
    gamma, power = float(param.gamma), float(param.power)
    if policy == "fixed":
        rate = base
    elif policy == "step":
        if param.stepsize <= 0:
            raise CaffeError("lr_policy \"step\" needs stepsize > 0")
        current_step = iteration // param.stepsize
        rate = base * gamma ** current_step
    elif policy == "exp":
        rate = base * gamma ** iteration
    elif policy == "inv":
        rate = base * (1.0 + gamma * iteration) ** (-power)
    elif policy == "multistep":
        values = list(param.stepvalue)
        if current_step < len(values) and iteration >= values[current_step]:
            current_step += 1
        rate = base * gamma ** current_step
    elif policy == "poly":
        if param.max_iter <= 0:
            raise CaffeError("lr_policy \"poly\" needs max_iter > 0")
        rate = base * (1.0 - iteration / float(param.max_iter)) ** power
    elif policy == "sigmoid":
        rate = base * (1.0 / (1.0 + math.exp(-gamma * (iteration - float(param.stepsize)))))
    elif not policy:
        raise CaffeError(f"the solver sets no lr_policy; choose one of {', '.join(LR_POLICIES)}")
    else:
        raise CaffeError(f"unknown lr_policy {policy!r}; Caffe knows {', '.join(LR_POLICIES)}")
    return float(_f32(rate)), current_step


def adam_correction(param: caffe_pb2.SolverParameter, iteration: int) -> float:
    """Adam's folded bias correction sqrt(1 - beta2^t) / (1 - beta1^t), t = iteration + 1."""
    t = iteration + 1
    beta1, beta2 = float(param.momentum), float(param.momentum2)
    return float(_f32(math.sqrt(1.0 - beta2 ** t) / (1.0 - beta1 ** t)))


def _f32(x: float) -> np.float32:
    """Round to float32, as Caffe's Dtype arithmetic does."""
    return np.float32(x)


def check_solver_param(param: caffe_pb2.SolverParameter, kind: str) -> None:
    """Caffe's constructor checks for the solver type ``kind``."""
    if kind not in HISTORY_COUNT:
        raise CaffeError(f"unknown solver type {kind!r}; Caffe knows {', '.join(HISTORY_COUNT)}")
    if kind in ("AdaGrad", "RMSProp") and param.momentum != 0:
        raise CaffeError(f"momentum cannot be used with {kind} (the solver file sets momentum {param.momentum})")
    if kind == "RMSProp" and not 0 <= param.rms_decay < 1:
        raise CaffeError(f"RMSProp needs 0 <= rms_decay < 1, got {param.rms_decay}")
    if param.regularization_type not in ("L1", "L2"):
        raise CaffeError(f"unknown regularization_type {param.regularization_type!r}; use \"L1\" or \"L2\"")
    if kind == "Adam" and not (0 <= param.momentum < 1 and 0 <= param.momentum2 < 1):
        raise CaffeError(f"Adam needs 0 <= momentum < 1 and 0 <= momentum2 < 1 (its bias correction divides by "
                         f"1 - momentum**t), got momentum {param.momentum}, momentum2 {param.momentum2}")
    if param.iter_size < 1:
        raise CaffeError(f"iter_size must be >= 1, got {param.iter_size}")
    if param.average_loss < 1:
        raise CaffeError(f"average_loss must be >= 1, got {param.average_loss}")


@dataclass
class LearnableBlob:
    """One blob the solver updates: its current value, gradient, histories and multipliers."""

    weight: Value                 # the param Value the graph reads
    grad: Value                   # d loss / d weight (already summed over iter_size sub-batches)
    history: List[Value]          # HISTORY_COUNT[kind] workspace-backed param Values
    lr_mult: float
    decay_mult: float


def build_updates(kind: str, param: caffe_pb2.SolverParameter, blobs: Sequence[LearnableBlob], rate: Value,
                  correction: Optional[Value] = None) -> Tuple[List[Value], List[Value], List[List[Value]]]:
    """Caffe's ApplyUpdate as graph nodes.

    ``rate`` is a float32 scalar input (the lr policy's value this iteration); ``correction``
    Adam's bias correction input. Returns (new weights, steps left in the diffs, new histories)
    per blob, in ``blobs`` order.
    """
    grads = [b.grad for b in blobs]
    if param.clip_gradients >= 0 and grads:
        grads = _clip(grads, float(param.clip_gradients))
    new_weights, steps, histories = [], [], []
    for blob, g in zip(blobs, grads):
        if param.iter_size > 1:
            g = ew.mul(g, float(_f32(1.0 / param.iter_size)))
        g = _regularize(param, blob, g)
        local_rate = ew.mul(rate, float(_f32(blob.lr_mult))) if blob.lr_mult != 1.0 else rate
        step, hist = _compute_update_value(kind, param, g, blob.history, local_rate, correction)
        new_weights.append(ew.sub(blob.weight, step))
        steps.append(step)
        histories.append(hist)
    return new_weights, steps, histories


def _clip(grads: List[Value], clip: float) -> List[Value]:
    """Scale every gradient by clip / ||all gradients||_2 when that norm exceeds ``clip``."""
    norm = ew.sqrt(ew.add_n([red.sum(ew.square(g)) for g in grads]))
    scale = ew.where(ew.gt(norm, clip), ew.div(clip, norm), 1.0)
    return [ew.mul(g, scale) for g in grads]


def _regularize(param: caffe_pb2.SolverParameter, blob: LearnableBlob, g: Value) -> Value:
    local_decay = float(_f32(float(_f32(param.weight_decay)) * float(_f32(blob.decay_mult))))
    if not local_decay:
        return g
    if param.regularization_type == "L2":
        return ew.add(g, ew.mul(blob.weight, local_decay))
    return ew.add(g, ew.mul(ew.sign(blob.weight), local_decay))


def _compute_update_value(kind: str, param: caffe_pb2.SolverParameter, g: Value, history: List[Value],
                          lr: Value, correction: Optional[Value]) -> Tuple[Value, List[Value]]:
    """(step, new histories) for one blob; the step is what Caffe leaves in the diff."""
    momentum = float(param.momentum)
    delta = float(param.delta)
    if kind == "SGD":
        v = ew.add(ew.mul(history[0], momentum), ew.mul(g, lr))
        return v, [v]
    if kind == "Nesterov":
        v_prev = history[0]
        v = ew.add(ew.mul(v_prev, momentum), ew.mul(g, lr))
        step = ew.sub(ew.mul(v, float(_f32(1.0 + momentum))), ew.mul(v_prev, momentum))
        return step, [v]
    if kind == "AdaGrad":
        h = ew.add(history[0], ew.square(g))
        return ew.mul(ew.div(g, ew.add(ew.sqrt(h), delta)), lr), [h]
    if kind == "RMSProp":
        decay = float(param.rms_decay)
        h = ew.add(ew.mul(history[0], decay), ew.mul(ew.square(g), float(_f32(1.0 - decay))))
        return ew.mul(ew.div(g, ew.add(ew.sqrt(h), delta)), lr), [h]
    if kind == "AdaDelta":
        keep = float(_f32(1.0 - momentum))
        h = ew.add(ew.mul(history[0], momentum), ew.mul(ew.square(g), keep))
        ratio = ew.div(ew.add(history[1], delta), ew.add(h, delta))
        step0 = ew.mul(g, ew.sqrt(ratio))
        u = ew.add(ew.mul(history[1], momentum), ew.mul(ew.square(step0), keep))
        return ew.mul(step0, lr), [h, u]
    if kind == "Adam":
        beta1, beta2 = momentum, float(param.momentum2)
        m = ew.add(ew.mul(history[0], beta1), ew.mul(g, float(_f32(1.0 - beta1))))
        v = ew.add(ew.mul(history[1], beta2), ew.mul(ew.square(g), float(_f32(1.0 - beta2))))
        scale = ew.mul(lr, correction) if correction is not None else lr
        return ew.mul(ew.div(m, ew.add(ew.sqrt(v), delta)), scale), [m, v]
    raise CaffeError(f"unknown solver type {kind!r}; Caffe knows {', '.join(HISTORY_COUNT)}")


def history_names(kind: str, params: Sequence[str]) -> Dict[str, List[str]]:
    """Workspace entries of each param's histories: ``<param>@history<k>``."""
    return {p: [f"{p}@history{k}" for k in range(HISTORY_COUNT[kind])] for p in params}
