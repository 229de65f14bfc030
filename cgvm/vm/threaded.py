"""Threaded code: a Frame's instructions lowered to one straight-line Python function.

The loop interpreter pays for unpacking and branching on every instruction. Here each CALL
becomes one line ``s7 = k3(s5, c2, out=v7)`` with kernels, constants and planned buffers
bound as closure variables, and each FREE a ``del``. Compiling the text costs microseconds
per instruction, once per input signature. Errors are mapped back to the program counter
through the line number, so the hot path carries no bookkeeping.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..ops.scratch import REFS_HELD_ONCE, writeable
from .bytecode import CALL, FREE, Program


def lower(program: Program, kernels: Dict[int, Callable], views: Dict[int, Any], consts: Dict[int, Any],
          scalar_outputs: Sequence[int], asarray: Callable, params: Any,
          on_error: Callable[[BaseException, Dict[int, int]], None],
          recycled: Optional[Dict[int, int]] = None, recycle_bin: Optional[list] = None,
          in_place: Optional[Dict[int, int]] = None, held_in_place: bool = False) -> Tuple[Callable, Dict[int, int]]:
    """Return ``(run, line_to_pc)``; ``run(*inputs)`` returns the tuple of output values.

    ``kernels`` maps each CALL's pc to its kernel. ``params`` is the workspace's dict; ``run`` reads parameters from it on every call.
    ``recycled`` maps an output slot to an index of ``recycle_bin``: its kernel writes into
    ``recycle_bin[index]`` (None: allocate), a buffer the caller refills between calls.
    ``in_place`` maps a parameter slot to the recycle-bin index of the update that may overwrite
    it: on each call, when the workspace alone holds the parameter's array (no user reference,
    view or DLPack export, not itself a view), that array is the update's buffer.
    ``held_in_place``: the array is the update's buffer even while others hold it (pycaffe's blob
    memory: a script's ``blob.data`` is the parameter, updates included).
    ``on_error(exc, line_to_pc)`` is called (and raises) when an instruction fails; the
    try block costs nothing on the way through.
    """
    env: Dict[str, Any] = {"_asarray": asarray, "_data": params, "_on_error": on_error, "_bin": recycle_bin,
                           "_refs": sys.getrefcount, "_writeable": writeable}
    recycled = recycled or {}
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
            private = "" if held_in_place else f"_refs(s{s}) == {REFS_HELD_ONCE} and "
            lines.append(f"    if {private}s{s}.base is None and _writeable(s{s}): _bin[{in_place[s]}] = s{s}")
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
    source = "\n".join(lines)
    code = compile(source, f"<cgvm program {program.name}>", "exec")
    exec(code, env)
    run = env["run"]
    run.__cgvm_source__ = source
    return run, line_pc
