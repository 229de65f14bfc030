"""``theano.function``: Theano's calling conventions over ``cgvm.compiled_function.Function``.

Everything is decided at compile time: the argument order and names, defaults, which inputs
need checks beyond the fast path, and which results must be copied because they would alias an
input, a shared variable's storage, a constant or another result. A call then only converts
its arguments, runs the program and applies the updates.

Semantics (Theano's): a single output gives an array and a list gives a list; updates are
computed from the values before the call and written after all outputs; ``givens`` substitute
variables before compiling; inputs missing from ``inputs`` raise MissingInputError and unused
ones UnusedInputError; wrong arguments raise before any kernel runs.
"""
from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...errors import InputError, MissingInputError, UnusedInputError, apply_policy
from ...compiled_function import Function as CoreFunction
from ...ir.builder import rebuild
from ...ir.graph import CONST, INPUT, PARAM, Value, toposort
from ...vm.workspace import default_workspace
from .config import config
from .shared import SharedVariable
from .var import SHARED_BY_VALUE, TensorVariable, as_tensor_variable, convert_input, wrap

__all__ = ["function", "Function", "In", "Out", "Mode", "BadArgument", "MissingInputError", "UnusedInputError"]


class BadArgument(InputError, TypeError):
    """Arguments of a call do not fit the function (count, name, dtype, rank)."""


class In:
    """An input with options: ``In(x, name=, value=, strict=, allow_downcast=, borrow=, mutable=)``."""

    def __init__(self, variable: TensorVariable, name: Optional[str] = None, value: Any = None,
                 update: Any = None, mutable: bool = False, strict: bool = False,
                 allow_downcast: Optional[bool] = None, autoname: bool = True, implicit: Optional[bool] = None,
                 borrow: bool = False, shared: bool = False):
        self.variable = variable
        self.name = name if name is not None else (variable.name if autoname else None)
        self.value = value
        self.update = update
        self.mutable = mutable
        self.strict = strict
        self.allow_downcast = allow_downcast
        self.borrow = borrow


class Out:
    """An output with options: ``Out(y, borrow=True)`` may return an internal buffer (no copy)."""

    def __init__(self, variable: TensorVariable, borrow: bool = False):
        self.variable = variable
        self.borrow = borrow


class Mode:
    """Compilation mode: ``Mode(linker=, optimizer=)``; ``excluding``/``including`` keep the interface."""

    def __init__(self, linker: Any = None, optimizer: Any = "fast_run"):
        self.linker = linker
        self.optimizer = optimizer

    def excluding(self, *tags: str) -> "Mode":
        return self

    def including(self, *tags: str) -> "Mode":
        return self

    def requiring(self, *tags: str) -> "Mode":
        return self


def _mode_options(mode: Any) -> Dict[str, Any]:
    mode = config.mode if mode is None else mode
    optimizer = getattr(mode, "optimizer", None) if isinstance(mode, Mode) else None
    if mode in ("DebugMode", "DEBUG_MODE"):
        return {"debug": True}
    if mode == "FAST_COMPILE" or optimizer in (None, "None") and isinstance(mode, Mode):
        return {"passes": ["prune"]}
    return {}


class FunctionGraph:
    """``f.maker.fgraph``: the optimized graph, in Theano's vocabulary."""

    def __init__(self, graph: Any):
        self.graph = graph
        self.inputs = [wrap(v) for v in graph.inputs]
        self.outputs = [wrap(v) for v in graph.outputs]

    @property
    def apply_nodes(self) -> set:
        return set(self.graph.nodes)

    def toposort(self) -> list:
        return list(self.graph.nodes)

    def __str__(self) -> str:
        return str(self.graph)


class _Maker:
    def __init__(self, fgraph: FunctionGraph, inputs: List[In], mode: Any):
        self.fgraph = fgraph
        self.inputs = inputs
        self.mode = mode


def _external_root(v: Value) -> Value:
    """The value whose memory ``v`` may share: follow view ops back to their source."""
    while v.node is not None and v.node.op.view:
        v = v.node.inputs[0]
    return v


class Function:
    """A compiled Theano function."""

    def __init__(self, ins: List[In], outs: List[Any], single: bool, updates: List[Tuple[SharedVariable, Value]],
                 *, name: Optional[str], mode: Any, trust_input: bool, allow_input_downcast: Optional[bool],
                 spec: Dict[str, Any], workspace: Any):
        self.name = name
        self.trust_input = trust_input
        self._spec = spec
        self._single = single
        self._ins = ins
        self._n_out = len(outs)
        out_values = [o[0] for o in outs]
        self._updates = updates
        core = CoreFunction([i.variable.value for i in ins], out_values,
                            updates={s.value: v for s, v in updates}, workspace=workspace,
                            name=name or "theano_function", **_mode_options(mode))
        self._core = core
        # the core's frames and update recycling: an update's kernel writes into the array the
        # update before last left, when nothing else holds it (no fresh multi-MiB array per call)
        exe = core.executable
        self._frames, self._key, self._frame_for = exe.frames, exe.key, exe.frame_for
        self._apply_update = core._apply_update
        self._workspace = core.workspace
        self._update_keys = [s.key for s, _ in updates]
        self._array_type = core.workspace.backend.xp.ndarray
        self._asarray = core.workspace.backend.asarray
        self.maker = _Maker(FunctionGraph(core.graph), ins, mode)
        # argument handling, decided once
        self._n_in = len(ins)
        self._types = [i.variable.value.type for i in ins]
        self._np_dtypes = [t.dtype.np for t in self._types]
        self._ndims = [t.ndim for t in self._types]
        self._fixed = [any(d is not None for d in t.shape) for t in self._types]
        self._downcast = [i.allow_downcast if i.allow_downcast is not None else allow_input_downcast for i in ins]
        self._positions = {i.name: k for k, i in enumerate(ins) if i.name is not None}
        self._defaults = {k: i.value for k, i in enumerate(ins) if i.value is not None}
        self._checks = tuple(enumerate(zip(self._np_dtypes, self._ndims, self._fixed)))
        self._copy = self._plan_copies(core.graph, [o[1] for o in outs])

    # -- compile-time analysis --------------------------------------------------------
    def _plan_copies(self, graph: Any, borrow: Sequence[bool]) -> Tuple[int, ...]:
        """Result indices to copy so that no result aliases an input, storage or another result."""
        results = list(graph.outputs)
        n_out = self._n_out
        seen: Dict[int, int] = {}
        copy: List[int] = []
        # update results first: they will become shared storage
        order = list(range(n_out, len(results))) + list(range(n_out))
        for i in order:
            root = _external_root(results[i])
            is_update = i >= n_out
            external = root.kind in (INPUT, CONST) or (root.kind == PARAM and (
                not is_update or root.name != self._update_keys[i - n_out]))
            if not is_update and root.kind == PARAM:
                external = True
            shared_with_other = id(root) in seen
            if (external or shared_with_other) and (is_update or not borrow[i]):
                copy.append(i)
            else:
                seen[id(root)] = i
        return tuple(sorted(copy))

    # -- calling ----------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != self._n_in:
            args = self._bind(args, kwargs)
        if self.trust_input:
            arrays = list(args)
        else:
            arrays = list(args)
            for k, (d, n, fixed) in self._checks:
                a = arrays[k]
                if type(a) is not np.ndarray or a.dtype != d or a.ndim != n or fixed:
                    arrays[k] = self._convert(k, a)
        frame = self._frames.get(self._key(arrays)) or self._frame_for(arrays)
        results = list(frame.run(*arrays))
        arr_t = self._array_type
        for k, r in enumerate(results):
            if type(r) is not arr_t:
                results[k] = self._asarray(r)
        for k in self._copy:
            results[k] = results[k].copy()
        if self._update_keys:
            n = self._n_out
            bin = frame.recycle_bin
            for k, (key, value) in enumerate(zip(self._update_keys, results[n:])):
                self._apply_update(bin, k, key, value)
            del results[n:]
        return results[0] if self._single else results

    def _bind(self, args: Sequence[Any], kwargs: Dict[str, Any]) -> List[Any]:
        n = self._n_in
        if len(args) > n:
            raise BadArgument(f"{self._label()} takes {n} argument(s), got {len(args)}")
        slots: List[Any] = list(args) + [_MISSING] * (n - len(args))
        for key, value in kwargs.items():
            k = self._positions.get(key)
            if k is None:
                raise BadArgument(f"{self._label()} has no input named {key!r}; inputs: "
                                  f"{[i.name for i in self._ins]}")
            if slots[k] is not _MISSING:
                raise BadArgument(f"{self._label()} got input {key!r} twice")
            slots[k] = value
        for k, v in enumerate(slots):
            if v is _MISSING:
                if k in self._defaults:
                    slots[k] = self._defaults[k]
                else:
                    raise BadArgument(f"{self._label()}: missing argument {k} "
                                      f"({self._ins[k].name or 'unnamed'})")
        return slots

    def _convert(self, k: int, a: Any) -> Any:
        what = f"{self._label()}: argument {k}" + (f" ({self._ins[k].name})" if self._ins[k].name else "")
        try:
            arr = convert_input(a, self._types[k], strict=self._ins[k].strict, allow_downcast=self._downcast[k],
                                what=what)
        except TypeError as exc:
            raise BadArgument(str(exc)) from None
        return arr if self._array_type is np.ndarray else self._asarray(arr)

    def _label(self) -> str:
        return f"function {self.name!r}" if self.name else "function"

    # -- Theano's Function interface --------------------------------------------------
    def copy(self, share_memory: bool = False, swap: Optional[Dict[Any, Any]] = None,
             delete_updates: bool = False, name: Optional[str] = None, profile: Any = None) -> "Function":
        """A new function from the same definition; ``swap`` replaces shared variables."""
        spec = dict(self._spec)
        if swap:
            givens = list(spec.get("givens") or [])
            givens += list(swap.items())
            spec["givens"] = givens
            if spec.get("updates"):
                spec["updates"] = [(swap.get(t, t), v) for t, v in _pairs(spec["updates"])]
        if delete_updates:
            spec["updates"] = None
            spec["no_default_updates"] = True
        if name is not None:
            spec["name"] = name
        return function(**spec)

    def free(self) -> None:
        """Drop cached buffers (memory plans are rebuilt on the next call)."""
        self._core.executable.frames().clear()

    def get_shared(self) -> List[SharedVariable]:
        found = []
        for p in self._core.graph.params:
            ref = SHARED_BY_VALUE.get(id(p))
            if ref is not None and ref() is not None:
                found.append(ref())
        return found

    def dprint(self, **kwargs: Any) -> Any:
        from .printing import debugprint

        return debugprint(self, **kwargs)

    def write_graph(self, log_dir: str, *, before_passes: bool = True) -> Any:
        """Write the graph for TensorBoard (after the passes, and as written): see cgvm.board."""
        from ...board import write_graph

        return write_graph(self, log_dir, before_passes=before_passes)

    @property
    def param_labels(self) -> Dict[str, str]:
        """Workspace entry -> shared variable name, for the parameters that have one."""
        return {s.key: s.name for s in self.get_shared() if s.name}

    @property
    def graph(self) -> Any:
        """The optimized cgvm graph."""
        return self._core.graph

    @property
    def core(self) -> CoreFunction:
        return self._core

    def __repr__(self) -> str:
        return f"<theano Function {self.name or ''}: {len(self._core.graph.nodes)} nodes>"

    def __reduce__(self) -> Tuple[Any, Tuple[Dict[str, Any]]]:
        """Pickled (and deep-copied) as its definition, compiled again when loaded.

        The graph's shared variables travel with it, each with a copy of its value, as Theano's
        pickled functions carry their storage.
        """
        spec = dict(self._spec)
        if spec.get("workspace") is default_workspace():
            spec["workspace"] = None
        return _function_from_spec, (spec,)


def _function_from_spec(spec: Dict[str, Any]) -> "Function":
    return function(**spec)


_MISSING = object()


def _pairs(updates: Any) -> List[Tuple[Any, Any]]:
    if updates is None:
        return []
    if isinstance(updates, dict):
        if not isinstance(updates, OrderedDict) and len(updates) > 1 and type(updates) is not dict:
            warnings.warn("updates given as an unordered mapping", stacklevel=3)
        return list(updates.items())
    return [tuple(p) for p in updates]


def _as_in(x: Any) -> In:
    i = x if isinstance(x, In) else In(x)
    if isinstance(i.variable, SharedVariable):
        raise TypeError(f"cannot take shared variable {i.variable!r} as an explicit input; it is an implicit "
                        "input (use givens= to substitute it)")
    if not isinstance(i.variable, TensorVariable):
        raise TypeError(f"function inputs must be symbolic variables, got {type(i.variable).__name__}")
    if i.variable.value.kind == CONST:
        raise TypeError(f"a constant ({i.variable!r}) cannot be a function input")
    return i


def _check_update(target: Any, expr: Any) -> Value:
    """The update's value; TypeError unless it has the shared variable's type (Theano's rule).

    The dtype must be the same (a float32 update of a float64 variable is refused, as in
    Theano: cast it); the update may not make a dimension broadcastable (static length 1) that
    the variable's type leaves free, nor contradict a fixed length.
    """
    if not isinstance(target, SharedVariable):
        raise TypeError(f"update target {target!r} must be a shared variable")
    if not isinstance(expr, TensorVariable):
        expr = as_tensor_variable(np.asarray(expr, dtype=target.dtype))
    t, e = target.value.type, expr.value.type
    if t.ndim != e.ndim:
        raise TypeError(f"an update must have the same type as the shared variable {target!r} ({t!r}): the "
                        f"update has {e.ndim} dimensions instead of {t.ndim}")
    for k, (d, s) in enumerate(zip(t.shape, e.shape)):
        if d is None and s == 1:
            raise TypeError(f"an update must have the same type as the shared variable {target!r} ({t!r}): the "
                            f"update {e!r} makes dimension {k} broadcastable; use T.unbroadcast(update, {k}) or "
                            "give the shared variable broadcastable=/shape=")
        if d is not None and s is not None and d != s:
            raise TypeError(f"update of {target!r} ({t!r}) has a different static shape: {e!r}")
    if e.dtype is not t.dtype:
        raise TypeError(f"an update must have the same type as the shared variable {target!r}: it is "
                        f"{t.dtype.name} and the update is {e.dtype.name}; cast the update "
                        f"(T.cast(expr, {t.dtype.name!r})) if that is what you mean")
    return expr.value


def function(inputs: Sequence[Any] = (), outputs: Any = None, mode: Any = None, updates: Any = None,
             givens: Any = None, no_default_updates: Any = False, accept_inplace: bool = False,
             name: Optional[str] = None, rebuild_strict: bool = True, allow_input_downcast: Optional[bool] = None,
             profile: Any = None, on_unused_input: Optional[str] = None, trust_input: bool = False,
             workspace: Any = None) -> Function:
    """Compile ``outputs`` as a function of ``inputs`` (Theano's ``theano.function``)."""
    spec = dict(inputs=inputs, outputs=outputs, mode=mode, updates=updates, givens=givens,
                no_default_updates=no_default_updates, name=name, rebuild_strict=rebuild_strict,
                allow_input_downcast=allow_input_downcast, on_unused_input=on_unused_input,
                trust_input=trust_input, workspace=workspace)
    if isinstance(inputs, (TensorVariable, In)):
        raise TypeError("function: inputs must be a list of variables")
    ins = [_as_in(x) for x in inputs]
    seen: Dict[int, int] = {}
    for k, i in enumerate(ins):
        if id(i.variable.value) in seen:
            raise UnusedInputError(f"variable {i.variable!r} is given twice as an input (inputs {seen[id(i.variable.value)]}"
                                   f" and {k})")
        seen[id(i.variable.value)] = k

    single = not isinstance(outputs, (list, tuple))
    out_list = [] if outputs is None else ([outputs] if single else list(outputs))
    single = single and outputs is not None
    outs: List[Tuple[Value, bool]] = []
    for o in out_list:
        borrow = isinstance(o, Out) and o.borrow
        var = o.variable if isinstance(o, Out) else o
        outs.append((as_tensor_variable(var).value, borrow))

    upd: List[Tuple[SharedVariable, Value]] = []
    targets: set = set()
    for target, expr in _pairs(updates):
        if id(target) in targets:
            raise ValueError(f"shared variable {target!r} is updated twice in one function")
        targets.add(id(target))
        upd.append((target, _check_update(target, expr)))

    # givens: substitute before anything else looks at the graph
    replace = _givens(givens, ins, rebuild_strict)
    if replace:
        vals = rebuild([v for v, _ in outs] + [v for _, v in upd], replace)
        outs = [(v, b) for v, (_, b) in zip(vals, outs)]
        upd = [(s, v) for v, (s, _) in zip(vals[len(outs):], upd)]

    # default updates of the shared variables the graph reads (random streams, counters)
    upd = _add_default_updates(outs, upd, no_default_updates, replace)

    in_ids = {id(i.variable.value) for i in ins}
    roots = [v for v, _ in outs] + [v for _, v in upd]
    _check_inputs(roots, ins, in_ids, on_unused_input)
    return Function(ins, outs, single, upd, name=name, mode=mode, trust_input=trust_input,
                    allow_input_downcast=allow_input_downcast, spec=spec, workspace=workspace)


def _givens(givens: Any, ins: List[In], strict: bool) -> Dict[int, Value]:
    from . import basic

    replace: Dict[int, Value] = {}
    in_ids = {id(i.variable.value) for i in ins}
    for old, new in _pairs(givens):
        if not isinstance(old, TensorVariable):
            raise TypeError(f"givens keys must be symbolic variables, got {type(old).__name__}")
        if id(old.value) in in_ids:
            raise RuntimeError(f"givens: {old!r} is an input of the function; it cannot also be replaced")
        if not isinstance(new, TensorVariable):
            new = basic.cast(as_tensor_variable(np.asarray(new)), old.dtype)
        o, n = old.value.type, new.value.type
        if o.ndim != n.ndim:
            raise TypeError(f"givens: {old!r} ({o!r}) cannot be replaced by {new!r} ({n!r}): the number of "
                            "dimensions differs")
        if o.dtype is not n.dtype:
            if strict:
                raise TypeError(f"givens: {old!r} is {o.dtype.name} but its replacement is {n.dtype.name}; "
                                "cast the replacement or pass rebuild_strict=False")
        replace[id(old.value)] = new.value
    return replace


def _add_default_updates(outs: List[Tuple[Value, bool]], upd: List[Tuple[SharedVariable, Value]],
                         no_default: Any, replace: Dict[int, Value]) -> List[Tuple[SharedVariable, Value]]:
    if no_default is True:
        return upd
    excluded = {id(v) for v in (no_default or [])} if no_default is not False else set()
    done = {id(s) for s, _ in upd}
    frontier = [v for v, _ in outs] + [v for _, v in upd]
    while frontier:
        found = []
        for leaf in _params(frontier):
            ref = SHARED_BY_VALUE.get(id(leaf))
            var = ref() if ref is not None else None
            if var is None or var.default_update is None or id(var) in done or id(var) in excluded:
                continue
            done.add(id(var))
            value = _check_update(var, var.default_update)
            if replace:
                value = rebuild([value], replace)[0]
            upd.append((var, value))
            found.append(value)
        frontier = found
    return upd


def _params(values: List[Value]) -> List[Value]:
    out, seen = [], set()
    for v in _leaves(values):
        if v.kind == PARAM and id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _leaves(values: List[Value], stop: Sequence[Value] = ()) -> List[Value]:
    seen, out = set(), []
    for node in toposort(values, stop):
        for v in node.inputs:
            if (v.node is None or any(v is s for s in stop)) and id(v) not in seen:
                seen.add(id(v))
                out.append(v)
    for v in values:
        if (v.node is None or any(v is s for s in stop)) and id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def _check_inputs(roots: List[Value], ins: List[In], in_ids: set, on_unused: Optional[str]) -> None:
    stop = [i.variable.value for i in ins]
    leaves = _leaves(roots, stop)
    used = {id(v) for v in leaves}
    for v in leaves:
        if v.kind == INPUT and id(v) not in in_ids:
            users = [n for n in toposort(roots, stop) if any(x is v for x in n.inputs)]
            where = f", used by {users[0].op.name} at {users[0].source}" if users and users[0].source else ""
            raise MissingInputError(
                f"input {wrap(v)!r} ({v.type!r}{where}) is needed to compute the outputs but is not among the "
                "function's inputs; add it to the inputs list or replace it with givens=")
    policy = on_unused if on_unused is not None else config.on_unused_input
    for k, i in enumerate(ins):
        if id(i.variable.value) not in used:
            msg = (f"input {k} ({i.variable!r}) is not used to compute any output or update; pass "
                   "on_unused_input='ignore' (or 'warn') if that is intended")
            apply_policy(policy, msg, UnusedInputError, stacklevel=3)
