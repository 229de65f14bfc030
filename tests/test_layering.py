"""The import directions of DESIGN.md, checked by parsing every module under cgvm/ (nothing is imported).

    cgvm.ir         imports nothing of cgvm but cgvm.errors
    cgvm.ops        imports only cgvm.ir, cgvm.errors, cgvm.backend (device code: BLAS, CUDA kernels)
                    and cgvm.pycode (generated Python), which imports nothing of cgvm
    cgvm.autodiff   builds graphs with cgvm.ir and cgvm.ops only
    cgvm.backend    imports nothing of ir, ops, autodiff, compiler, vm, function, frontends
    cgvm.vm         never imports cgvm.compiler, cgvm.compiled(_function) or the frontends
    cgvm.compiler   builds on the IR, ops, autodiff and the VM's bytecode; never the compiled
                    function, the backends, DLPack, the frontends or the command line
    cgvm.compiled   ties compiler, VM and backends together (``compile``; its Function lives in
                    cgvm.compiled_function, under the same rule); never the frontends or the command line
    cgvm.dlpack     sits on the backends (and cgvm.errors) only
    cgvm.cli        drives the public API: never the VM's internals (the interpreter, the bytecode)
    cgvm.distributed imports only cgvm.ir, cgvm.ops, cgvm.autodiff and cgvm.errors
    cgvm.frontends  never import the VM's internals (cgvm.vm.interpreter, cgvm.vm.bytecode) or the
                    compiler's internals (its submodules; the cgvm.compiler package is public),
                    nor another frontend (or its alias cgvm.caffe / cgvm.keras / cgvm.theano),
                    nor the command line (they register subcommands through cgvm.commands)
    nothing but cgvm.cli itself imports cgvm.cli
    cgvm.board      (TensorBoard) reads graphs and compiled functions: imports only cgvm.ir, cgvm.ops,
                    cgvm.backend, cgvm.errors (and cgvm.commands, to register `cgvm board`); the
                    frontends and cgvm.compiled_function call it, never the IR, ops, VM or compiler

Every import counts, also those inside functions and under ``if TYPE_CHECKING``: a lazy import
still ties the layers together. Each package may import itself.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Dict, FrozenSet, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "cgvm"


class Import(NamedTuple):
    module: str      # the importing module, e.g. "cgvm.ops.nn"
    path: Path
    line: int
    target: str      # the cgvm module imported, e.g. "cgvm.ir.graph"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@functools.lru_cache(maxsize=None)
def _is_module(name: str) -> bool:
    """Whether ``name`` (dotted, under cgvm) is a module or package in the source tree."""
    rel = Path(*name.split("."))
    base = PACKAGE_DIR.parent / rel
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


@functools.lru_cache(maxsize=None)
def _reexported_names(package: str) -> FrozenSet[str]:
    """Names a package's __init__ binds to something other than its own submodules.

    ``from cgvm.compiler import prune`` gets the function re-exported by cgvm/compiler/__init__.py
    (``from .prune import prune``), not the submodule cgvm.compiler.prune.
    """
    init = PACKAGE_DIR.parent / Path(*package.split(".")) / "__init__.py"
    if not init.is_file():
        return frozenset()
    names: Set[str] = set()
    for node in ast.walk(ast.parse(init.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and not (node.level == 1 and node.module is None):
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return frozenset(names)


def _resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> Optional[str]:
    """The absolute module named by ``from <...> import``, or None for a module outside cgvm."""
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        if not is_package:
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return base if base == "cgvm" or base.startswith("cgvm.") else None


def imports_in(text: str, module: str, path: Path, is_package: bool = False) -> Iterator[Import]:
    """The cgvm imports of source ``text``, read as module ``module`` (file ``path``)."""
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "cgvm" or alias.name.startswith("cgvm."):
                    yield Import(module, path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(module, is_package, node)
            if base is None:
                continue
            exported = _reexported_names(base)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                # `from pkg import sub` imports the submodule unless pkg re-exports a name `sub`
                target = sub if alias.name not in exported and _is_module(sub) else base
                yield Import(module, path, node.lineno, target)


def imports_of(path: Path) -> Iterator[Import]:
    return imports_in(path.read_text(encoding="utf-8"), _module_name(path), path, path.name == "__init__.py")


@functools.lru_cache(maxsize=None)
def all_imports() -> Tuple[Import, ...]:
    return tuple(imp for path in sorted(PACKAGE_DIR.rglob("*.py")) for imp in imports_of(path))


def _within(name: str, prefixes: Sequence[str]) -> bool:
    """Whether module ``name`` is one of ``prefixes`` or inside one; "pkg.*" means strictly inside pkg."""
    for p in prefixes:
        if p.endswith(".*"):
            if name.startswith(p[:-1]):
                return True
        elif name == p or name.startswith(p + "."):
            return True
    return False


class Rule(NamedTuple):
    layer: str                       # modules this rule governs (the package and everything in it)
    allowed: Optional[Tuple[str, ...]] = None   # if set: the only cgvm modules it may import (+ itself)
    forbidden: Tuple[str, ...] = ()             # cgvm modules it must not import
    why: str = ""

    def broken_by(self, imp: Import) -> bool:
        if not _within(imp.module, [self.layer]) or _within(imp.target, [self.layer]):
            return False
        if self.allowed is not None and not _within(imp.target, self.allowed):
            return True
        return _within(imp.target, self.forbidden)


FRONTENDS = sorted(p.name for p in (PACKAGE_DIR / "frontends").iterdir() if (p / "__init__.py").is_file())


def _other_frontends(name: str) -> Tuple[str, ...]:
    """The modules of every frontend but ``name``, with their top-level aliases (cgvm.keras ...)."""
    return tuple(m for other in FRONTENDS if other != name
                 for m in (f"cgvm.frontends.{other}", f"cgvm.{other}"))


RULES = [
    Rule("cgvm.ir", allowed=("cgvm.errors",), why="the IR imports nothing of cgvm but cgvm.errors"),
    Rule("cgvm.pycode", allowed=(), why="generated Python is a helper every layer may use"),
    Rule("cgvm.ops", allowed=("cgvm.ir", "cgvm.errors", "cgvm.backend", "cgvm.pycode"),
         why="ops are built on the IR; their kernels call device code in the backend"),
    Rule("cgvm.autodiff", allowed=("cgvm.ir", "cgvm.ops", "cgvm.errors"),
         why="autodiff builds graphs with the IR and ops only"),
    Rule("cgvm.backend", forbidden=("cgvm.ir", "cgvm.ops", "cgvm.autodiff", "cgvm.compiler", "cgvm.vm",
                                    "cgvm.compiled", "cgvm.compiled_function", "cgvm.frontends"),
         why="backends run kernels and know nothing of graphs"),
    Rule("cgvm.vm", forbidden=("cgvm.compiler", "cgvm.compiled", "cgvm.compiled_function", "cgvm.frontends"),
         why="the VM runs programs; it does not compile them"),
    Rule("cgvm.compiler", allowed=("cgvm.ir", "cgvm.ops", "cgvm.autodiff", "cgvm.vm.bytecode", "cgvm.errors",
                                   "cgvm.pycode"),
         why="the compiler turns graphs into bytecode; it runs nothing and knows no frontend"),
] + [Rule(layer, forbidden=("cgvm.frontends", "cgvm.caffe", "cgvm.keras", "cgvm.theano", "cgvm.onnx", "cgvm.cli"),
          why="a compiled function knows no frontend and no command line")
      for layer in ("cgvm.compiled", "cgvm.compiled_function")] + [
    Rule("cgvm.dlpack", allowed=("cgvm.backend", "cgvm.errors"), why="DLPack interop sits on the backends only"),
    Rule("cgvm.cli", forbidden=("cgvm.vm.interpreter", "cgvm.vm.bytecode"),
         why="the command line drives the public API"),
    Rule("cgvm.frontends", forbidden=("cgvm.vm.interpreter", "cgvm.vm.bytecode", "cgvm.compiler.*", "cgvm.cli"),
         why="frontends never touch the VM's or the compiler's internals, nor the command line"),
    Rule("cgvm.board", allowed=("cgvm.ir", "cgvm.ops", "cgvm.backend", "cgvm.errors", "cgvm.commands"),
         why="TensorBoard output reads graphs and functions; it builds on the IR and ops only"),
    Rule("cgvm.vm", forbidden=("cgvm.board",), why="the VM knows nothing of TensorBoard"),
    Rule("cgvm.distributed", allowed=("cgvm.ir", "cgvm.ops", "cgvm.autodiff", "cgvm.errors"),
         why="data parallelism is graph ops and MPI: frontends use it, it uses no frontend, VM or compiler"),
] + [Rule(f"cgvm.frontends.{name}", forbidden=_other_frontends(name),
          why="frontends meet in the IR, never in each other's code") for name in FRONTENDS]


def violations(imports: Sequence[Import], rules: Sequence[Rule] = tuple(RULES)) -> List[str]:
    """One line per import that breaks a rule: file:line, importing module, imported module, why."""
    found = []
    for imp in sorted(imports, key=lambda i: (str(i.path), i.line)):
        for rule in rules:
            if rule.broken_by(imp):
                rel = imp.path.relative_to(PACKAGE_DIR.parent) if imp.path.is_absolute() else imp.path
                found.append(f"{rel}:{imp.line}: {imp.module} imports {imp.target} ({rule.why})")
    return found


def test_the_parser_sees_the_imports_we_know_of():
    by_module: Dict[str, Set[str]] = {}
    for imp in all_imports():
        by_module.setdefault(imp.module, set()).add(imp.target)
    assert "cgvm.errors" in by_module["cgvm.ir.graph"]
    assert "cgvm.ir.opschema" in by_module["cgvm.ops.registry"]
    assert "cgvm.ops.shape" in by_module["cgvm.autodiff"]  # `from .ops import shape as shp`
    assert "cgvm.vm.interpreter" in by_module["cgvm.compiled_function"]
    assert "cgvm.compiled_function" in by_module["cgvm.compiled"]


def test_resolution_of_relative_and_package_imports():
    text = ("from ...vm import interpreter\nfrom ...compiler import prune\nfrom cgvm.compiler import passes\n"
            "import cgvm.vm.bytecode\nfrom ... import vm\nimport numpy\nfrom . import prototxt\n")
    found = list(imports_in(text, "cgvm.frontends.caffe.probe", Path("cgvm/frontends/caffe/probe.py")))
    assert [i.target for i in found] == ["cgvm.vm.interpreter", "cgvm.compiler", "cgvm.compiler.passes",
                                         "cgvm.vm.bytecode", "cgvm.vm", "cgvm.frontends.caffe.prototxt"]
    reported = violations(found)
    assert len(reported) == 3, reported
    assert reported[0].startswith("cgvm/frontends/caffe/probe.py:1: cgvm.frontends.caffe.probe imports "
                                  "cgvm.vm.interpreter")


def test_nothing_but_the_command_line_imports_it():
    found = [f"{imp.path.relative_to(PACKAGE_DIR.parent)}:{imp.line}: {imp.module} imports {imp.target}"
             for imp in all_imports() if _within(imp.target, ["cgvm.cli"]) and not _within(imp.module, ["cgvm.cli"])]
    assert not found, "the command line is the top layer (register subcommands with cgvm.commands):\n  " + \
        "\n  ".join(found)


def test_the_frontend_rules_cover_every_frontend():
    assert {"caffe", "keras", "theano"} <= set(FRONTENDS)
    imp = Import("cgvm.frontends.keras.probe", Path("cgvm/frontends/keras/probe.py"), 3, "cgvm.caffe")
    assert violations([imp]) and "each other's code" in violations([imp])[0]


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.layer)
def test_import_directions(rule):
    found = violations(all_imports(), [rule])
    assert not found, "imports against DESIGN.md's layering:\n  " + "\n  ".join(found)
