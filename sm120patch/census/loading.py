"""When a package loads one of its compiled modules: at import, in a try block, or only when a feature calls it.

A server package with a module that has no image for the GPU fails every start only if that module is loaded
(and its kernels launched) on the way up. sglang-kernel 0.4.10's aarch64 wheel, on a DGX Spark, has no sm_121
image in `flashmla_ops` (FlashMLA is Hopper/datacenter-Blackwell code) while `common_ops` has one: its own
source imports `flashmla_ops` in a try block (`sgl_kernel/flash_mla.py`) and loads `infllm_ops` from a function,
so the server starts and only those features fail. This reads the package's own Python source with ast (never
imports it): every place that names the module (an import of it, or a string holding its name, as a loader that
finds the .so by a glob does) is one of

- `import`: at a module's top level, outside a try block (or in a function that a module's top level calls,
  directly or through other functions of the package, by name): loaded when the package is imported;
- `optional`: at top level inside a try block whose handler catches the import's failure: the package imports
  without it, and the calls that need it fail;
- `on-use`: inside a function no top level calls: loaded when a feature calls it.

The module's answer is the strongest of its places (import > optional > on-use); `unknown` where no place names
it (a loader that builds the name at run time): treated as loaded at import, the safe side.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

IMPORT, OPTIONAL, ON_USE, UNKNOWN = "import", "optional", "on-use", "unknown"
_RANK = {IMPORT: 3, UNKNOWN: 3, OPTIONAL: 2, ON_USE: 1}
_CATCHES = {"ImportError", "ModuleNotFoundError", "OSError", "Exception", "BaseException", "RuntimeError"}
MAX_FILES = 2000  # .py files of one package read at most (a package is far smaller; a hostile tree is cut)


@dataclass(frozen=True)
class Loading:
    kind: str  # IMPORT | OPTIONAL | ON_USE | UNKNOWN
    where: str  # "sgl_kernel/flash_mla.py:7" (the place that decided it), "" for UNKNOWN

    @property
    def at_start(self) -> bool:
        """Loaded when the package is imported (or not known not to be)."""
        return self.kind in (IMPORT, UNKNOWN)

    def say(self) -> str:
        return {
            IMPORT: f"loaded at import ({self.where})",
            OPTIONAL: f"imported in a try block ({self.where}): the package imports without it",
            ON_USE: f"loaded only when a feature calls it ({self.where})",
            UNKNOWN: "no source names it (loaded at import, as far as the census can tell)",
        }[self.kind]


def module_name(rel: str) -> tuple[str, str]:
    """(package, name) of a compiled module: sgl_kernel/sm100/common_ops.abi3.so -> (sgl_kernel.sm100, common_ops)."""
    p = Path(rel)
    return ".".join(p.parent.parts), p.name.split(".", 1)[0]


def _py_files(site: Path, top: str) -> Iterator[Path]:
    root = site / top
    n = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for f in sorted(filenames):
            if f.endswith(".py"):
                n += 1
                if n > MAX_FILES:
                    return
                yield Path(dirpath) / f


def _package_of(site: Path, path: Path) -> str:
    parts = path.relative_to(site).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] != "__init__" else parts[:-1])


def _names_module(node: ast.AST, here: str, package: str, name: str) -> bool:
    """Does this node import the module (absolutely or relatively) or hold its name in a string?"""
    full = f"{package}.{name}" if package else name
    if isinstance(node, ast.Import):
        return any(a.name == full or a.name.startswith(full + ".") for a in node.names)
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            up = here.split(".")[: len(here.split(".")) - (node.level - 1)] if here else []
            base = ".".join([*up, *([base] if base else [])])
        if base == full or base.startswith(full + "."):
            return True
        return base == package and any(a.name == name for a in node.names)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        # a loader's glob or file name ("infllm_ops*.so"), never a message or docstring that mentions it
        return name in node.value and len(node.value) < 200 and not any(c.isspace() for c in node.value)
    return False


def _catches_import_failure(t: ast.Try) -> bool:
    for h in t.handlers:
        if h.type is None:
            return True
        names = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
        if any(isinstance(n, ast.Name) and n.id in _CATCHES for n in names):
            return True
    return False


def _called_names(nodes: list[ast.stmt]) -> set[str]:
    """Names called in these statements, outside function bodies (`f()`, `mod.f()`: "f")."""
    out: set[str] = set()
    stack: list[ast.AST] = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                out.add(f.id)
            elif isinstance(f, ast.Attribute):
                out.add(f.attr)
        stack.extend(ast.iter_child_nodes(node))
    return out


def how_loaded(site: Path, rel: str) -> Loading:
    """How the package that holds `rel` (a compiled module, relative to `site`) loads it; see the module doc."""
    package, name = module_name(rel)
    top = package.split(".")[0] if package else ""
    if not top or not (site / top).is_dir():
        return Loading(UNKNOWN, "")
    trees: list[tuple[Path, str, ast.Module]] = []
    for path in _py_files(site, top):
        try:
            trees.append((path, _package_of(site, path), ast.parse(path.read_bytes(), filename=str(path))))
        except (OSError, SyntaxError, ValueError):
            continue
    # functions a module's top level runs, and what they call in turn (by name, across the package)
    bodies: dict[str, list[ast.stmt]] = {}
    for _, _, tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                bodies.setdefault(node.name, []).extend(node.body)
    run = set().union(*(_called_names(tree.body) for _, _, tree in trees)) if trees else set()
    todo = list(run)
    while todo:
        for called in _called_names(bodies.get(todo.pop(), [])):
            if called in bodies and called not in run:
                run.add(called)
                todo.append(called)
    best: Loading | None = None
    for path, here, tree in trees:
        for kind, line in _places(tree, here, package, name, run):
            found = Loading(kind, f"{path.relative_to(site).as_posix()}:{line}")
            if best is None or _RANK[kind] > _RANK[best.kind]:
                best = found
    return best or Loading(UNKNOWN, "")


def _places(tree: ast.Module, here: str, package: str, name: str, run: set[str]) -> Iterator[tuple[str, int]]:
    """(kind, line) of each place in this file that names the module."""

    def visit(node: ast.AST, func: str | None, guarded: bool) -> Iterator[tuple[str, int]]:
        if _names_module(node, here, package, name):
            if func is None:
                yield (OPTIONAL if guarded else IMPORT), getattr(node, "lineno", 0)
            else:
                yield (IMPORT if func in run else ON_USE), getattr(node, "lineno", 0)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(child, func or child.name, guarded)
            elif isinstance(child, ast.Lambda):
                yield from visit(child, func or "<lambda>", guarded)
            elif isinstance(node, ast.Try) and child in node.body and _catches_import_failure(node):
                yield from visit(child, func, True)
            else:
                yield from visit(child, func, guarded)

    yield from visit(tree, None, False)
