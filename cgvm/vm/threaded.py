"""Threaded code: a Frame's instructions lowered to one straight-line Python function.

An interpreter loop pays for unpacking and branching on every instruction. Here each CALL
becomes one line ``s7 = k3(s5, c2, out=v7)`` with kernels, constants and planned buffers
bound as closure variables, and each FREE a ``del``. Compiling the text costs microseconds
per instruction, once per input signature. Errors are mapped back to the program counter
through the line number, so the hot path carries no bookkeeping.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..ops.kernels.scratch import private_array, writeable
from ..pycode import define
from .bytecode import CALL, FREE, Program


def lower(program: Program, kernels: Dict[int, Callable], views: Dict[int, Any], consts: Dict[int, Any],
          scalar_outputs: Sequence[int], asarray: Callable, params: Any,
          on_error: Callable[[BaseException, Dict[int, int]], None],
          recycled: Optional[Dict[int, int]] = None, recycle_bin: Optional[list] = None,
          in_place: Optional[Dict[int, int]] = None, held_in_place: bool = False,
          fresh: Optional[Dict[int, Tuple[tuple, Any]]] = None, empty: Optional[Callable] = None
          ) -> Tuple[Callable, Dict[int, int]]:
    """Return ``(run, line_to_pc)``; ``run(*inputs)`` returns the tuple of output values.

    ``kernels`` maps each CALL's pc to its kernel. ``params`` is the workspace's dict; ``run`` reads parameters from it on every call.
    ``recycled`` maps an output slot to an index of ``recycle_bin``: its kernel writes into
    ``recycle_bin[index]`` (None: allocate), a buffer the caller refills between calls.
    ``in_place`` maps a parameter slot to the recycle-bin index of the update that may overwrite
    it: on each call, when the workspace alone holds the parameter's array (no user reference,
    view or DLPack export, not itself a view), that array is the update's buffer.
    ``held_in_place``: the array is the update's buffer even while others hold it (pycaffe's blob
    memory: a script's ``blob.data`` is the parameter, updates included).
    ``fresh`` maps a result slot to its (shape, dtype): its kernel gets ``out=empty(shape, dtype)``, a
    new array on every call (an unplanned output of an op that would otherwise work its shape out).
    ``on_error(exc, line_to_pc)`` is called (and raises) when an instruction fails; the
    try block costs nothing on the way through.
    """
    env: Dict[str, Any] = {"_asarray": asarray, "_data": params, "_on_error": on_error, "_bin": recycle_bin,
                           "_private": private_array, "_writeable": writeable}
    recycled = recycled or {}
    fresh = fresh or {}
    env["_empty"] = empty
    lines: List[str] = []
    line_pc: Dict[int, int] = {}
    ins_names = ", ".join(f"s{s}" for s in program.input_slots)
    lines.append(f"def run({ins_names}):")
    lines.append("  try:")
    for name, s in program.param_slots:
        env[f"n{s}"] = name
        line_pc[len(lines) + 1] = -1 - s  # a failing read names the parameter
        lines.append(f"    s{s} = _data[n{s}]")
        if in_place and s in in_place:
            # held_in_place: the update writes into the parameter's array even while a script holds it
            check = f"s{s}.base is None and _writeable(s{s})" if held_in_place else f"_private(s{s})"
            lines.append(f"    if {check}: _bin[{in_place[s]}] = s{s}")
    for s, arr in consts.items():
        env[f"c{s}"] = arr

    def ref(s: int) -> str:
        return f"c{s}" if s in consts else f"s{s}"

    for pc, ins in enumerate(program.instrs):
        if ins.opcode == FREE:
            dead = [f"s{s}" for s in ins.args if s not in consts]
            if dead:
                lines.append(f"    del {', '.join(dead)}")
            continue
        if ins.opcode != CALL:
            continue
        env[f"k{pc}"] = kernels[pc]
        args = ", ".join(ref(s) for s in ins.args)
        res = ins.results
        if len(res) == 1 and res[0] in views:
            env[f"v{res[0]}"] = views[res[0]]
            call = f"k{pc}({args}, out=v{res[0]})" if args else f"k{pc}(out=v{res[0]})"
        elif len(res) == 1 and res[0] in recycled and args:
            call = f"k{pc}({args}, out=_bin[{recycled[res[0]]}])"
        elif len(res) == 1 and res[0] in fresh and args:
            env[f"e{res[0]}"], env[f"d{res[0]}"] = fresh[res[0]]
            call = f"k{pc}({args}, out=_empty(e{res[0]}, d{res[0]}))"
        elif len(res) > 1 and program.nodes[ins.node].op.multi_out and any(r in views for r in res):
            for r in res:
                if r in views:
                    env[f"v{r}"] = views[r]
            outs = ", ".join(f"v{r}" if r in views else "None" for r in res)
            call = f"k{pc}({args}, out=({outs},))"
        else:
            call = f"k{pc}({args})"
        target = f"s{res[0]}" if len(res) == 1 else ", ".join(f"s{s}" for s in res)
        line_pc[len(lines) + 1] = pc
        lines.append(f"    {target} = {call}")
    scalars = set(scalar_outputs)
    outs = [f"_asarray({ref(s)})" if s in scalars else ref(s) for s in program.output_slots]
    lines.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    lines.append("  except Exception as _exc:")
    lines.append("    _on_error(_exc, _line_pc)")
    lines.append("    raise")
    env["_line_pc"] = line_pc
    return define("run", lines, env, f"program {program.name}"), line_pc
