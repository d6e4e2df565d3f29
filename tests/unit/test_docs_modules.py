"""docs/how-it-works.md's module table names every module of the package, so a newcomer who
reads it finds each file's job (issue 21): a module added without a row, or a word, fails here."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _table() -> str:
    text = (ROOT / "docs" / "how-it-works.md").read_text(encoding="utf-8")
    start = text.index("| step | module | what it does |")
    end = text.index("\n\n", start)
    return text[start:end]


def _named(table: str) -> set[str]:
    """Every backticked token of the table: file names, folder/file paths, globs, transform names."""
    return set(re.findall(r"`([^`\s]+)`", table))


def test_every_module_is_in_the_module_table() -> None:
    names = _named(_table())
    missing = []
    for path in sorted((ROOT / "sm120patch").rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        rel = path.relative_to(ROOT / "sm120patch").as_posix()
        dashed = path.stem.replace("_", "-")
        if not any(fnmatch.fnmatch(rel, n) or fnmatch.fnmatch(path.name, n) or n == dashed for n in names):
            missing.append(rel)
    assert not missing, f"add a row or a name to docs/how-it-works.md's module table for: {', '.join(missing)}"


def test_the_table_names_no_module_that_is_gone() -> None:
    """The other way round: a `.py` the table names exists (a renamed module leaves no stale row)."""
    modules = {p.relative_to(ROOT / "sm120patch").as_posix() for p in (ROOT / "sm120patch").rglob("*.py")}
    files = {p.rsplit("/", 1)[-1] for p in modules}
    gone = [
        n
        for n in _named(_table())
        if n.endswith(".py")
        and not n.startswith(".")
        and "*" not in n
        and n not in modules
        and n not in files
        and not any(m.endswith("/" + n) for m in modules)
    ]
    assert not gone, f"docs/how-it-works.md's module table names modules that do not exist: {', '.join(gone)}"
