"""The status vocabulary (sm120patch/status.py, issue 21 item 2): a status outside it cannot be set
on a plan or written into a bundle, every status has its policy (exit, colour, advice), and no
module spells a status by hand or changes one except through `RecipePlan.mark`."""

from __future__ import annotations

import ast
import json
import re
import shlex
from pathlib import Path

import click
import pytest

from sm120patch.bundle.format import BundleRecipe
from sm120patch.catalogue.recipes import load_recipes
from sm120patch.planning.plan import RecipePlan
from sm120patch.status import EXPORTED, IN_BUNDLE, POLICY, Status, advice, fails

ROOT = Path(__file__).resolve().parents[2]
# The words users see, as README.md and docs/how-it-works.md spell them (the oracle, not status.py).
WORDS = {
    "applicable", "satisfied", "not-applicable", "blocked", "applied",
    "reverted", "stale", "failed", "untested", "excluded",
}  # fmt: skip
# README "Exit codes": a recipe that failed, was blocked, is untested, is stale or was reverted exits 1.
EXIT_1 = {"failed", "blocked", "untested", "stale", "reverted"}


@pytest.fixture(scope="module")
def recipe():  # noqa: ANN201
    return load_recipes()[0]


def _bundle_recipe(status: str) -> BundleRecipe:
    return BundleRecipe("r", "sglang", "t", "w", status, "why", "", None, None, "0" * 64, ">=0", ["sm_120"], [])


# --- a status outside the vocabulary cannot be set ----------------------------------------------


@pytest.mark.parametrize("word", ["untested ", "Applied", "pending", "exported", "replaced-by-pip", "", None])
def test_a_plan_refuses_a_status_outside_the_vocabulary(recipe, word) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="not a recipe status"):
        RecipePlan(recipe, None, word, "made")  # type: ignore[arg-type]
    p = RecipePlan(recipe, None, Status.APPLICABLE, "gate found")
    with pytest.raises(ValueError, match="not a recipe status"):
        p.mark(word, "changed")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a recipe status"):
        p.status = word  # type: ignore[assignment]
    assert (p.status, p.reason) == (Status.APPLICABLE, "gate found")  # a refused change changes nothing


def test_mark_sets_status_and_reason_and_the_json_keeps_the_word(recipe) -> None:  # noqa: ANN001
    p = RecipePlan(recipe, None, "applicable", "gate found")  # a word read back from a cache
    assert p.status is Status.APPLICABLE
    p.mark(Status.BLOCKED, "spec rung: no kernel")
    assert p.status is Status.BLOCKED and p.reason == "spec rung: no kernel"
    assert json.dumps(p.to_dict()["status"]) == '"blocked"'
    assert f"{p.status:<9}|" == "blocked  |" and str(p.status) == "blocked"


def test_every_status_word_is_one_users_see() -> None:
    assert {s.value for s in Status} == WORDS


@pytest.mark.parametrize("word", ["applicable", "bogus", "pending", ""])
def test_a_bundle_recipe_refuses_a_status_its_reader_would_refuse(word: str) -> None:
    """An applicable recipe is `exported` in a bundle; anything else outside the vocabulary is refused
    where the manifest entry is made, not when a GPU node reads it (the untested manifest of issue 21)."""
    with pytest.raises(ValueError, match="not a bundle status"):
        _bundle_recipe(word)


def test_a_bundle_recipe_takes_every_plan_status_but_applicable_and_exported() -> None:
    for word in (WORDS - {"applicable"}) | {"exported"}:
        assert _bundle_recipe(word).status == word
    assert {EXPORTED, *WORDS} - {"applicable"} == IN_BUNDLE


# --- every status has its policy ---------------------------------------------------------------


@pytest.mark.parametrize("status", list(Status))
def test_every_status_has_a_colour_a_fail_policy_and_advice(status: Status) -> None:
    policy = POLICY[status]
    click.style("x", fg=policy.colour)  # TypeError for a colour click does not know
    assert policy.fails is (status.value in EXIT_1)
    assert fails(status) is (status.value in EXIT_1)
    assert fails(status, ok_blocked=True) is (status.value in EXIT_1 - {"blocked"})
    if policy.fails:
        assert policy.colour not in ("green", "cyan"), "a failing status is not printed in a colour of success"
    said = advice(status, shlex.quote("/tmp/my tree"), "sglang-x")
    assert said.strip() and "{" not in said, f"{status}: advice missing or not filled in"
    commands = re.findall(r"`sm120patch (\w+)", said)
    from sm120patch.cli import COMMANDS

    assert all(c in COMMANDS for c in commands), f"{status}: advice names a command that does not exist: {commands}"
    if "{root}" in policy.advice:
        assert "'/tmp/my tree'" in said  # the tree goes in shell-quoted


def test_the_readme_names_the_statuses_that_exit_1() -> None:
    """The oracle above is README's: its --ok-blocked line lists what still exits 1."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    said = re.search(r"blocked\s+recipes exit 0; ([^)]*) still exit 1", text)
    assert said, "README.md: the --ok-blocked sentence is gone"
    assert set(re.split(r",\s*|\s+and\s+", said.group(1))) == EXIT_1 - {"blocked"}


def test_the_docs_statuses_table_has_a_row_for_every_status() -> None:
    text = (ROOT / "docs" / "how-it-works.md").read_text(encoding="utf-8")
    start = text.index("| status | meaning |", text.index("## Statuses"))
    table = text[start : text.index("\n\n", start)]
    rows = set(re.findall(r"^\| `([^`]+)` \|", table, flags=re.M))
    assert rows >= WORDS, f"docs/how-it-works.md, Statuses: no row for {sorted(WORDS - rows)}"


# --- nothing spells a status by hand or changes one elsewhere ----------------------------------


def _modules() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(encoding="utf-8"))) for p in sorted((ROOT / "sm120patch").rglob("*.py"))]


def _is_status(node: ast.AST) -> bool:
    """`x.status` or `x["status"]`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "status"
    return isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == "status"


def test_a_status_changes_only_through_mark() -> None:
    home = ROOT / "sm120patch" / "planning" / "plan.py"  # RecipePlan, whose mark and __setattr__ check it
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Assign):
                targets = [t for x in node.targets for t in (x.elts if isinstance(x, ast.Tuple) else [x])]
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and t.attr == "status" and path != home:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"set a plan's status with RecipePlan.mark, not by assignment: {found}"


def test_no_status_is_compared_with_a_string_literal() -> None:
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            if not any(_is_status(s) for s in sides):
                continue
            for s in sides:
                words = s.elts if isinstance(s, (ast.Tuple, ast.List, ast.Set)) else [s]
                if any(isinstance(w, ast.Constant) and w.value in WORDS | {EXPORTED} for w in words):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"compare statuses with the names in sm120patch/status.py: {found}"
