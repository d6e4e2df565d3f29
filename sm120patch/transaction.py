"""Several targets in one run: an SGLang tree and the FlashInfer it runs on.

SGLang pins FlashInfer exactly, so opening an SGLang gate can need a FlashInfer recipe
first (the SM12x allreduce kernels backported to the FlashInfer a release pins). Order is
what makes that safe:

- plan and apply FlashInfer targets first; every FlashInfer recipe is probed on an overlay
  of the patched sources (`overlay.py`) before a byte is written, and the SGLang recipes'
  probes then judge that patched FlashInfer (the overlay in a dry run, the real tree once
  written);
- write FlashInfer, then SGLang; roll back SGLang, then FlashInfer. A kill at any moment
  leaves one of: nothing, FlashInfer patched (harmless alone: it only adds SM12x kernels),
  or both; never an SGLang gate open over a FlashInfer without its kernels;
- an SGLang recipe proven on a FlashInfer recipe is recorded as its dependent; rolling the
  FlashInfer recipe back rolls the dependent back first, and says so. A dependency this run
  did not record (the trees were patched in separate runs) is still caught: the SGLang
  recipe's proof no longer holds, so it is `stale` everywhere it is checked.

One journal per tree root: when both packages sit in one site-packages they share it (one
lock), and each package's recipes are still written as their own transaction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120patch import engine
from sm120patch.arch import Arch
from sm120patch.errors import UserError
from sm120patch.flashinfer_env import FlashInferEnv, from_tree
from sm120patch.journal import Journal
from sm120patch.overlay import overlay
from sm120patch.plan import APPLICABLE, REVERTED, RecipePlan, plan
from sm120patch.recipes import Recipe
from sm120patch.targets import Target

MakeProbe = Callable[[Sequence[Arch], Any, str], "engine.Probe | None"]


@dataclass
class Run:
    """What every target of one command shares."""

    archs: list[Arch]
    fi: FlashInferEnv | None  # the FlashInfer the probes judge before any FlashInfer recipe
    level: str
    make_probe: MakeProbe
    allow_untested: bool = False

    def probe(self, fi: FlashInferEnv | None) -> engine.Probe | None:
        return self.make_probe(self.archs, fi, self.level)


def ordered(targets: Sequence[Target]) -> list[Target]:
    """FlashInfer targets first: their recipes change what the SGLang recipes' probes see."""
    return sorted(targets, key=lambda t: t.package != "flashinfer")


def _package_changes(t: Target, plans: Sequence[RecipePlan]) -> dict[str, bytes]:
    """The bytes the planned recipes leave, by path inside the package (the last writer wins)."""
    out: dict[str, bytes] = {}
    for p in plans:
        for rel, (_, after) in p.changes.items():
            out[(t.root / rel).relative_to(t.package_dir).as_posix()] = after
    return out


def _fi_of(t: Target, run: Run) -> FlashInferEnv:
    return from_tree(t.package_dir, python=run.fi.python if run.fi else None)


def _relocate(proofs: dict[str, Any], real: FlashInferEnv) -> None:
    """Proofs made on an overlay stand for the real tree once written: record the real place."""
    for proof in proofs.values():
        for v in proof.verdicts:
            where = (v.get("evidence") or {}).get("flashinfer")
            if where:
                where["location"] = real.location


def _plan_flashinfer(
    t: Target, recipes: Sequence[Recipe], run: Run, journal: Journal
) -> tuple[list[RecipePlan], FlashInferEnv, dict[str, Any]]:
    """FlashInfer recipes, each probed on the sources it would leave. Returns the plans, the
    FlashInfer as it will be, and the proofs of the recipes that may be written."""
    base = _fi_of(t, run)
    applied = engine.applied_reasons(journal, t)
    plans = plan(t, recipes, run.archs, applied=applied, allow_untested=run.allow_untested)
    todo = [p for p in plans if p.status == APPLICABLE]
    proofs: dict[str, Any] = {}
    after = base
    if todo:
        after = overlay(base, _package_changes(t, todo))
        proofs = engine.block_failing(todo, run.probe(after))
        keep = [p for p in todo if p.status == APPLICABLE]
        if len(keep) < len(todo):
            ids = {p.recipe.id for p in keep}
            plans = engine.replan(t, recipes, run.archs, applied, plans, ids, run.allow_untested)
            after = overlay(base, _package_changes(t, [p for p in plans if p.recipe.id in ids]))
    engine.mark_stale(plans, journal, t, run.probe(base))
    return plans, after, proofs


def note_shadowing_builds(t: Target, plans: Sequence[RecipePlan]) -> None:
    """A FlashInfer recipe only counts once FlashInfer compiles the patched sources: name any
    compiled copy of the module it would load instead (an AOT module, a JIT build that never
    rebuilds), with the fix, in the recipe's reason (`fi_cache.py` says why each one shadows)."""
    from sm120patch.fi_cache import cached_builds
    from sm120patch.kernels import load_kernels

    kernels = load_kernels()
    for p in plans:
        if p.status not in (APPLICABLE, "applied"):
            continue
        patched = [t.root / rel for rel in p.files]
        for need in p.recipe.needs:
            for module in kernels[need].jit_modules if need in kernels else ():
                for b in cached_builds(t.package_dir, module, patched):
                    if b.shadows:
                        p.reason += (
                            f"; WARNING: {b.path} would be used instead of the patched sources: {b.why}; {b.fix}"
                        )


def plan_many(targets: Sequence[Target], recipes: Sequence[Recipe], run: Run) -> list[RecipePlan]:
    """The dry run over every target, in order; nothing is written. New recipes are judged on
    FlashInfer as the planned FlashInfer recipes would leave it; applied ones (stale or not) on
    the FlashInfer on disk now, because that is what a server started now would run."""
    fi = now = run.fi
    out: list[RecipePlan] = []
    for t in ordered(targets):
        journal = Journal.open(t.root)
        if t.package == "flashinfer":
            plans, fi, _ = _plan_flashinfer(t, recipes, run, journal)
            now = _fi_of(t, run)
            note_shadowing_builds(t, plans)
        else:
            applied = engine.applied_reasons(journal, t)
            plans = plan(t, recipes, run.archs, applied=applied, allow_untested=run.allow_untested)
            engine.block_failing(plans, run.probe(fi))
            engine.mark_stale(plans, journal, t, run.probe(now))
        out += plans
    return out


@contextlib.contextmanager
def _locked(roots: Sequence[Path], wait_s: float):  # noqa: ANN202
    """Every tree's journal, locked in one order (sorted roots) so two runs never deadlock."""
    journals: dict[Path, Journal] = {}
    with contextlib.ExitStack() as stack:
        for root in sorted(set(roots)):
            j = Journal.open(root)
            stack.enter_context(j.lock(wait_s))
            j.recover()
            journals[root] = j
        yield journals


def apply_many(
    targets: Sequence[Target],
    recipes: Sequence[Recipe],
    run: Run,
    *,
    force: bool = False,
    commit: bool = False,
    wait_s: float = 0.0,
    only: Sequence[str] | None = None,
) -> list[RecipePlan]:
    """apply over every target in order: FlashInfer probed on its overlay and written first,
    then SGLang probed on the FlashInfer now on disk."""
    fi = run.fi
    out: list[RecipePlan] = []
    fi_recipes: dict[str, tuple[Target, list[str]]] = {}  # FlashInfer location -> its applied recipe ids
    with _locked([t.root for t in targets], wait_s) as journals:
        for t in ordered(targets):
            journal = journals[t.root]
            if t.package == "flashinfer":
                stale = engine.take_back_stale(journal, t, recipes, run.archs, run.probe(_fi_of(t, run)))
                plans, _, proofs = _plan_flashinfer(t, _only(recipes, only), run, journal)
                _relocate(proofs, _fi_of(t, run))
                todo = [p for p in plans if p.status == APPLICABLE]
                engine.write_proven(journal, t, recipes, run.archs, todo, proofs, force=force, commit=commit)
                note_shadowing_builds(t, plans)
                fi = _fi_of(t, run)  # now patched on disk: what the SGLang probes judge
                fi_recipes[fi.location] = (t, [a["id"] for a in journal.applied if a.get("package") == t.package])
            else:
                plans = engine.apply_locked(
                    journal,
                    t,
                    recipes,
                    run.archs,
                    probe=run.probe(fi),
                    force=force,
                    commit=commit,
                    only=only,
                    allow_untested=run.allow_untested,
                )
                stale = {}
                _record_dependents(journals, t, plans, fi_recipes)
            for p in plans:
                if p.recipe.id in stale:
                    p.status, p.reason = REVERTED, f"reverted: {stale[p.recipe.id]}"
            out += plans
    return out


def _only(recipes: Sequence[Recipe], only: Sequence[str] | None) -> list[Recipe]:
    return [r for r in recipes if not only or r.id in only]


def _record_dependents(
    journals: dict[Path, Journal],
    t: Target,
    plans: Sequence[RecipePlan],
    fi_recipes: dict[str, tuple[Target, list[str]]],
) -> None:
    """Note, in the FlashInfer journal, each SGLang recipe whose proof read files a FlashInfer recipe
    of this run changed: it stands on that recipe, and goes when it goes."""
    journal = journals[t.root]
    for p in plans:
        entry = next((a for a in journal.applied if a["id"] == p.recipe.id and p.status == "applied"), None)
        if entry is None:
            continue
        for v in (entry.get("evidence") or {}).get("verdicts") or []:
            where = ((v.get("evidence") or {}).get("flashinfer") or {}).get("location")
            if where not in fi_recipes:
                continue
            fi_target, ids = fi_recipes[where]
            fi_journal = journals[fi_target.root]
            read = set((v.get("evidence") or {}).get("files") or {})
            for a in fi_journal.applied:
                if a["id"] not in ids or a.get("package") != "flashinfer":
                    continue
                # a dependent read what the FlashInfer recipe changed (paths inside the package)
                changed = {(fi_target.root / rel).relative_to(fi_target.package_dir).as_posix() for rel in a["files"]}
                if read & changed:
                    deps = a.setdefault("dependents", [])
                    dep = {"root": str(t.root), "package": t.package, "id": p.recipe.id}
                    if dep not in deps:
                        deps.append(dep)
            fi_journal.save()


def rollback_many(
    targets: Sequence[Target],
    recipes: Sequence[Recipe],
    *,
    ids: Sequence[str] | None = None,
    force: bool = False,
    wait_s: float = 0.0,
) -> list[dict[str, Any]]:
    """Roll back SGLang targets first, then FlashInfer ones (all recipes, or `ids` wherever they
    are applied); a FlashInfer recipe's recorded dependents in other trees go before it, said so."""
    from sm120patch.targets import discover

    given = {t.root for t in targets}
    if ids:
        unknown = [i for i in ids if not any(i in _applied_ids(t) for t in targets)]
        if unknown:
            where = ", ".join(str(t.root) for t in targets)
            raise UserError(f"{', '.join(unknown)}: not applied here ({where}); `sm120patch status` lists what is")
    results: list[dict[str, Any]] = []
    for t in reversed(ordered(targets)):
        mine = [i for i in ids or [] if i in _applied_ids(t)]
        if ids and not mine:
            continue
        for dep_root, dep_ids in _dependents(t, mine or None).items():
            if dep_root in given:
                continue  # an SGLang target of this command: already rolled back in its turn
            for dep in discover(dep_root, "sglang"):
                r = engine.rollback(dep, recipes, ids=dep_ids, force=force, wait_s=wait_s, missing_ok=True)
                if r["rolled_back"]:
                    results.append(
                        {"target": dep.to_dict(), **r, "because": f"proven on FlashInfer recipes at {t.root}"}
                    )
        r = engine.rollback(t, recipes, ids=mine or None, force=force, wait_s=wait_s)
        results.append({"target": t.to_dict(), **r})
    return results


def _applied_ids(t: Target) -> list[str]:
    return [a["id"] for a in Journal.open(t.root).applied if a.get("package", t.package) == t.package]


def _dependents(t: Target, ids: Sequence[str] | None) -> dict[Path, list[str]]:
    """SGLang recipes recorded as proven on `t`'s FlashInfer recipes (those being rolled back)."""
    if t.package != "flashinfer":
        return {}
    out: dict[Path, list[str]] = {}
    try:
        applied = Journal.open(t.root).applied
    except UserError:
        return {}
    for a in applied:
        if a.get("package") != "flashinfer" or (ids and a["id"] not in ids):
            continue
        for d in a.get("dependents") or []:
            out.setdefault(Path(d["root"]), []).append(d["id"])
    return out
