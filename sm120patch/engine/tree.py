"""apply, rollback and status of one tree, and the entry points guard, diagnose and verify use.

Every layout runs the one pipeline (`pipeline.py`), one tree too: these are that pipeline on one
target, with the per-tree steps (`steps.py`) under it. Plain functions over plain data; the CLI
only parses flags and prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120patch.arch import Arch
from sm120patch.catalogue.recipes import Recipe, load_recipes
from sm120patch.engine.journal import Journal
from sm120patch.engine.pipeline import RunSettings, apply_many, plan_many, rollback_many
from sm120patch.engine.steps import (  # noqa: F401 (the names callers read from here)
    Probe,
    applied_reasons,
    block_failing,
    file_state,
    mark_stale,
    rechecks,
    replan,
    rollback_hint,
    rollback_locked,
    write_proven,
)
from sm120patch.errors import UserError
from sm120patch.hints import rollback_command
from sm120patch.planning.plan import APPLIED, RecipePlan, plan  # noqa: F401 (plan: tests wrap it here)
from sm120patch.planning.targets import Target, discover


@dataclass
class FileState:
    rel: str
    state: str  # file_state(): as-applied | changed-since-apply | replaced-by-pip | missing
    recipes: list[str]

    def to_dict(self) -> dict[str, object]:
        return {"path": self.rel, "state": self.state, "recipes": self.recipes}


def make_plan(
    target: Target,
    recipes: Sequence[Recipe],
    arch: Arch | Sequence[Arch],
    probe: Probe | None = None,
    *,
    allow_untested: bool = False,
) -> list[RecipePlan]:
    """The dry run: statuses and diffs; an applicable recipe whose probe fails is `blocked`,
    an applied one whose proof no longer holds is `stale` (`pipeline.plan_many`, one target)."""

    archs = [arch] if isinstance(arch, Arch) else list(arch)
    return plan_many([target], recipes, RunSettings.with_probe(archs, probe, allow_untested))


def apply(
    target: Target,
    recipes: Sequence[Recipe],
    arch: Arch | Sequence[Arch],
    *,
    probe: Probe | None = None,
    force: bool = False,
    commit: bool = False,
    wait_s: float = 0.0,
    only: Sequence[str] | None = None,
    exclude: Sequence[str] | None = None,
    allow_untested: bool = False,
) -> list[RecipePlan]:
    """Take back what went stale, plan, probe, then journal and write what the probe proved:
    `pipeline.apply_many` on one target (every layout runs that one pipeline)."""

    archs = [arch] if isinstance(arch, Arch) else list(arch)
    return apply_many(
        [target], recipes, RunSettings.with_probe(archs, probe, allow_untested),
        force=force, commit=commit, wait_s=wait_s, only=only, exclude=exclude,
    )  # fmt: skip


def rollback(
    target: Target,
    recipes: Sequence[Recipe],
    arch: Arch | None = None,
    *,
    ids: Sequence[str] | None = None,
    force: bool = False,
    wait_s: float = 0.0,
    missing_ok: bool = False,
) -> dict[str, Any]:
    """Take recipes back out (all by default), restoring the recorded original bytes:
    `transaction.rollback_many` on one target, so the dependents rule holds here too.
    `missing_ok`: ids not applied here are skipped instead of refused. Returns this target's
    result (what other trees rolled back with it is under `also`)."""

    results = rollback_many([target], recipes, ids=ids, force=force, wait_s=wait_s, missing_ok=missing_ok)
    mine = next(
        (r for r in results if r["target"]["root"] == str(target.root) and r["target"]["package"] == target.package),
        {"rolled_back": [], "recovered": [], "kept_copies": [], "remaining": [], "retired": []},
    )
    others = [r for r in results if r is not mine]
    return {**mine, "also": others} if others else mine


def status(target: Target, recipes: Sequence[Recipe] = (), probe: Probe | None = None) -> dict[str, Any]:
    """What is applied, whether its files changed since, and (with a probe) whether its proof holds."""
    journal = Journal.open(target.root)
    mine = [a for a in journal.applied if a.get("package", target.package) == target.package]
    files = []
    for a in mine:
        for rel in a["files"]:
            files.append(FileState(rel, file_state(journal, rel), [a["id"]]))
    merged: dict[str, FileState] = {}
    for f in files:
        if f.rel in merged:
            merged[f.rel].recipes += f.recipes
        else:
            merged[f.rel] = f
    pending = journal.data.get("pending")  # a transaction of the whole tree (both packages in site-packages)
    from sm120patch.engine.pipstate import OTHER_RELEASE, obsolete

    pip = {r.id: r for r in obsolete(journal, target)}
    for f in merged.values():  # a file of an entry from another release is that release's, not an edit
        if any(pip.get(i) and pip[i].state == OTHER_RELEASE for i in f.recipes):
            f.state = OTHER_RELEASE
    checks = rechecks(journal, target, [r for r in recipes if r.id not in pip], probe) if recipes else {}
    applied = []
    for a in mine:
        row = {k: a.get(k) for k in ("id", "at", "arch", "version", "dist_version", "files")}
        row["state"] = pip[a["id"]].state if a["id"] in pip else APPLIED
        if a["id"] in pip:
            row["why"] = pip[a["id"]].why
        ev = a.get("evidence") or {}
        row["proof"] = {"level": ev.get("level"), "rung": ev.get("rung"), "verdicts": len(ev.get("verdicts") or [])}
        if a["id"] in checks:
            c = checks[a["id"]]
            row["recheck"] = c.to_dict()
            if not c.holds:
                row["rollback"] = rollback_hint(target, a["id"])
        applied.append(row)
    return {
        "journal": str(journal.dir) if journal.exists else None,
        "applied": applied,
        "files": [f.to_dict() for f in merged.values()],
        "interrupted": sorted(pending["writes"]) if pending else [],
        "stale": [a["id"] for a in applied if a.get("recheck", {}).get("holds") is False],
        "retire": [r.to_dict() for r in pip.values()],
        "damaged": _damage(journal, target),
        "legacy": _legacy(target),
    }


def _legacy(target: Target) -> str:
    """A journal an older sm120patch kept in the package folder itself (bug 11's second journal)."""
    from sm120patch.engine.journal import DIRNAME

    if target.root != target.package_dir and (target.package_dir / DIRNAME / "journal.json").is_file():
        return (
            f"an older sm120patch kept a second journal in {target.package_dir}: "
            f"`{rollback_command(target.package_dir)}` takes back what it holds"
        )
    return ""


def _damage(journal: Journal, target: Target) -> str:
    """Why the journal could not roll this package back, with the commands that fix it; "" when it can."""
    from sm120patch.engine.journal import damage_advice

    lost = [rel for rel in journal.missing_blobs() if (journal.root / rel).is_relative_to(target.package_dir)]
    if not lost:
        return ""
    return (
        f"{journal.dir}: the original bytes of {', '.join(lost)} are gone from blobs/, so rollback cannot "
        f"restore them; {damage_advice(journal.root, journal.dir, readable=True)}"
    )


_rollback_locked = rollback_locked  # the name before the pipeline was one


# --- entry points other modules (guard, diagnose) use -------------------------------------------


def applied_recipes(target_path: Path) -> set[str]:
    """Recipe ids applied at `target_path` (every package it holds), as guard and diagnose should
    see them: those pip has since replaced or that belong to another release are not applied."""
    from sm120patch.engine.pipstate import obsolete

    out: set[str] = set()
    for t in discover(target_path):
        journal = Journal.open(t.root)
        gone = {r.id for r in obsolete(journal, t)}
        out |= {a["id"] for a in journal.applied if a.get("package", t.package) == t.package and a["id"] not in gone}
    return out


def stale_recipes(target_path: Path, level: str = "static") -> dict[str, str]:
    """Recipes applied at `target_path` whose proof no longer holds for the FlashInfer in front
    of the tree now (the one they were proven on, where it still is): {id: why}."""
    from sm120patch.arch import parse_arch
    from sm120patch.engine.which_flashinfer import resolve_flashinfer
    from sm120patch.probes.recipe_probe import make_probe

    targets = discover(target_path)
    recipes = load_recipes()
    out: dict[str, str] = {}
    for t in targets:
        journal = Journal.open(t.root)
        names = {n for a in journal.applied for n in str(a.get("arch", "")).split(",") if n}
        if not names:
            continue
        probe = make_probe(sorted(parse_arch(n) for n in names), resolve_flashinfer(targets, None, None), level)
        out.update({i: c.reason for i, c in rechecks(journal, t, recipes, probe).items() if not c.holds})
    return out


class RolledBack(list):  # noqa: FURB189 - a list guard already reads, plus the reasons
    """The ids rolled back, and for each id asked for that was not, why (guard prints it)."""

    def __init__(self, done: Sequence[str], reasons: dict[str, str]) -> None:
        super().__init__(done)
        self.reasons = reasons


def rollback_recipes(target_path: Path, recipe_ids: list[str]) -> RolledBack:
    """Roll back these recipes wherever they are applied at `target_path` (every package it
    holds: one site-packages holds both), with their dependents (the same pipeline as
    `sm120patch rollback`); returns the ids rolled back or retired, and why any other was not."""

    targets = discover(target_path)
    held = {a["id"] for t in targets for a in Journal.open(t.root).applied}
    reasons = {i: f"not applied at {target_path} (the journal does not hold it)" for i in recipe_ids if i not in held}
    ids = [i for i in recipe_ids if i in held]
    if not ids:
        return RolledBack([], reasons)
    try:
        results = rollback_many(targets, load_recipes(), ids=ids)
    except UserError as e:
        return RolledBack([], {**reasons, **{i: str(e) for i in ids}})
    done = [i for r in results for i in r["rolled_back"]] + [x["id"] for r in results for x in r.get("retired", [])]
    return RolledBack(list(dict.fromkeys(done)), reasons)
