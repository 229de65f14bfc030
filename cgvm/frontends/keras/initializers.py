"""Weight initializers with Keras' names, arguments and formulas (NumPy, drawn when a layer is built)."""
from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence, Tuple

import numpy as np

from .serialization import Registry

registry = Registry("initializer")
_global_rng = np.random.default_rng()


def set_random_seed(seed: int) -> None:
    """Seed the generator that unseeded initializers draw from (keras.utils.set_random_seed)."""
    global _global_rng
    _global_rng = np.random.default_rng(seed)
    np.random.seed(seed)


class Initializer:
    """Base: ``init(shape, dtype) -> ndarray``."""

    def __call__(self, shape: Sequence[int], dtype: str = "float32") -> np.ndarray:
        return np.asarray(self.draw(tuple(int(s) for s in shape)), dtype=dtype)

    def draw(self, shape: Tuple[int, ...]) -> np.ndarray:
        return np.zeros(shape)

    def get_config(self) -> Dict[str, Any]:
        return {}

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "Initializer":
        return cls(**config)


class _Seeded(Initializer):
    def __init__(self, seed: Optional[int] = None):
        self.seed = seed

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed) if self.seed is not None else _global_rng

    def get_config(self) -> Dict[str, Any]:
        return {"seed": self.seed}


@registry.register("zeros")
class Zeros(Initializer):
    pass


@registry.register("ones")
class Ones(Initializer):
    def draw(self, shape):
        return np.ones(shape)


@registry.register("constant")
class Constant(Initializer):
    def __init__(self, value: float = 0.0):
        self.value = value

    def draw(self, shape):
        return np.full(shape, self.value)

    def get_config(self):
        return {"value": self.value}


@registry.register("random_normal")
class RandomNormal(_Seeded):
    def __init__(self, mean: float = 0.0, stddev: float = 0.05, seed: Optional[int] = None):
        super().__init__(seed)
        self.mean, self.stddev = mean, stddev

    def draw(self, shape):
        return self.rng().normal(self.mean, self.stddev, shape)

    def get_config(self):
        return {"mean": self.mean, "stddev": self.stddev, "seed": self.seed}


@registry.register("random_uniform")
class RandomUniform(_Seeded):
    def __init__(self, minval: float = -0.05, maxval: float = 0.05, seed: Optional[int] = None):
        super().__init__(seed)
        self.minval, self.maxval = minval, maxval

    def draw(self, shape):
        return self.rng().uniform(self.minval, self.maxval, shape)

    def get_config(self):
        return {"minval": self.minval, "maxval": self.maxval, "seed": self.seed}


def _truncated_normal(rng: np.random.Generator, shape, mean: float, stddev: float) -> np.ndarray:
    """Normal samples redrawn until within two standard deviations (as Keras' truncated_normal)."""
    out = rng.normal(0.0, 1.0, shape)
    bad = np.abs(out) > 2.0
    while bad.any():
        out[bad] = rng.normal(0.0, 1.0, int(bad.sum()))
        bad = np.abs(out) > 2.0
    return mean + stddev * out


@registry.register("truncated_normal")
class TruncatedNormal(RandomNormal):
    def draw(self, shape):
        return _truncated_normal(self.rng(), shape, self.mean, self.stddev)


def compute_fans(shape: Tuple[int, ...]) -> Tuple[float, float]:
    """Keras' fan_in / fan_out: kernels are (..spatial.., in, out)."""
    if len(shape) == 0:
        return 1.0, 1.0
    if len(shape) == 1:
        return float(shape[0]), float(shape[0])
    if len(shape) == 2:
        return float(shape[0]), float(shape[1])
    receptive = float(np.prod(shape[:-2]))
    return shape[-2] * receptive, shape[-1] * receptive


@registry.register("variance_scaling")
class VarianceScaling(_Seeded):
    def __init__(self, scale: float = 1.0, mode: str = "fan_in", distribution: str = "truncated_normal",
                 seed: Optional[int] = None):
        super().__init__(seed)
        self.scale, self.mode, self.distribution = scale, mode, distribution

    def draw(self, shape):
        fan_in, fan_out = compute_fans(shape)
        n = {"fan_in": fan_in, "fan_out": fan_out, "fan_avg": (fan_in + fan_out) / 2.0}[self.mode]
        scale = self.scale / max(1.0, n)
        if self.distribution in ("truncated_normal", "normal"):
            return _truncated_normal(self.rng(), shape, 0.0, math.sqrt(scale) / 0.87962566103423978)
        if self.distribution == "untruncated_normal":
            return self.rng().normal(0.0, math.sqrt(scale), shape)
        limit = math.sqrt(3.0 * scale)
        return self.rng().uniform(-limit, limit, shape)

    def get_config(self):
        return {"scale": self.scale, "mode": self.mode, "distribution": self.distribution, "seed": self.seed}


def _variance_kind(name: str, scale: float, mode: str, distribution: str):
    class Kind(VarianceScaling):
        def __init__(self, seed: Optional[int] = None):
            super().__init__(scale, mode, distribution, seed)

        def get_config(self):
            return {"seed": self.seed}
    Kind.__name__ = Kind.__qualname__ = name
    return Kind


GlorotUniform = registry.register("glorot_uniform")(_variance_kind("GlorotUniform", 1.0, "fan_avg", "uniform"))
GlorotNormal = registry.register("glorot_normal")(_variance_kind("GlorotNormal", 1.0, "fan_avg", "truncated_normal"))
HeUniform = registry.register("he_uniform")(_variance_kind("HeUniform", 2.0, "fan_in", "uniform"))
HeNormal = registry.register("he_normal")(_variance_kind("HeNormal", 2.0, "fan_in", "truncated_normal"))
LecunUniform = registry.register("lecun_uniform")(_variance_kind("LecunUniform", 1.0, "fan_in", "uniform"))
LecunNormal = registry.register("lecun_normal")(_variance_kind("LecunNormal", 1.0, "fan_in", "truncated_normal"))


@registry.register("orthogonal")
class Orthogonal(_Seeded):
    def __init__(self, gain: float = 1.0, seed: Optional[int] = None):
        super().__init__(seed)
        self.gain = gain

    def draw(self, shape):
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        cols = shape[-1]
        flat = self.rng().normal(0.0, 1.0, (max(rows, cols), min(rows, cols)))
        q, r = np.linalg.qr(flat)
        q *= np.sign(np.diag(r))
        if rows < cols:
            q = q.T
        return self.gain * q[:rows, :cols].reshape(shape)

    def get_config(self):
        return {"gain": self.gain, "seed": self.seed}


@registry.register("identity")
class Identity(Initializer):
    def __init__(self, gain: float = 1.0):
        self.gain = gain

    def draw(self, shape):
        return self.gain * np.eye(*shape)

    def get_config(self):
        return {"gain": self.gain}


def get(identifier: Any) -> Initializer:
    """An initializer from a name, a config dict, an instance or a callable."""
    return registry.get(identifier)


def serialize(obj: Any) -> Any:
    return registry.serialize(obj, "keras.initializers")
