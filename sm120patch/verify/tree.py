"""Switch the tree between the arms of a comparison, only through the journal.

Three calls into the engine: which recipes are applied (`engine.applied_recipes`), apply some
(`pipeline.apply_many`, probe first, as `sm120patch apply --recipe` does), roll some back
(`transaction.rollback_many`); and the journal's own recovery (`Journal.lock` + `recover`) for a
write that Ctrl-C cut short. Only the recipes under test are ever touched: others the user
applied stay in both arms.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sm120patch.catalogue.recipes import Recipe
from sm120patch.planning.targets import Target


@dataclass
class Switch:
    """What one switch did."""

    applied: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # id -> why apply did not write it


class Tree:
    def __init__(self, targets: Sequence[Target], recipes: Sequence[Recipe], run: Any, managed: Iterable[str]):
        self.targets, self.recipes, self.run = list(targets), list(recipes), run
        self.managed = set(managed)

    def applied(self) -> set[str]:
        from sm120patch.engine.tree import applied_recipes

        out: set[str] = set()
        for t in self.targets:
            out |= applied_recipes(t.root)
        return out

    def stands_on(self) -> dict[str, set[str]]:
        """Applied recipe id -> the applied FlashInfer recipes it stands on, by the engine's rule
        (the dependents recorded at apply, or a proof that read what a FlashInfer recipe changed:
        `_dependents_of`, the rule `rollback` follows), read from the journals without a lock."""
        from sm120patch.engine.journal import Journal
        from sm120patch.engine.pipeline import _dependents_of

        journals = {t.root: Journal.open(t.root) for t in self.targets}
        out: dict[str, set[str]] = {}
        for fi in [t for t in self.targets if t.package == "flashinfer"]:
            for entry in [a for a in journals[fi.root].applied if a.get("package") == "flashinfer"]:
                for ids in _dependents_of(journals, self.targets, fi, [entry]).values():
                    for i in ids:
                        out.setdefault(i, set()).add(entry["id"])
        return out

    def taken_wired(self, rid: str) -> bool:
        """Whether the files the journal holds for applied recipe `rid` carry its taken line
        (`_sm120patch_taken("<rid>", ...)`, sm120patch/planning/taken.py); False where the release
        had no anchor for it, or it is not applied."""
        from sm120patch.engine.journal import Journal
        from sm120patch.planning.taken import HELPER

        needle = f'{HELPER}("{rid}",'
        for t in self.targets:
            for entry in Journal.open(t.root).applied:
                if entry.get("id") != rid:
                    continue
                for rel in entry.get("files") or []:
                    try:
                        if needle in (t.root / rel).read_text(encoding="utf-8", errors="replace"):
                            return True
                    except OSError:
                        continue
        return False

    def recover(self) -> list[str]:
        """Finish a transaction an interrupt cut short (its files back to their before-bytes)."""
        from sm120patch.engine.journal import Journal

        restored: list[str] = []
        for root in sorted({t.root for t in self.targets}):
            journal = Journal.open(root)
            if journal.data.get("pending"):
                with journal.lock():
                    restored += journal.recover()
        return restored

    def switch_to(self, wanted: set[str]) -> Switch:
        """Make the managed recipes applied exactly where `wanted` says; returns what changed."""
        from sm120patch.engine.pipeline import apply_many, rollback_many

        self.recover()
        done = Switch()
        now = self.applied()
        drop = sorted((now - wanted) & self.managed)
        if drop:
            for r in rollback_many(self.targets, self.recipes, ids=drop):
                done.rolled_back += r["rolled_back"]
        add = sorted((wanted - self.applied()) & self.managed)
        if add:
            plans = apply_many(self.targets, self.recipes, self.run, only=add)
            after = self.applied()
            done.applied = [i for i in add if i in after]
            for p in plans:
                if p.recipe.id in add and p.recipe.id not in after:
                    done.refused[p.recipe.id] = f"{p.status}: {p.reason}"
            for i in add:
                if i not in after and i not in done.refused:
                    done.refused[i] = "not planned for this tree"
        return done
