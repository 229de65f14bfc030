"""Optimizers with Keras 3's update formulas and defaults, as graph updates of one training step.

``updates(variables, grads)`` returns ``{param Value: new Value}`` for the step's compiled cgvm
Function: the new weights, the optimizer's slots (momentums, velocities...) and the iteration
count. Slots, the learning rate and the iteration count are Workspace entries, so a learning-rate
change (a callback, a schedule) needs no recompilation.

Keras formulas: SGD ``m = momentum*m - lr*g; w += m`` (nesterov ``w += momentum*m - lr*g``); Adam with
``alpha = lr*sqrt(1-b2^t)/(1-b1^t)`` and ``w -= alpha*m/(sqrt(v)+eps)``; weight decay (AdamW, or any
optimizer's ``weight_decay``) ``w -= w*wd*lr`` before the step.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ...ir.graph import Value
from ...ops import elementwise as ew
from ...ops import elementwise_math as em
from ...ops import reduce as red
from .backend import Variable, to_value, unique_name
from .serialization import KerasConfigError, Registry

registry = Registry("optimizer")


class LearningRateSchedule:
    """``schedule(step) -> learning rate``; evaluated in Python before each step."""

    def __call__(self, step: int) -> float:
        return 0.0

    def get_config(self) -> Dict[str, Any]:
        return {}


class ExponentialDecay(LearningRateSchedule):
    def __init__(self, initial_learning_rate: float, decay_steps: int, decay_rate: float, staircase: bool = False,
                 name: Optional[str] = None):
        self.initial_learning_rate, self.decay_steps = initial_learning_rate, decay_steps
        self.decay_rate, self.staircase = decay_rate, staircase

    def __call__(self, step: int) -> float:
        p = step / self.decay_steps
        if self.staircase:
            p = math.floor(p)
        return self.initial_learning_rate * self.decay_rate ** p

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate, "decay_steps": self.decay_steps,
                "decay_rate": self.decay_rate, "staircase": self.staircase}


class Optimizer:
    """Base: learning rate, iterations, gradient clipping and weight decay; subclasses define ``step``."""

    slot_names: Sequence[str] = ()

    def __init__(self, learning_rate: Any = 0.001, weight_decay: Optional[float] = None,
                 clipnorm: Optional[float] = None, clipvalue: Optional[float] = None,
                 global_clipnorm: Optional[float] = None, name: Optional[str] = None, **kwargs: Any):
        for k in ("use_ema", "ema_momentum", "ema_overwrite_frequency", "loss_scale_factor",
                  "gradient_accumulation_steps", "jit_compile", "is_legacy_optimizer", "decay"):
            kwargs.pop(k, None)
        if kwargs:
            raise TypeError(f"{type(self).__name__}: unexpected arguments {sorted(kwargs)}")
        self.name = name or unique_name(type(self).__name__.lower())
        self.weight_decay, self.clipnorm, self.clipvalue = weight_decay, clipnorm, clipvalue
        self.global_clipnorm = global_clipnorm
        if isinstance(learning_rate, dict):
            learning_rate = learning_rate.get("config", {}).get("value", 0.001)
        self.schedule = learning_rate if isinstance(learning_rate, LearningRateSchedule) else None
        initial = self.schedule(0) if self.schedule else float(learning_rate)
        self._lr = Variable(np.asarray(initial, np.float32), name="learning_rate",
                            path=f"keras/optimizer/{self.name}/learning_rate", trainable=False)
        self._iterations = Variable(np.asarray(0, np.int64), name="iteration",
                                    path=f"keras/optimizer/{self.name}/iteration", trainable=False)
        self._slots: Dict[str, Dict[str, Variable]] = {}

    # -- state
    @property
    def learning_rate(self) -> float:
        return float(self._lr.numpy())

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self._lr.assign(np.asarray(value, np.float32))

    lr = learning_rate

    @property
    def iterations(self) -> int:
        return int(self._iterations.numpy())

    @property
    def variables(self) -> List[Variable]:
        out = [self._iterations, self._lr]
        for slots in self._slots.values():
            out.extend(slots.values())
        return out

    def slot(self, var: Variable, kind: str, fill: float = 0.0) -> Variable:
        slots = self._slots.setdefault(var.path, {})
        if kind not in slots:
            slots[kind] = Variable(np.full(var.shape, fill, dtype=var.dtype), name=f"{var.name}_{kind}",
                                   path=f"keras/optimizer/{self.name}/{var.path}/{kind}", trainable=False)
        return slots[kind]

    def before_step(self) -> None:
        """Called by fit before each step: a schedule sets the learning rate of this step."""
        if self.schedule is not None:
            self.learning_rate = self.schedule(self.iterations)

    # -- the step as graph updates
    def updates(self, variables: Sequence[Variable], grads: Sequence[Value]) -> Dict[Value, Value]:
        grads = self._clip([to_value(g) for g in grads])
        lr = self._lr.value
        step = ew.add(ew.cast(self._iterations.value, dtype="float32"), 1.0)
        out: Dict[Value, Value] = {}
        for var, g in zip(variables, grads):
            w = var.value
            if g.dtype is not w.dtype:
                g = ew.cast(g, dtype=w.dtype)
            lr_w = lr if lr.dtype is w.dtype else ew.cast(lr, dtype=w.dtype)
            if self.weight_decay:
                w = ew.sub(w, ew.mul(w, ew.mul(lr_w, float(self.weight_decay))))
            slots = {k: self.slot(var, k, self.slot_fill(k)) for k in self.slot_names_for()}
            new_w, new_slots = self.step(w, g, lr_w, step, {k: s.value for k, s in slots.items()})
            if var.constraint is not None:
                new_w = to_value(var.constraint(new_w))
            out[var.value] = new_w
            for k, v in new_slots.items():
                out[slots[k].value] = v
        out[self._iterations.value] = ew.add(self._iterations.value, np.int64(1))
        return out

    def slot_names_for(self) -> Sequence[str]:
        return self.slot_names

    def slot_fill(self, kind: str) -> float:
        return 0.0

    def step(self, w: Value, g: Value, lr: Value, t: Value, slots: Dict[str, Value]):
        return ew.sub(w, ew.mul(g, lr)), {}

    def _clip(self, grads: List[Value]) -> List[Value]:
        if self.clipvalue is not None:
            grads = [ew.clip(g, lo=-float(self.clipvalue), hi=float(self.clipvalue)) for g in grads]
        if self.clipnorm is not None:
            grads = [_clip_by_norm(g, self.clipnorm) for g in grads]
        if self.global_clipnorm is not None and grads:
            total = em.sqrt(_sum_all([red.sum(ew.square(g)) for g in grads]))
            scale = ew.div(float(self.global_clipnorm), ew.maximum(total, float(self.global_clipnorm)))
            grads = [ew.mul(g, scale) for g in grads]
        return grads

    def get_config(self) -> Dict[str, Any]:
        return {"name": self.name, "learning_rate": self.learning_rate, "weight_decay": self.weight_decay,
                "clipnorm": self.clipnorm, "global_clipnorm": self.global_clipnorm, "clipvalue": self.clipvalue,
                "use_ema": False, "ema_momentum": 0.99, "ema_overwrite_frequency": None,
                "loss_scale_factor": None, "gradient_accumulation_steps": None}

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "Optimizer":
        config = dict(config)
        config.pop("name", None)
        return cls(**config)


def _sum_all(values: List[Value]) -> Value:
    acc = values[0]
    for v in values[1:]:
        acc = ew.add(acc, v)
    return acc


def _clip_by_norm(g: Value, clipnorm: float) -> Value:
    norm = em.sqrt(red.sum(ew.square(g)))
    return ew.mul(g, ew.div(float(clipnorm), ew.maximum(norm, float(clipnorm))))


@registry.register("sgd")
class SGD(Optimizer):
    def __init__(self, learning_rate: Any = 0.01, momentum: float = 0.0, nesterov: bool = False, **kwargs: Any):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.momentum, self.nesterov = float(momentum), nesterov

    def slot_names_for(self):
        return ("momentum",) if self.momentum else ()

    def step(self, w, g, lr, t, slots):
        if not self.momentum:
            return ew.sub(w, ew.mul(g, lr)), {}
        m = ew.sub(ew.mul(slots["momentum"], self.momentum), ew.mul(g, lr))
        if self.nesterov:
            return ew.add(w, ew.sub(ew.mul(m, self.momentum), ew.mul(g, lr))), {"momentum": m}
        return ew.add(w, m), {"momentum": m}

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "nesterov": self.nesterov}


@registry.register("adam")
class Adam(Optimizer):
    def __init__(self, learning_rate: Any = 0.001, beta_1: float = 0.9, beta_2: float = 0.999,
                 epsilon: float = 1e-7, amsgrad: bool = False, **kwargs: Any):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta_1, self.beta_2, self.epsilon, self.amsgrad = float(beta_1), float(beta_2), float(epsilon), amsgrad

    def slot_names_for(self):
        return ("momentum", "velocity", "velocity_hat") if self.amsgrad else ("momentum", "velocity")

    def step(self, w, g, lr, t, slots):
        t = ew.cast(t, dtype=w.dtype)
        b1p = ew.pow(self.beta_1, t)
        b2p = ew.pow(self.beta_2, t)
        alpha = ew.div(ew.mul(lr, em.sqrt(ew.sub(1.0, b2p))), ew.sub(1.0, b1p))
        m = ew.add(slots["momentum"], ew.mul(ew.sub(g, slots["momentum"]), 1.0 - self.beta_1))
        v = ew.add(slots["velocity"], ew.mul(ew.sub(ew.square(g), slots["velocity"]), 1.0 - self.beta_2))
        new = {"momentum": m, "velocity": v}
        if self.amsgrad:
            v = ew.maximum(slots["velocity_hat"], v)
            new["velocity_hat"] = v
        return ew.sub(w, ew.div(ew.mul(m, alpha), ew.add(em.sqrt(v), self.epsilon))), new

    def get_config(self):
        return {**super().get_config(), "beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                "amsgrad": self.amsgrad}


@registry.register("adamw")
class AdamW(Adam):
    def __init__(self, learning_rate: Any = 0.001, weight_decay: float = 0.004, **kwargs: Any):
        super().__init__(learning_rate=learning_rate, weight_decay=weight_decay, **kwargs)


@registry.register("rmsprop")
class RMSprop(Optimizer):
    def __init__(self, learning_rate: Any = 0.001, rho: float = 0.9, momentum: float = 0.0, epsilon: float = 1e-7,
                 centered: bool = False, **kwargs: Any):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.rho, self.momentum, self.epsilon, self.centered = float(rho), float(momentum), float(epsilon), centered

    def slot_names_for(self):
        names = ["velocity"]
        if self.momentum > 0:
            names.append("momentum")
        if self.centered:
            names.append("average_gradient")
        return names

    def step(self, w, g, lr, t, slots):
        rho = self.rho
        vel = ew.add(ew.mul(slots["velocity"], rho), ew.mul(ew.square(g), 1.0 - rho))
        new = {"velocity": vel}
        if self.centered:
            avg = ew.add(ew.mul(slots["average_gradient"], rho), ew.mul(g, 1.0 - rho))
            new["average_gradient"] = avg
            denom = ew.add(ew.sub(vel, ew.square(avg)), self.epsilon)
        else:
            denom = ew.add(vel, self.epsilon)
        increment = ew.div(ew.mul(g, lr), em.sqrt(denom))
        if self.momentum > 0:
            m = ew.add(ew.mul(slots["momentum"], self.momentum), increment)
            new["momentum"] = m
            return ew.sub(w, m), new
        return ew.sub(w, increment), new

    def get_config(self):
        return {**super().get_config(), "rho": self.rho, "momentum": self.momentum, "epsilon": self.epsilon,
                "centered": self.centered}


@registry.register("adagrad")
class Adagrad(Optimizer):
    def __init__(self, learning_rate: Any = 0.001, initial_accumulator_value: float = 0.1, epsilon: float = 1e-7,
                 **kwargs: Any):
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.initial_accumulator_value, self.epsilon = float(initial_accumulator_value), float(epsilon)

    slot_names = ("accumulator",)

    def slot_fill(self, kind):
        return self.initial_accumulator_value

    def step(self, w, g, lr, t, slots):
        acc = ew.add(slots["accumulator"], ew.square(g))
        return ew.sub(w, ew.div(ew.mul(g, lr), em.sqrt(ew.add(acc, self.epsilon)))), {"accumulator": acc}

    def get_config(self):
        return {**super().get_config(), "initial_accumulator_value": self.initial_accumulator_value,
                "epsilon": self.epsilon}


def get(identifier: Any) -> Optimizer:
    if isinstance(identifier, Optimizer):
        return identifier
    if isinstance(identifier, str):
        return registry.lookup(identifier.lower())()
    if isinstance(identifier, dict):
        cls = registry.lookup(identifier["class_name"].lower() if identifier["class_name"].lower()
                              in registry.classes else identifier["class_name"])
        return cls.from_config(identifier.get("config") or {})
    raise KerasConfigError(f"cannot use {identifier!r} as an optimizer")
