#!/usr/bin/env python3
"""`make lint` for the tests themselves: rules a reviewer would otherwise have to remember.

- No timed assertions (`assert ... perf_counter()/monotonic()/elapsed ... <`): these machines
  are noisy; speed is measured in `make bench` as ratios, never asserted in a test.
- One rule for skipping: only tests/conftest.py reads `CI`; nothing calls
  `pytest.importorskip` on our own modules (a missing module is a failure, not a skip).
- A test checks something: a `test_*` function holds an `assert`, a `pytest.raises`/`fail`/`warns`,
  or calls a helper named assert*/check*/expect* (or a mock's assert_*). One that delegates to
  a helper of another name is allow-listed below, with the reason.
- No check that cannot fail: `assert True`, `assert <constant>`, `assert x == x`, `assert f() == f()`.
- No skip of a tool CI promises (tests/conftest.py CI_TOOLS: git, patch, ...): `shutil.which`
  of one of them outside tests/conftest.py (an `if shutil.which("patch"):` silently drops an
  oracle, a `requires(shutil.which("git"))` turns a broken CI box into a skip); use
  `needs_tool()` or `@pytest.mark.needs(...)`, which fail in CI.
- No expectation read from a file the code under test writes (GENERATED: docs/compatibility.md
  is the planner's output, docs/reliability.md the suite's own figures, ...).

Exit 1 with one line per finding (file:line: rule), 0 when clean. ALLOWED lists the findings
that stand, each with its reason; an entry that no longer matches anything is a finding too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMERS = ("perf_counter", "monotonic", "time.time", "elapsed", "seconds")
# files a tool of this repo writes from the code under test (Makefile: docs, bench, reliability, triage-score)
GENERATED = ("compatibility.md", "reliability.md", "performance.md", "reliability-figures.json", "gpu-validation.md")
CHECK_PREFIXES = ("assert", "check", "expect", "_assert", "_check", "_expect")
PYTEST_CHECKS = ("raises", "fail", "warns", "deprecated_call")

# (path, test or "<module>", rule) -> why the finding stands. Keep each reason true.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("tests/unit/test_docs_blocks.py", "<module>", "generated"): (
        "the generated docs are this test's subject, not its oracle: it checks each one's stamp "
        "against a hash of the inputs it describes (stale or not)"
    ),
    ("tests/unit/test_docs_blocks.py", "test_performance_doc_is_the_rendering_of_last_run", "generated"): (
        "checks that performance.md is what its generator renders from last-run.json: the doc is the subject"
    ),
}


def ci_tools() -> tuple[str, ...]:
    """CI_TOOLS as tests/conftest.py writes it (read with ast: one list, no import of pytest here)."""
    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CI_TOOLS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return ()


def _timed_assert(node: ast.Assert) -> bool:
    for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
        if any(isinstance(op, (ast.Lt, ast.LtE, ast.Gt, ast.GtE)) for op in cmp.ops):
            text = ast.unparse(cmp)
            if any(t in text for t in TIMERS):
                return True
    return False


def _tautology(node: ast.Assert) -> bool:
    """`assert True`, `assert "text"`, `assert x == x`, `assert f(a) is f(a)`: passes whatever the code does."""
    test = node.test
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        same = ast.dump(test.left) == ast.dump(test.comparators[0])
        return same and isinstance(test.ops[0], (ast.Eq, ast.Is, ast.LtE, ast.GtE, ast.In))
    return False


def _link_parents(tree: ast.AST) -> None:
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            child.parent = parent  # type: ignore[attr-defined]


def _enclosing_test(node: ast.AST) -> str:
    name = "<module>"
    while node is not None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = node.name
        node = getattr(node, "parent", None)
    return name


def _checks_something(fn: ast.FunctionDef | ast.AsyncFunctionDef, helpers: frozenset[str] = frozenset()) -> bool:
    """An assert, a pytest check, a call of an assert*/check*/expect* name, or of a helper of this
    file that itself checks something (`helpers`)."""
    for n in ast.walk(fn):
        if isinstance(n, ast.Assert):
            return True
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if isinstance(f, ast.Attribute) and ast.unparse(f.value) == "pytest" and name in PYTEST_CHECKS:
                return True
            if name.lower().startswith(CHECK_PREFIXES) or (isinstance(f, ast.Name) and name in helpers):
                return True
    return False


def _checking_helpers(tree: ast.AST) -> frozenset[str]:
    """Functions of the file that check something, directly or through one another (a fixpoint)."""
    defs = {
        n.name: n
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and not n.name.startswith("test_")
    }
    found: set[str] = set()
    while True:
        more = {name for name, fn in defs.items() if name not in found and _checks_something(fn, frozenset(found))}
        if not more:
            return frozenset(found)
        found |= more


def _is_docstring(node: ast.Constant) -> bool:
    parent = getattr(node, "parent", None)
    return isinstance(parent, ast.Expr)


def main() -> int:
    findings = []
    tools = ci_tools()
    used: set[tuple[str, str, str]] = set()
    for path in sorted((ROOT / "tests").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), rel)
        for line, test, rule, text in check_tree(rel, tree, tools):
            if (rel, test, rule) in ALLOWED:
                used.add((rel, test, rule))
                continue
            findings.append(f"{rel}:{line}: {text}")
    for key in sorted(set(ALLOWED) - used):
        findings.append(f"tools/check_tests.py: ALLOWED entry {key} matches nothing; remove it")
    for f in findings:
        print(f)
    return 1 if findings else 0


def check_tree(rel: str, tree: ast.AST, tools: tuple[str, ...] = ()) -> list[tuple[int, str, str, str]]:
    """(line, test function or "<module>", rule, message) for every finding in one test file."""
    _link_parents(tree)
    out: list[tuple[int, str, str, str]] = []

    def add(node: ast.AST, rule: str, text: str) -> None:
        out.append((node.lineno, _enclosing_test(node), rule, text))

    is_test_file = Path(rel).name.startswith("test_")
    helpers = _checking_helpers(tree) if is_test_file else frozenset()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and _timed_assert(node):
            add(node, "timed", "timed assertion; measure speed in `make bench`, assert behaviour here")
        if isinstance(node, ast.Assert) and _tautology(node):
            add(node, "tautology", f"`assert {ast.unparse(node.test)}` cannot fail; compare with an independent truth")
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("pytest.importorskip", "importorskip"):
            add(node, "importorskip", "importorskip hides a broken import; import it and let it fail")
        if rel != "tests/conftest.py" and isinstance(node, ast.Constant) and node.value == "CI":
            parent = getattr(node, "parent", None)
            if parent is not None and "environ" in ast.unparse(parent):
                add(node, "reads-ci", "reads CI itself; use tests.conftest.in_ci() or unavailable()")
        if (
            rel != "tests/conftest.py"
            and isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("shutil.which", "which")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in tools
        ):
            tool = node.args[0].value
            add(
                node,
                "ci-tool",
                f"`shutil.which({tool!r})` decides a test on a tool CI promises; "
                f"use needs_tool({tool!r}) or @pytest.mark.needs({tool!r}) (fails in CI)",
            )
        if (
            is_test_file
            and isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and not _is_docstring(node)
            and any(node.value.endswith(g) for g in GENERATED)
        ):
            add(node, "generated", f"{node.value!r} is written by the code under test; it is no oracle")
        if (
            is_test_file
            and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test_")
            and not _checks_something(node, helpers)
        ):
            add(node, "no-check", f"{node.name} asserts nothing (no assert, pytest.raises, or assert*/check* helper)")
    return out


if __name__ == "__main__":
    sys.exit(main())
