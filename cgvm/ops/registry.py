"""OpDef: an op declared once, with its type rule, kernel, gradient, fusion pattern and in-place options.

    relu = defop("relu", pattern=ELEMWISE, infer=same_as_input, inplace=((0, 0),), attrs={...})

    @relu.kernel
    def _(xp, x, *, negative_slope, out=None): ...     # NumPy and CuPy alike; writes into `out` if given

    @relu.grad
    def _(node, gy): ...                                # builds gradient nodes; returns one per input

An op whose kernel needs temporary memory declares how much (``@conv.scratch``, see
cgvm.ops.scratch): the memory planner then places it like a value alive during the call.

Calling an OpDef builds a node: ``relu(x, negative_slope=0.1)``.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..ir.builder import apply
from ..ir.opschema import OPS, OpSchema

# Fusion patterns, from most to least fusible (as NNVM/TVM name them).
ELEMWISE = "elemwise"      # same shape in and out, element by element
BROADCAST = "broadcast"    # element by element after broadcasting
INJECTIVE = "injective"    # each output element reads one input element (reshape, transpose, slice)
REDUCE = "reduce"
OPAQUE = "opaque"

#: (op, input position) pairs that read only the shape and dtype of that input ("like" operands):
#: passes may hand such a reader any value of the same type, and need not compute one for it
SHAPE_ONLY_INPUTS = {("sum_to_like", 1), ("reshape_like", 1), ("broadcast_like", 1), ("zeros_like", 0),
                     ("ones_like", 0), ("full_like", 0), ("shape_of", 0), ("steps_like", 1),
                     ("pad_steps_like", 1), ("place_first", 1)}

#: ops whose kernels run a GEMM on their operands (loop passes materialize and align what they read)
GEMM_OPS = frozenset({"matmul", "gemm_bias_act", "gemm"})

KernelFn = Callable[..., Any]
GradFn = Callable[..., Sequence[Any]]
ScratchFn = Callable[..., Union[int, Sequence[int]]]


class OpDef(OpSchema):
    """An op with everything needed to build, differentiate, optimize and run it."""

    def __init__(self, name: str, *, pattern: str = OPAQUE, inplace: Tuple[Tuple[int, int], ...] = (),
                 view: bool = False, writes_out: Optional[bool] = None, differentiable: bool = True,
                 ufunc: Optional[str] = None, stateful: bool = False, needs_runtime: bool = False,
                 multi_out: bool = False, **schema: Any):
        super().__init__(name, **schema)
        self.pattern = pattern
        self.inplace = tuple(inplace)
        self.view = view                  # output may alias input 0 (reshape, transpose, slicing)
        self.ufunc = ufunc                # kernel is xp.<ufunc> itself: no wrapper on the hot path
        self.writes_out = (not view) if writes_out is None else writes_out
        self.differentiable = differentiable
        self.stateful = stateful          # never folded or merged by CSE (random ops)
        self.needs_runtime = needs_runtime  # control flow: its factory gets a Runtime to run sub-graphs
        # several outputs, and the kernel takes ``out`` as a tuple (a buffer or None per output),
        # writing each given buffer whole: the planner plans each output
        self.multi_out = multi_out
        self._kernel: Optional[KernelFn] = None
        self._factory: Optional[Callable[..., KernelFn]] = None
        self._grad: Optional[GradFn] = None
        self._scratch: Optional[ScratchFn] = None

    # -- declaration decorators ------------------------------------------------
    def kernel(self, fn: KernelFn) -> KernelFn:
        """``fn(xp, *inputs, out=None, **attrs)``: the kernel for every array module."""
        self._kernel = fn
        return fn

    def kernel_factory(self, fn: Callable[..., KernelFn]) -> Callable[..., KernelFn]:
        """``fn(xp, **attrs) -> kernel(*inputs, out=None)``: precompute what attributes allow."""
        self._factory = fn
        return fn

    def grad(self, fn: GradFn) -> GradFn:
        """``fn(node, *output_grads) -> [grad per input]``; ``None`` stands for a zero gradient."""
        self._grad = fn
        return fn

    def scratch(self, fn: ScratchFn) -> ScratchFn:
        """``fn(in_types, **attrs) -> bytes``, or a tuple of byte counts for alternative methods,
        fastest first: the temporary memory the kernel takes for concrete input types.

        The planner places the first alternative that fits in memory no value holds during the
        call, and the VM passes that block to the kernel as ``scratch=`` (a uint8 array); the
        kernel runs the first method whose temporaries fit in it (cgvm.ops.scratch), and its
        fastest method, allocating, when it gets None.
        """
        self._scratch = fn
        return fn

    # -- use ---------------------------------------------------------------------
    def scratch_bytes(self, in_types: Sequence[Any], attrs: Mapping[str, Any]) -> Tuple[int, ...]:
        """Bytes of scratch of the kernel's methods for ``in_types``, fastest first (() for none)."""
        if self._scratch is None:
            return ()
        need = self._scratch(list(in_types), **attrs)
        return tuple(need) if isinstance(need, (tuple, list)) else ((need,) if need else ())

    @property
    def has_grad(self) -> bool:
        return self._grad is not None

    def build_grad(self, node: Any, gouts: Sequence[Any]) -> List[Any]:
        return list(self._grad(node, *gouts))  # type: ignore[misc]

    def bind(self, xp: Any, attrs: Mapping[str, Any], overrides: Optional[Mapping[str, Any]] = None,
             runtime: Any = None) -> KernelFn:
        """A callable ``k(*inputs, out=...)`` for array module ``xp`` with attributes pre-bound.

        ``runtime`` (needed by control-flow ops only) has ``compile(graph) -> run(list) -> list``.
        """
        if overrides and self.name in overrides:
            return overrides[self.name](xp, **attrs)
        if self.needs_runtime:
            if runtime is None:
                raise TypeError(f"op {self.name!r} runs sub-graphs and needs a runtime to bind")
            return self._factory(xp, runtime, **attrs)  # type: ignore[misc]
        if self.ufunc is not None and not attrs:
            return getattr(xp, self.ufunc)
        if self._factory is not None:
            return self._factory(xp, **attrs)
        if self._kernel is None:
            raise TypeError(f"op {self.name!r} has no kernel")
        return functools.partial(self._kernel, xp, **attrs) if attrs else functools.partial(self._kernel, xp)

    def __call__(self, *inputs: Any, name: Optional[str] = None, **attrs: Any):
        return apply(self, inputs, attrs, name=name)

    # an op is a registered singleton: graphs that hold it pickle and deep-copy it by name
    def __reduce__(self) -> Tuple[Any, Tuple[str]]:
        return lookup, (self.name,)

    def __copy__(self) -> "OpDef":
        return self

    def __deepcopy__(self, memo: Dict[int, Any]) -> "OpDef":
        return self


_gradient_builder: Optional[Callable[..., Any]] = None


def install_gradient_builder(fn: Callable[..., Any]) -> None:
    """Called by cgvm.autodiff: lets gradient rules of control-flow ops differentiate their sub-graphs
    without ops importing autodiff (which itself imports ops)."""
    global _gradient_builder
    _gradient_builder = fn


def subgraph_gradients(seeds: Mapping[Any, Any], wrt: Sequence[Any]) -> Dict[int, Any]:
    """``{id(value): gradient}`` of sum <seed_i, out_i> for each of ``wrt`` (see autodiff.grad_map)."""
    if _gradient_builder is None:
        raise RuntimeError("cgvm.autodiff is not loaded; import cgvm")
    return _gradient_builder(seeds, wrt)


def defop(name: str, **kwargs: Any) -> OpDef:
    """Declare an op; the registry refuses a second op of the same name."""
    return OpDef(name, **kwargs)


def lookup(name: str) -> OpDef:
    op = OPS.get(name)
    if op is None:
        raise KeyError(f"unknown op {name!r}")
    return op  # type: ignore[return-value]


def all_ops() -> Dict[str, OpDef]:
    return {k: v for k, v in OPS.items() if isinstance(v, OpDef)}
