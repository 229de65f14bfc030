"""Merge layers called on a list of tensors: Concatenate, Add, Subtract, Multiply, Average, Maximum, Minimum, Dot."""
from __future__ import annotations

from functools import reduce
from typing import Any, List

from ....errors import GraphBuildError
from ....ir.graph import Value
from ....ops import elementwise as ew
from ....ops import elementwise_math as em
from ....ops import linalg
from ....ops import reduce as red
from ....ops import join
from ....ops import shape as shp
from ..backend import to_value
from .base import Layer, registry


class _Merge(Layer):
    supports_masking = True

    def compute_mask(self, inputs, mask=None):
        """Keras' rule for element-wise merges: no mask unless every input has one, then their OR."""
        if mask is None or not isinstance(mask, (list, tuple)) or any(m is None for m in mask):
            return None
        return reduce(ew.logical_or, [to_value(m) for m in mask])

    def _values(self, inputs: Any) -> List[Value]:
        if not isinstance(inputs, (list, tuple)) or len(inputs) < 1:
            raise GraphBuildError(f"{type(self).__name__} layer {self.name!r} must be called on a list of tensors")
        return [to_value(i) for i in inputs]

    def call(self, inputs):
        return self.merge(self._values(inputs))


@registry.register()
class Add(_Merge):
    def merge(self, xs):
        return ew.add_n(xs)


@registry.register()
class Subtract(_Merge):
    def compute_mask(self, inputs, mask=None):
        return None

    def merge(self, xs):
        if len(xs) != 2:
            raise GraphBuildError(f"Subtract layer {self.name!r} takes exactly 2 tensors, got {len(xs)}")
        return ew.sub(xs[0], xs[1])


@registry.register()
class Multiply(_Merge):
    def merge(self, xs):
        return reduce(ew.mul, xs)


@registry.register()
class Average(_Merge):
    def merge(self, xs):
        return ew.div(ew.add_n(xs), float(len(xs)))


@registry.register()
class Maximum(_Merge):
    def merge(self, xs):
        return reduce(ew.maximum, xs)


@registry.register()
class Minimum(_Merge):
    def merge(self, xs):
        return reduce(ew.minimum, xs)


@registry.register()
class Concatenate(_Merge):
    def __init__(self, axis: int = -1, **kwargs: Any):
        super().__init__(**kwargs)
        self.axis = int(axis)

    def merge(self, xs):
        return join.concat(*xs, axis=self.axis)

    def compute_mask(self, inputs, mask=None):
        """Keras' rule: masks widened to their inputs' shapes (an unmasked input counts as all true),
        concatenated like the inputs, then any() over the last axis."""
        if mask is None or not isinstance(mask, (list, tuple)) or all(m is None for m in mask):
            return None
        full = []
        for x, m in zip(self._values(inputs), mask):
            if m is None:
                full.append(ew.ne(shp.ones_like(x), 0.0))
                continue
            m = to_value(m)
            while m.ndim < x.ndim:
                m = shp.expand_dims(m, axis=[m.ndim])
            full.append(ew.logical_or(m, ew.ne(shp.zeros_like(x), 0.0)))
        joined = ew.cast(join.concat(*full, axis=self.axis), dtype="float32")
        return ew.gt(red.max(joined, axis=[joined.ndim - 1]), 0.0)

    def get_config(self):
        return {**super().get_config(), "axis": self.axis}


@registry.register()
class Dot(_Merge):
    """Batched dot product along ``axes`` of two tensors (optionally L2-normalized first)."""

    def __init__(self, axes: Any, normalize: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.axes, self.normalize = axes, normalize

    def compute_mask(self, inputs, mask=None):
        return None

    def merge(self, xs):
        a, b = xs
        axes = self.axes if isinstance(self.axes, (list, tuple)) else (self.axes, self.axes)
        ax_a, ax_b = axes[0] % a.ndim, axes[1] % b.ndim
        if self.normalize:
            a = ew.div(a, em.sqrt(ew.add(red.sum(ew.square(a), axis=[ax_a], keepdims=True), 1e-12)))
            b = ew.div(b, em.sqrt(ew.add(red.sum(ew.square(b), axis=[ax_b], keepdims=True), 1e-12)))
        if a.ndim == 2 and b.ndim == 2:
            return red.sum(ew.mul(a, b), axis=[1], keepdims=True)
        a = shp.transpose(a, perm=[0] + [i for i in range(1, a.ndim) if i != ax_a] + [ax_a])
        b = shp.transpose(b, perm=[0, ax_b] + [i for i in range(1, b.ndim) if i != ax_b])
        return linalg.matmul(a, b)

    def get_config(self):
        return {**super().get_config(), "axes": self.axes, "normalize": self.normalize}


def add(inputs, **kwargs):
    return Add(**kwargs)(inputs)


def concatenate(inputs, axis=-1, **kwargs):
    return Concatenate(axis=axis, **kwargs)(inputs)


def multiply(inputs, **kwargs):
    return Multiply(**kwargs)(inputs)


def average(inputs, **kwargs):
    return Average(**kwargs)(inputs)


def subtract(inputs, **kwargs):
    return Subtract(**kwargs)(inputs)
