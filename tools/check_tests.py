#!/usr/bin/env python3
"""`make lint` for the tests themselves: rules a reviewer would otherwise have to remember.

- No timed assertions (`assert ... perf_counter()/monotonic()/elapsed ... <`): these machines
  are noisy; speed is measured in `make bench` as ratios, never asserted in a test.
- One rule for skipping: only tests/conftest.py reads `CI`; nothing calls
  `pytest.importorskip` on our own modules (a missing module is a failure, not a skip).

Exit 1 with one line per finding (file:line: rule), 0 when clean.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMERS = ("perf_counter", "monotonic", "time.time", "elapsed", "seconds")


def _timed_assert(node: ast.Assert) -> bool:
    for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
        if any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in cmp.ops):
            text = ast.unparse(cmp)
            if any(t in text for t in TIMERS):
                return True
    return False


def _link_parents(tree: ast.AST) -> None:
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            child.parent = parent  # type: ignore[attr-defined]


def main() -> int:
    findings = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), rel)
        _link_parents(tree)
        findings += _check_tree(rel, tree)
    for f in findings:
        print(f)
    return 1 if findings else 0


def _check_tree(rel: str, tree: ast.AST) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and _timed_assert(node):
            out.append(f"{rel}:{node.lineno}: timed assertion; measure speed in `make bench`, assert behaviour here")
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("pytest.importorskip", "importorskip"):
            out.append(f"{rel}:{node.lineno}: importorskip hides a broken import; import it and let it fail")
        if rel != "tests/conftest.py" and isinstance(node, ast.Constant) and node.value == "CI":
            parent = getattr(node, "parent", None)
            if parent is not None and "environ" in ast.unparse(parent):
                out.append(f"{rel}:{node.lineno}: reads CI itself; use tests.conftest.in_ci() or unavailable()")
    return out


if __name__ == "__main__":
    sys.exit(main())
