"""No import circles in sm120patch: not between modules, not between its packages.

The graph is read from the source with `ast` (nothing is imported), and counts every import a
module can run: at the top and inside functions (a lazy import is still a dependency: it only
moves the circle to run time). Imports under `if TYPE_CHECKING:` never run and are left out;
so is a module importing its own package (`from sm120patch import cli` in `cli/tree.py`: the
package's face, which Python has loaded before any of its modules).
"""

from __future__ import annotations

import ast
from pathlib import Path

import sm120patch

ROOT = Path(sm120patch.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = ["sm120patch", *p.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _runtime_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement except those guarded by `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    walk(other)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            walk(child)

    walk(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the sm120patch modules it imports (a name imported from a package that is itself
    a module counts as that module)."""
    mods = _modules()

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for name in names:
                target = known(name) if name.startswith("sm120patch") else None
                if target is None or target == mod:
                    continue
                if mods[target].name == "__init__.py" and mod.startswith(target + "."):
                    continue  # its own package's face
                graph[mod].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _why(graph: dict[str, set[str]], comp: list[str]) -> str:
    return "; ".join(f"{a} -> {b}" for a in comp for b in sorted(graph[a]) if b in comp)


def test_no_module_imports_itself_through_others() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import circles: " + " | ".join(_why(graph, c) for c in found)


def test_no_package_imports_itself_through_another() -> None:
    """sm120patch's packages (engine, planning, probes, ...) and top-level modules form layers:
    planning never reads the engine, probes never the engine or planning."""
    graph = import_graph()

    def unit(mod: str) -> str:
        return ".".join(mod.split(".")[:2])

    packages: dict[str, set[str]] = {}
    for a, deps in graph.items():
        packages.setdefault(unit(a), set()).update(unit(b) for b in deps if unit(b) != unit(a))
    found = cycles(packages)
    detail = [
        f"{a} -> {b}"
        for c in found
        for a, deps in graph.items()
        for b in deps
        if unit(a) in c and unit(b) in c
        if unit(a) != unit(b)
    ]
    assert not found, f"package circles {found}: " + "; ".join(sorted(detail))


def test_the_graph_sees_lazy_imports_and_skips_type_checking() -> None:
    """The reader itself, on code whose answer is known: a function-level import is an edge,
    a TYPE_CHECKING one is not, and a circle of two is found."""
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from sm120patch.engine import journal\n"
        "def f():\n    from sm120patch.planning import plan\n"
    )
    names = [n.module for n in _runtime_imports(tree) if isinstance(n, ast.ImportFrom)]
    assert names == ["typing", "sm120patch.planning"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert "sm120patch.engine.steps" in import_graph()["sm120patch.engine.pipeline"]
