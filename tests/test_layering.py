"""The import directions of DESIGN.md, checked by parsing every module under cgvm/ (nothing is imported).

    cgvm.ir         imports nothing of cgvm but cgvm.errors
    cgvm.ops        imports only cgvm.ir and cgvm.errors
    cgvm.autodiff   builds graphs with cgvm.ir and cgvm.ops only
    cgvm.backend    imports nothing of ir, ops, autodiff, compiler, vm, function, frontends
    cgvm.vm         never imports cgvm.compiler, cgvm.compiled or the frontends
    cgvm.distributed imports only cgvm.ir, cgvm.ops, cgvm.autodiff and cgvm.errors
    cgvm.frontends  never import the VM's internals (cgvm.vm.interpreter, cgvm.vm.bytecode) or the
                    compiler's internals (its submodules; the cgvm.compiler package is public)

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


RULES = [
    Rule("cgvm.ir", allowed=("cgvm.errors",), why="the IR imports nothing of cgvm but cgvm.errors"),
    Rule("cgvm.ops", allowed=("cgvm.ir", "cgvm.errors"), why="ops are built on the IR only"),
    Rule("cgvm.autodiff", allowed=("cgvm.ir", "cgvm.ops", "cgvm.errors"),
         why="autodiff builds graphs with the IR and ops only"),
    Rule("cgvm.backend", forbidden=("cgvm.ir", "cgvm.ops", "cgvm.autodiff", "cgvm.compiler", "cgvm.vm",
                                    "cgvm.compiled", "cgvm.frontends"),
         why="backends run kernels and know nothing of graphs"),
    Rule("cgvm.vm", forbidden=("cgvm.compiler", "cgvm.compiled", "cgvm.frontends"),
         why="the VM runs programs; it does not compile them"),
    Rule("cgvm.frontends", forbidden=("cgvm.vm.interpreter", "cgvm.vm.bytecode", "cgvm.compiler.*"),
         why="frontends never touch the VM's or the compiler's internals"),
    Rule("cgvm.distributed", allowed=("cgvm.ir", "cgvm.ops", "cgvm.autodiff", "cgvm.errors"),
         why="data parallelism is graph ops and MPI: frontends use it, it uses no frontend, VM or compiler"),
]


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
    assert "cgvm.vm.interpreter" in by_module["cgvm.compiled"]


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


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.layer)
def test_import_directions(rule):
    found = violations(all_imports(), [rule])
    assert not found, "imports against DESIGN.md's layering:\n  " + "\n  ".join(found)
