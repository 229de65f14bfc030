"""OpDef: an op declared once, with its type rule, kernel, gradient, fusion pattern and in-place options.

    relu = defop("relu", pattern=ELEMWISE, infer=same_as_input, inplace=((0, 0),), attrs={...})

    @relu.kernel
    def _(xp, x, *, negative_slope, out=None): ...     # NumPy and CuPy alike; writes into `out` if given

    @relu.grad
    def _(node, gy): ...                                # builds gradient nodes; returns one per input

An op whose kernel needs temporary memory declares how much (``@conv.scratch``, see
cgvm.ops.kernels.scratch): the memory planner then places it like a value alive during the call.

Every fact a compiler pass needs about an op is declared here too, so that a pass asks the op
and never tests its name:

    shape_only=(1,)        input positions read for their shape and dtype alone ("like" operands)
    runs_gemm=True         the kernel runs a GEMM on its operands (loop passes align what it reads)
    nonnegative=True       no result element is ever negative (simplify drops abs/relu of it); or a
                           callable node -> bool where it depends on attributes
    fill=0.0               the result holds this one value everywhere (zeros_like, ones_like)
    activation="tanh"      the op is an activation a fused epilogue can apply (or a callable
                           node -> name or None, for ops where it depends on attributes)
    @op.identity_when      fn(in_types, out_type) -> whether the op returns input 0 unchanged
    @op.lowering           fn(node) -> ufunc steps (cgvm.ops.ufunc_steps), or None: how the op
                           runs inside a fused elementwise chain (ops with ``ufunc=`` need none)
    @op.epilogue_into(F, bias_after=add)  fn(node, act) -> attributes of the fused op F that
                           computes this op's result (+ the bias add) + activation ``act``, or None
    @op.may_alias          fn(node) -> per output, the input positions whose memory it may share
                           (default: every input, for views and ops that hand back arrays of their
                           own choosing; none otherwise)
    @op.over_steps         fn(node, stepped) -> attributes with which the op computes every step of a
                           loop at once when the inputs flagged in ``stepped`` gain a leading axis of
                           steps (the others loop-invariant), or None (loop push-out)
    @op.numba_lowering     fn(node, em, ins, outs) -> False | None: the op as Numba source inside a
                           compiled loop (cgvm.ops.loop_code); elementwise ops with ufunc steps need none

Calling an OpDef builds a node: ``relu(x, negative_slope=0.1)``.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

from ..ir.builder import apply
from ..ir.opschema import OPS, OpSchema, get_op
from .ufunc_steps import UFUNC_ARITY

# Fusion patterns (as NNVM/TVM name them): the ones a pass reads. Elementwise fusion, loop
# push-out and transpose sinking take ELEMWISE and BROADCAST ops; everything else is OPAQUE.
ELEMWISE = "elemwise"      # same shape in and out, element by element
BROADCAST = "broadcast"    # element by element after broadcasting
OPAQUE = "opaque"
# INJECTIVE and REDUCE were declared by ops but read by no pass: they now mean OPAQUE, and stay
# importable for one release so that ops declared elsewhere keep working
INJECTIVE = REDUCE = OPAQUE

KernelFn = Callable[..., Any]
GradFn = Callable[..., Sequence[Any]]
ScratchFn = Callable[..., Union[int, Sequence[int]]]
IdentityFn = Callable[[Sequence[Any], Any], bool]         # (input types, output type) -> bool
LoweringFn = Callable[[Any], Optional[List[Tuple[str, tuple]]]]   # node -> ufunc steps or None
NumbaLoweringFn = Callable[..., Optional[bool]]   # (node, emitter, input bufs, output bufs) -> False: unsupported
EpilogueAttrsFn = Callable[[Any, str], Optional[Dict[str, Any]]]  # (node, activation) -> attrs or None
OverStepsFn = Callable[[Any, Tuple[bool, ...]], Optional[Dict[str, Any]]]  # (node, stepped) -> attrs or None


class Epilogue(NamedTuple):
    """How a fused op (``fused``) finishes this op's result: a bias added by op ``bias_after`` (if
    set), then an activation."""
    fused: "OpDef"
    bias_after: Optional["OpDef"]
    attrs: EpilogueAttrsFn


class OpDef(OpSchema):
    """An op with everything needed to build, differentiate, optimize and run it."""

    def __init__(self, name: str, *, pattern: str = OPAQUE, inplace: Tuple[Tuple[int, int], ...] = (),
                 view: bool = False, writes_out: Optional[bool] = None, differentiable: bool = True,
                 ufunc: Optional[str] = None, stateful: bool = False, needs_runtime: bool = False,
                 multi_out: bool = False, shape_only: Sequence[int] = (), runs_gemm: bool = False,
                 nonnegative: Union[bool, Callable[[Any], bool]] = False, fill: Optional[float] = None,
                 activation: Union[None, str, Callable[[Any], Optional[str]]] = None, fresh_out: bool = False,
                 **schema: Any):
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
        self.shape_only = frozenset(shape_only)   # input positions read for shape and dtype only
        self.runs_gemm = runs_gemm
        # given no buffer, the kernel works out its result's shape (a broadcast of every operand),
        # which costs more than an allocation: where the shape is known and no buffer is planned
        # (a program's outputs) the VM passes it a fresh array of that shape
        self.fresh_out = fresh_out
        self._nonnegative = nonnegative
        self.fill = fill
        self._activation = activation
        self._identity_when: Optional[IdentityFn] = None
        self._lowering: Optional[LoweringFn] = None
        self.numba_code: Optional[NumbaLoweringFn] = None   # set by @op.numba_lowering
        self.epilogue: Optional[Epilogue] = None   # set by @op.epilogue_into
        self._over_steps: Optional[OverStepsFn] = None
        self._may_alias: Optional[Callable[[Any], Sequence[Sequence[int]]]] = None
        self._kernel: Optional[KernelFn] = None
        self._factory: Optional[Callable[..., KernelFn]] = None
        self._grad: Optional[GradFn] = None
        self._scratch: Optional[ScratchFn] = None
        self._typed_kernel: Optional[Callable[..., Optional[KernelFn]]] = None

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
        kernel runs the first method whose temporaries fit in it (cgvm.ops.kernels.scratch), and its
        fastest method, allocating, when it gets None.
        """
        self._scratch = fn
        return fn

    def kernel_for_types(self, fn: Callable[..., Optional[KernelFn]]) -> Callable[..., Optional[KernelFn]]:
        """``fn(xp, in_types, out_types, **attrs) -> kernel | None``: a kernel chosen once per input
        signature, for concrete types (None: the bound kernel). For entry points that cost less
        on some shapes (a tiny matrix product through ``numpy.dot``); it must compute the same values."""
        self._typed_kernel = fn
        return fn

    def identity_when(self, fn: IdentityFn) -> IdentityFn:
        """``fn(in_types, out_type) -> bool``: for these concrete types the op returns input 0 as is
        (per-signature specialization then aliases the result to it)."""
        self._identity_when = fn
        return fn

    def lowering(self, fn: LoweringFn) -> LoweringFn:
        """``fn(node) -> [(ufunc, operands), ...] | None``: the node as ufunc steps (cgvm.ops.ufunc_steps)
        over its input positions. Only the first step may read inputs; later steps read ``ACC``."""
        self._lowering = fn
        return fn

    def numba_lowering(self, fn: NumbaLoweringFn) -> NumbaLoweringFn:
        """``fn(node, em, ins, outs) -> False | None``: write the node as Numba source through the
        emitter ``em`` (cgvm.ops.loop_code), reading the buffers ``ins`` and filling ``outs`` (concrete
        shapes); False where it cannot for these types. Used by the compiled loop tier
        (cgvm.ops.kernels.scan_jit); elementwise ops that have ufunc steps are covered without one."""
        self.numba_code = fn
        return fn

    def epilogue_into(self, fused: "OpDef", *, bias_after: Optional["OpDef"] = None
                      ) -> Callable[[EpilogueAttrsFn], EpilogueAttrsFn]:
        """``@master.epilogue_into(fused_op, bias_after=add)`` on ``fn(node, act) -> attrs | None``: the
        fused op computes this op's result (plus the bias that op ``bias_after`` adds to it, where
        given) and activation ``act`` in one kernel, from ``node``'s inputs (then the bias) and the
        returned attributes; None where it cannot for this node."""
        def deco(fn: EpilogueAttrsFn) -> EpilogueAttrsFn:
            self.epilogue = Epilogue(fused, bias_after, fn)
            return fn
        return deco

    def over_steps(self, fn: OverStepsFn) -> OverStepsFn:
        """``fn(node, stepped) -> attrs | None``: the attributes with which this op, given every step's
        value of the inputs flagged in ``stepped`` stacked along a new leading axis (the other inputs
        unchanged, loop-invariant), computes every step's result stacked the same way; None where it
        cannot for this node. Loop push-out moves such work out of scan bodies."""
        self._over_steps = fn
        return fn

    def may_alias(self, fn: Callable[[Any], Sequence[Sequence[int]]]) -> Callable[[Any], Sequence[Sequence[int]]]:
        """``fn(node) -> [input positions, per output]``: which inputs' memory each result may share,
        for an op that is a view or writes no ``out`` but knows better than "any of them"."""
        self._may_alias = fn
        return fn

    # -- facts passes ask --------------------------------------------------------
    def aliased_inputs(self, node: Any) -> List[Tuple[int, ...]]:
        """Per output of ``node``, the input positions whose memory it may share."""
        if self._may_alias is not None:
            return [tuple(p) for p in self._may_alias(node)]
        every = tuple(range(len(node.inputs))) if self.view or not self.writes_out else ()
        return [every] * len(node.outputs)

    def attrs_over_steps(self, node: Any, stepped: Sequence[bool]) -> Optional[Dict[str, Any]]:
        """The node's attributes for computing all steps at once (see ``over_steps``), or None."""
        return None if self._over_steps is None else self._over_steps(node, tuple(stepped))

    def reads_only_shape(self, position: int) -> bool:
        """Whether input ``position`` is read for its shape and dtype alone: passes may hand the op
        any value of that type there, and need not compute one for it."""
        return position in self.shape_only

    def is_identity(self, in_types: Sequence[Any], out_type: Any) -> bool:
        """Whether, for these concrete types, the op returns input 0 unchanged."""
        return self._identity_when is not None and bool(self._identity_when(in_types, out_type))

    def lower(self, node: Any) -> Optional[List[Tuple[str, tuple]]]:
        """The node as ufunc steps for a fused chain (None: the op has no lowering here)."""
        return None if self._lowering is None else self._lowering(node)

    def elementwise_steps(self, node: Any) -> Optional[List[Tuple[str, tuple]]]:
        """The node as ufunc steps over its input positions, or None: a one-ufunc op without
        attributes is its ufunc, another elementwise op has its ``@lowering`` (or none). The one
        rule fusion (cgvm.compiler.fuse) and the compiled loop tier read."""
        if len(node.outputs) != 1 or self.pattern not in (ELEMWISE, BROADCAST) or self.stateful:
            return None
        if self.ufunc in UFUNC_ARITY and not node.attrs and UFUNC_ARITY[self.ufunc] == len(node.inputs):
            return [(self.ufunc, tuple(range(len(node.inputs))))]
        return self.lower(node)

    def is_nonnegative(self, node: Any) -> bool:
        """Whether no element of ``node``'s result is ever negative."""
        fact = self._nonnegative
        return bool(fact(node) if callable(fact) else fact)

    @property
    def may_be_identity(self) -> bool:
        """Whether the op has an ``identity_when`` rule at all (ask ``is_identity`` for given types)."""
        return self._identity_when is not None

    def activation_of(self, node: Any) -> Optional[str]:
        """The activation name a fused epilogue applies for this node, or None if it is not one."""
        act = self._activation
        return act(node) if callable(act) else act

    # -- use ---------------------------------------------------------------------
    def typed_kernel(self, xp: Any, attrs: Mapping[str, Any], in_types: Sequence[Any],
                     out_types: Sequence[Any]) -> Optional[KernelFn]:
        """The kernel ``@kernel_for_types`` picks for these concrete types, or None."""
        if self._typed_kernel is None:
            return None
        return self._typed_kernel(xp, list(in_types), list(out_types), **attrs)

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

    def bind(self, xp: Any, attrs: Mapping[str, Any], runtime: Any = None) -> KernelFn:
        """A callable ``k(*inputs, out=...)`` for array module ``xp`` with attributes pre-bound.

        ``runtime`` (needed by control-flow ops only) has ``compile(graph) -> run(list) -> list``.
        """
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


def same_type_as_input(in_types: Sequence[Any], out_type: Any) -> bool:
    """An ``identity_when`` rule: the op returns input 0 unchanged when the result has its type."""
    return in_types[0] == out_type


def defop(name: str, **kwargs: Any) -> OpDef:
    """Declare an op; the registry refuses a second op of the same name."""
    return OpDef(name, **kwargs)


#: the op named ``name`` (KeyError if none): the IR's one op table, read the one way
lookup = get_op


def all_ops() -> Dict[str, OpDef]:
    return {k: v for k, v in OPS.items() if isinstance(v, OpDef)}


def __getattr__(name: str) -> Any:
    """The tables this module had before the facts moved into the ops, derived from them (kept
    for one release): SHAPE_ONLY_INPUTS {(op name, position)} and GEMM_OPS {op name}."""
    if name == "SHAPE_ONLY_INPUTS":
        return {(op.name, k) for op in all_ops().values() for k in op.shape_only}
    if name == "GEMM_OPS":
        return frozenset(op.name for op in all_ops().values() if op.runs_gemm)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
