"""A recipe's rewritten files must compile: checked once per recipe and file, and a failure
still names the edit that broke the file (planning/plan.py, `plan_recipe`).

The oracle for "does not compile" is Python's own `compile()` on code libcst accepts and
Python rejects (`del (flag or other)`), not a flag of ours.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120patch.arch import parse_arch
from sm120patch.catalogue.recipes import load_recipe, load_recipes
from sm120patch.engine import tree as engine
from sm120patch.planning import plan as planning
from sm120patch.planning.plan import APPLICABLE, FAILED
from sm120patch.planning.targets import discover
from tests.unit.sglang_fakes import ALLREDUCE, make_sglang, snapshot

SM120 = parse_arch("sm_120")

MODULE = "def f():\n    flag = ready()\n    if flag:\n        go()\n    del flag\n"

RECIPE = """\
id = "r"
package = "sglang"
title = "Two wraps of one name"
why = "The second one lands in a `del`, which Python refuses."
versions = ">=0.5.5"
arch = ["sm_120"]

[[edit]]
name = "first"
transform = "wrap-expression"
functions = ["f"]
files = ["srt/m.py"]
params = {{ anchor = "flag", template = "__anchor__ or other", near = "go" }}
{second}"""

SECOND = """
[[edit]]
name = "second"
transform = "wrap-expression"
functions = ["f"]
files = ["srt/m.py"]
params = { anchor = "flag", template = "__anchor__ or more" }
"""


def _tree(tmp_path: Path, second: str) -> tuple[list, Path]:
    pkg = tmp_path / "tree" / "sglang"
    (pkg / "srt").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text('__version__ = "0.5.9"\n')
    (pkg / "srt" / "__init__.py").write_text("")
    (pkg / "srt" / "m.py").write_text(MODULE)
    recipe_file = tmp_path / "recipes" / "sglang" / "r.toml"
    recipe_file.parent.mkdir(parents=True)
    recipe_file.write_text(RECIPE.format(second=second))
    return [load_recipe(recipe_file)], tmp_path / "tree"


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The filenames plan.py hands to `compile()`, in order (the builtin still does the work)."""
    seen: list[str] = []

    def counting(source: str, filename: str, mode: str, *a: object, **k: object) -> object:
        seen.append(Path(filename).name)
        return compile(source, filename, mode, *a, **k)  # type: ignore[call-overload]

    monkeypatch.setattr(planning, "compile", counting, raising=False)
    return seen


def test_a_file_two_edits_and_the_taken_line_rewrite_is_compiled_once(tmp_path: Path, compiles: list[str]) -> None:
    make_sglang(tmp_path)
    (target,) = discover(tmp_path)
    recipes = [r for r in load_recipes() if r.id == ALLREDUCE]
    (p,) = engine.make_plan(target, recipes, SM120)
    assert p.status == APPLICABLE
    assert len(p.edits) >= 2 and p.changes
    assert sorted(compiles) == sorted(Path(rel).name for rel in p.changes)  # one per file, not per step


def test_an_edit_whose_output_does_not_compile_fails_its_recipe_by_name(tmp_path: Path, compiles: list[str]) -> None:
    recipes, tree = _tree(tmp_path, SECOND)
    before = snapshot(tree)
    (target,) = discover(tree)
    (p,) = engine.make_plan(target, recipes, SM120)
    assert p.status == FAILED, p.reason
    assert p.reason.startswith("edit second: rewritten code does not compile"), p.reason
    assert not p.changes
    assert len(compiles) >= 2  # the end-of-recipe check failed, then the strict replay named the edit
    with pytest.raises(SyntaxError):  # the oracle: Python itself refuses what the second edit wrote
        compile("def f():\n    del (flag or more)\n", "m.py", "exec")
    engine.apply(target, recipes, SM120)
    assert snapshot(tree) == before  # nothing of a failed recipe is written


def test_the_same_recipe_without_the_bad_edit_applies(tmp_path: Path, compiles: list[str]) -> None:
    recipes, tree = _tree(tmp_path, "")
    (target,) = discover(tree)
    (p,) = engine.make_plan(target, recipes, SM120)
    assert p.status == APPLICABLE, p.reason
    ((_, after),) = p.changes.values()
    assert b"if flag or other:" in after and b"del flag\n" in after
    assert compiles == ["m.py"]
