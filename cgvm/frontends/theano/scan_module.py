"""``theano.scan`` (and map/reduce/foldl/foldr) lowered onto cgvm's ``scan`` node.

cgvm's scan iterates sequences on axis 0 with single-tap carried states. Theano's richer forms
are lowered here:

- sequence taps: one shifted slice of the sequence per tap (Theano's own slicing rule, so the
  number of steps is ``len - (max_tap - min_tap)``); ``go_backwards`` reverses the slices;
- output taps ``dict(initial=x0, taps=[-k, ..., -1])``: the last k states are carried, the newest
  one's stack is the result;
- ``None`` in outputs_info: a per-step output, not fed back;
- updates returned by ``fn`` (and default updates of shared variables the body reads, such as
  random streams): the shared value is carried through the steps and its final value is
  returned in ``updates``;
- ``until``: the body's stop condition.

The body is the part of what ``fn`` built that depends on a per-step input; everything else
(weights, loop-invariant products) is computed once outside and passed in, and gradients flow to
it through the scan node (BPTT).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...ir.graph import CONST, INPUT, PARAM, input_value
from ...ir.types import TensorType as IRType
from ...ops import control
from . import subgraph
from .shared import SharedVariable
from .var import SHARED_BY_VALUE, TensorVariable, as_tensor_variable, wrap

__all__ = ["scan", "map", "reduce", "foldl", "foldr", "until", "OrderedUpdates"]


class until:
    """``return outputs, until(condition)``: stop after the step where ``condition`` is true."""

    def __init__(self, condition: Any):
        self.condition = as_tensor_variable(condition)
        if self.condition.ndim != 0:
            raise TypeError("until: the condition must be a scalar")


class OrderedUpdates(OrderedDict):
    """The updates dict scan returns (Theano's ``OrderedUpdates``)."""


def _listify(x: Any) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _parse_fn_result(res: Any) -> Tuple[list, Dict[Any, Any], Optional[until]]:
    """fn's return value as (outputs, updates, until), in any of the forms Theano accepts."""
    if isinstance(res, until):
        return [], {}, res
    if isinstance(res, dict):
        return [], dict(res), None
    if not isinstance(res, (list, tuple)):
        return [res], {}, None
    items = list(res)
    structured = any(isinstance(i, (dict, until, list, tuple)) for i in items)
    if not structured:
        return items, {}, None
    outs: list = []
    updates: Dict[Any, Any] = {}
    stop = None
    for item in items:
        if isinstance(item, until):
            stop = item
        elif isinstance(item, dict):
            updates.update(item)
        elif isinstance(item, (list, tuple)):
            if item and all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], SharedVariable) for p in item):
                updates.update(dict(item))
            else:
                outs.extend(item)
        elif item is not None:
            outs.append(item)
    return outs, updates, stop


def _seq_slices(seq: TensorVariable, taps: Sequence[int]) -> List[TensorVariable]:
    """One slice of ``seq`` per tap, aligned so that step t reads seq[t + tap - min_tap] (Theano's rule)."""
    mintap, maxtap = min(taps), max(taps)
    out = []
    for k in taps:
        if maxtap == mintap and maxtap != 0:
            out.append(seq[:maxtap] if maxtap < 0 else seq[maxtap:])
        elif maxtap - k != 0:
            out.append(seq[k - mintap:-(maxtap - k)])
        else:
            out.append(seq[k - mintap:])
    return out


def scan(fn: Any, sequences: Any = None, outputs_info: Any = None, non_sequences: Any = None,
         n_steps: Any = None, truncate_gradient: int = -1, go_backwards: bool = False, mode: Any = None,
         name: Optional[str] = None, profile: bool = False, allow_gc: Any = None, strict: bool = False,
         return_list: bool = False, return_updates: bool = True) -> Any:
    """Loop ``fn`` over sequences and recurrent states; returns ``(outputs, updates)``."""
    # ---- sequences: one step input per tap
    seq_slices: List[TensorVariable] = []
    for s in _listify(sequences):
        if isinstance(s, dict):
            var, taps = as_tensor_variable(s["input"]), list(s.get("taps", [0]) or [0])
        else:
            var, taps = as_tensor_variable(s), [0]
        if var.ndim == 0:
            raise TypeError("scan: a sequence must have at least one dimension")
        seq_slices += _seq_slices(var, taps)
    if go_backwards:
        seq_slices = [s[::-1] for s in seq_slices]
    seq_inputs = [input_value(IRType(s.value.shape[1:], s.value.dtype), f"seq{k}") for k, s in enumerate(seq_slices)]

    # ---- outputs_info: carried states (sit-sot / mit-sot) and per-step outputs (nit-sot)
    infos = _listify(outputs_info)
    kinds: List[Tuple[str, Any]] = []  # ("carry", (init values, taps)) or ("map", None)
    carry_inits: List[TensorVariable] = []
    carry_inputs: List[Any] = []
    fn_state_args: List[Any] = []
    for k, info in enumerate(infos):
        if isinstance(info, dict):
            init = info.get("initial")
            taps = info.get("taps", [-1] if init is not None else None)
        else:
            init, taps = info, ([-1] if info is not None else None)
        if init is None:
            kinds.append(("map", None))
            continue
        init = as_tensor_variable(init)
        taps = sorted(int(t) for t in taps)
        if any(t >= 0 for t in taps):
            raise ValueError(f"scan: output taps must be negative, got {taps}")
        depth = -taps[0]
        if taps == [-1]:
            inits = [init]
        else:
            inits = [init[j] for j in range(depth)]  # x0[0] is t-depth ... x0[-1] is t-1
        slots = []
        for j, iv in enumerate(inits):
            ph = input_value(IRType((None,) * iv.ndim, iv.value.dtype), f"h{k}_{j}")
            slots.append(ph)
        kinds.append(("carry", (len(carry_inits), depth, taps)))
        carry_inits += inits
        carry_inputs += slots
        fn_state_args += [wrap(slots[depth + t]) for t in taps]

    non_seqs = [as_tensor_variable(x) if not isinstance(x, TensorVariable) else x for x in _listify(non_sequences)]
    args = [wrap(v) for v in seq_inputs] + fn_state_args + non_seqs
    outs, updates, stop = _parse_fn_result(fn(*args))
    outs = [as_tensor_variable(o) for o in outs]
    if len(outs) != len(infos) and infos:
        raise ValueError(f"scan: fn returned {len(outs)} outputs but outputs_info has {len(infos)} entries")
    if not infos:
        kinds = [("map", None)] * len(outs)

    # ---- shared variables updated inside the body are carried through the steps
    updates = _with_default_updates(outs, updates, stop)
    upd_targets = list(updates)
    upd_inputs = [input_value(t.value.type, f"u{k}") for k, t in enumerate(upd_targets)]

    # ---- the body: new carries (oldest slot first), per-step outputs, stop
    new_carries: List[Any] = []
    map_outs: List[Any] = []
    for (kind, meta), o in zip(kinds, outs):
        if kind == "map":
            map_outs.append(o.value)
            continue
        start, depth, taps = meta
        _check_carry(o, carry_inits[start + depth - 1], len(new_carries))
        new_carries += carry_inputs[start + 1:start + depth] + [o.value]
    upd_values = [as_tensor_variable(updates[t]).value for t in upd_targets]
    body_outs = new_carries + upd_values + map_outs + ([stop.condition.value] if stop is not None else [])
    step_inputs = seq_inputs + carry_inputs
    # shared variables with in-loop updates are read through their carried inner input
    replaced = _replace_params(body_outs, upd_targets, upd_inputs)
    inside = subgraph.dependent_nodes(replaced, step_inputs + upd_inputs)
    body, captured, _ = subgraph.extract(replaced, step_inputs + upd_inputs, inside, name=name or "scan_fn")
    if strict:
        _check_strict(captured, seq_slices + carry_inits + non_seqs + upd_targets, name)
    # body inputs: sequences, carries (states, then updated shared values), captured non-sequences
    inits_all = [c.value for c in carry_inits] + [t.value for t in upd_targets]
    op_inputs = [s.value for s in seq_slices] + inits_all + captured
    n_carry = len(carry_inputs) + len(upd_inputs)
    attrs: Dict[str, Any] = dict(body=body,
                                 n_seqs=len(seq_slices), n_carry=n_carry, go_backwards=False,
                                 has_until=stop is not None)
    steps = _static_steps(n_steps)
    if n_steps is not None and steps is None:
        op_inputs.append(_int64(n_steps).value)
        attrs["dyn_steps"] = True
    elif steps is not None:
        attrs["n_steps"] = steps
    if not seq_slices and n_steps is None:
        raise ValueError("scan: n_steps is required when there are no sequences")
    if truncate_gradient is not None and truncate_gradient > 0:
        attrs["truncate_gradient"] = int(truncate_gradient)
    res = control.scan(*op_inputs, **attrs)
    res = res if isinstance(res, tuple) else (res,)
    finals, stacks, ys = res[:n_carry], res[n_carry:2 * n_carry], res[2 * n_carry:]

    results: List[TensorVariable] = []
    it_ys = iter(ys)
    for kind, meta in kinds:
        if kind == "map":
            results.append(wrap(next(it_ys)))
        else:
            start, depth, _ = meta
            results.append(wrap(stacks[start + depth - 1]))
    out_updates = OrderedUpdates()
    n_state = len(carry_inputs)
    for k, t in enumerate(upd_targets):
        out_updates[t] = wrap(finals[n_state + k])
    single = len(results) == 1 and not return_list
    outputs = results[0] if single else results
    return (outputs, out_updates) if return_updates else outputs


def _check_strict(captured: List[Any], passed: List[TensorVariable], name: Optional[str]) -> None:
    """``strict=True``: fn may read no input or shared variable that was not passed to scan."""
    from ...errors import MissingInputError
    from .function import _leaves

    allowed = {id(v) for v in _leaves([p.value for p in passed])} | {id(p.value) for p in passed}
    for leaf in _leaves(list(captured)):
        if leaf.kind in (INPUT, PARAM) and id(leaf) not in allowed:
            raise MissingInputError(
                f"scan{' ' + repr(name) if name else ''} (strict=True): fn uses {wrap(leaf)!r} ({leaf.type!r}), "
                "which is not among the sequences, outputs_info or non_sequences; pass it in non_sequences")


def _replace_params(values: List[Any], targets: List[SharedVariable], inner: List[Any]) -> List[Any]:
    if not targets:
        return values
    from ...ir.builder import rebuild

    return rebuild(values, {id(t.value): i for t, i in zip(targets, inner)})


def _with_default_updates(outs: List[TensorVariable], updates: Dict[Any, Any], stop: Optional[until]) -> Dict:
    """fn's updates plus the default updates of shared variables the step reads (random streams)."""
    from .function import _params

    roots = [o.value for o in outs] + [as_tensor_variable(v).value for v in updates.values()]
    if stop is not None:
        roots.append(stop.condition.value)
    result: Dict[Any, Any] = OrderedDict(updates)
    frontier = roots
    while frontier:
        found = []
        for p in _params(frontier):
            ref = SHARED_BY_VALUE.get(id(p))
            var = ref() if ref is not None else None
            if var is not None and var.default_update is not None and var not in result:
                result[var] = var.default_update
                found.append(var.default_update.value)
        frontier = found
    for target in result:
        if not isinstance(target, SharedVariable):
            raise TypeError(f"scan: update target {target!r} must be a shared variable")
    return result


def _check_carry(out: TensorVariable, init: TensorVariable, k: int) -> None:
    if out.ndim != init.ndim or out.dtype != init.dtype:
        raise TypeError(
            f"scan: the initial value of recurrent output {k} is {init.dtype} with {init.ndim} dimensions, but fn "
            f"returns {out.dtype} with {out.ndim} dimensions"
            + (f" (computed at {out.value.source})" if out.value.source else "")
            + "; make them agree, e.g. T.cast the initial value or the step's result")


def _static_steps(n_steps: Any) -> Optional[int]:
    if n_steps is None:
        return None
    if isinstance(n_steps, (int, np.integer)):
        return int(n_steps)
    v = as_tensor_variable(n_steps)
    if v.value.kind == CONST:
        return int(v.value.data)
    return None


def _int64(x: Any) -> TensorVariable:
    from . import basic

    return basic.cast(as_tensor_variable(x), "int64")


# --------------------------------------------------------------------------- helpers built on scan

def map(fn: Any, sequences: Any, non_sequences: Any = None, truncate_gradient: int = -1, go_backwards: bool = False,
        mode: Any = None, name: Optional[str] = None, return_updates: bool = True) -> Any:
    """fn applied to each entry of the sequences."""
    return scan(fn, sequences=sequences, outputs_info=None, non_sequences=non_sequences,
                truncate_gradient=truncate_gradient, go_backwards=go_backwards, name=name,
                return_updates=return_updates)


def reduce(fn: Any, sequences: Any, outputs_info: Any, non_sequences: Any = None, go_backwards: bool = False,
           mode: Any = None, name: Optional[str] = None, return_updates: bool = True) -> Any:
    """Like scan, returning only the final state(s)."""
    outs, updates = scan(fn, sequences=sequences, outputs_info=outputs_info, non_sequences=non_sequences,
                         go_backwards=go_backwards, name=name)
    finals = [o[-1] for o in outs] if isinstance(outs, list) else outs[-1]
    return (finals, updates) if return_updates else finals


def foldl(fn: Any, sequences: Any, outputs_info: Any, non_sequences: Any = None, mode: Any = None,
          name: Optional[str] = None, return_updates: bool = True) -> Any:
    return reduce(fn, sequences, outputs_info, non_sequences, go_backwards=False, name=name,
                  return_updates=return_updates)


def foldr(fn: Any, sequences: Any, outputs_info: Any, non_sequences: Any = None, mode: Any = None,
          name: Optional[str] = None, return_updates: bool = True) -> Any:
    return reduce(fn, sequences, outputs_info, non_sequences, go_backwards=True, name=name,
                  return_updates=return_updates)

