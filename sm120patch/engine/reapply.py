"""Put recipes back after guard rolled them back for nothing: the bad output outlived every
rollback, so the recipes were not its cause (guard's canary). Engine operations, kept here so
that triage (guard) and verify both reach them without importing each other."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def put_back(target: Path, ids: Sequence[str], recipes: Sequence[Any], archs: Sequence[str]) -> list[str]:
    """Apply `ids` again at `target` through the journal (probed at the static rung, as
    `sm120patch apply --recipe ID --probe static` would), for the archs they were applied for;
    returns the ids applied now. Raises what apply raises."""
    from sm120patch.engine.pipeline import RunSettings, apply_many
    from sm120patch.engine.tree import applied_recipes
    from sm120patch.planning.targets import discover
    from sm120patch.probes.recipe_probe import resolve_archs

    targets = discover(target)
    run = RunSettings.probing(targets, resolve_archs(list(archs))[0], "static", None, None)
    apply_many(targets, recipes, run, only=list(ids))
    now = applied_recipes(target)
    return [i for i in ids if i in now]


def archs_of(target: Path, ids: Sequence[str]) -> list[str]:
    """The archs the journal says these recipes were applied for (before guard rolls them back)."""
    from sm120patch.engine.journal import Journal
    from sm120patch.planning.targets import discover

    out: set[str] = set()
    for t in discover(target):
        for a in Journal.open(t.root).entries():
            if a.id in ids:
                out.update(a.archs)
    return sorted(out)
