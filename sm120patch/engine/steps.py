"""One tree's steps under its lock, in the command's transaction: read what the journal holds,
probe, write the proven recipes, take recipes back (the kept ones replayed over the originals).

Probe first, write after: a recipe's kernels are proven (or not) before a byte of the tree
changes, so a kill at any moment leaves either the old tree or a fully proven one. Each
applied recipe keeps in the journal what its proof stood on, and every later run checks it
still holds for the FlashInfer in front of it (`recheck`). The pipeline (`pipeline.py`) runs
these over every target of a command; `tree.py` holds the one-tree entry points over it, so
the three modules import one way only: tree -> pipeline -> steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sm120patch.arch import Arch
from sm120patch.catalogue.recipes import Recipe
from sm120patch.engine.journal import Journal
from sm120patch.errors import UserError
from sm120patch.hashing import sha256
from sm120patch.hints import rollback_command
from sm120patch.planning.plan import APPLICABLE, APPLIED, BLOCKED, FAILED, STALE, RecipePlan, plan
from sm120patch.planning.targets import Target
from sm120patch.probes.evidence import Recheck, recheck

if TYPE_CHECKING:
    from sm120patch.probes.recipe_probe import ProbeResult

# A probe answers for one recipe: does every kernel it needs exist, and on what evidence?
Probe = Callable[[Recipe], "ProbeResult"]


def applied_reasons(journal: Journal, target: Target) -> dict[str, str]:
    """Recipes the journal holds for this target's package, with a one-line reason. Those pip
    made obsolete (`pipstate`) are left out: the release is planned afresh for them."""
    from sm120patch.engine.pipstate import obsolete

    gone = {r.id for r in obsolete(journal, target)}
    out = {}
    for a in journal.entries(target.package):
        if a.id in gone:
            continue
        edited = [rel for rel in a.files if file_state(journal, rel) != "as-applied"]
        out[a.id] = f"applied {a.raw.get('at', '')}".strip() + (
            f"; {len(edited)} file(s) changed since" if edited else ""
        )
    return out


def file_state(journal: Journal, rel: str) -> str:
    """as-applied | changed-since-apply (a user edit) | replaced-by-pip (back at its original
    bytes) | missing."""
    entry = journal.file(rel)
    path = journal.root / rel
    if not path.exists():
        return "missing"
    if entry is None:
        return "as-applied"
    now = sha256(path.read_bytes())
    if now == entry.current:
        return "as-applied"
    from sm120patch.engine.pipstate import REPLACED

    return REPLACED if now == entry.original else "changed-since-apply"


def block_failing(plans: Sequence[RecipePlan], probe: Probe | None) -> dict[str, ProbeResult]:
    """Probe each applicable recipe: a failing one becomes `blocked` with the rung and the reason.
    Returns the passing ones' results (what `apply` records as their proof)."""
    passed: dict[str, ProbeResult] = {}
    if probe is None:
        return passed
    for p in plans:
        if p.status != APPLICABLE:
            continue
        result = probe(p.recipe)
        p.probe = result.verdicts
        if result.passed:
            passed[p.recipe.id] = result
        else:
            p.mark(BLOCKED, f"{result.rung} rung: {result.reason}")
    return passed


def rechecks(journal: Journal, target: Target, recipes: Sequence[Recipe], probe: Probe | None) -> dict[str, Recheck]:
    """For each recipe applied to this target: does its recorded proof still hold?"""
    by_id = {r.id: r for r in recipes}
    return {a.id: recheck(a.raw, by_id.get(a.id), probe) for a in journal.entries(target.package)}  # type: ignore[arg-type]


def rollback_hint(target: Target, recipe_id: str) -> str:
    return rollback_command(target.root, [recipe_id])


def mark_stale(
    plans: Sequence[RecipePlan], journal: Journal, target: Target, probe: Probe | None
) -> dict[str, Recheck]:
    """`applied` recipes whose kernels are gone from the FlashInfer now in front of them: `stale`.
    Returns the rechecks (the reconciler reads which proofs an apply would renew or take back)."""
    applied = [p for p in plans if p.status == APPLIED]
    if not applied or probe is None:
        return {}
    checks = rechecks(journal, target, [p.recipe for p in applied], probe)
    for p in applied:
        c = checks.get(p.recipe.id)
        if c is None:
            continue
        if c.probe is not None:
            p.probe = c.probe.verdicts
        if not c.holds:
            p.mark(STALE, f"stale: {c.reason}; run `{rollback_hint(target, p.recipe.id)}`")
        elif c.changed:
            p.reason += f" ({c.reason})"
    return checks


def _git_dirty(target: Target, rels: Sequence[str], journal: Journal) -> list[str]:
    """Files with uncommitted changes that are not our own applied changes."""
    if not target.is_git or not rels:
        return []
    from sm120patch.gitops import dirty_files

    dirty = dirty_files(target.root, list(rels))
    return [d for d in dirty if not (journal.file(d) and file_state(journal, d) == "as-applied")]


def write_proven(
    journal: Journal,
    target: Target,
    recipes: Sequence[Recipe],
    archs: Sequence[Arch],
    todo: Sequence[RecipePlan],
    proofs: dict[str, ProbeResult],
    *,
    force: bool,
    commit: bool,
) -> None:
    """Journal and write the recipes whose probe passed (each keeps its proof), then commit.
    (An empty journal is removed once the command lets go of it, never midway: bug 3.)"""
    if not todo:
        return
    start = None
    if commit and target.is_git:
        from sm120patch.gitops import where

        start = where(target.root)
    _write(journal, target, todo, proofs, ",".join(a.name for a in archs), force)
    if start is not None:
        for a in journal.applied[-len(todo) :]:
            a["git"] = start  # where rollback returns HEAD and the index to
        journal.save()
        try:
            _commit(journal, target, recipes, archs, todo, ",".join(a.name for a in archs))
        except BaseException:
            from sm120patch.gitops import go_back

            go_back(target.root, start)  # the command's transaction puts the files back
            raise


def replan(
    target: Target,
    recipes: Sequence[Recipe],
    archs: Sequence[Arch],
    applied: dict[str, str],
    plans: list[RecipePlan],
    ids: set[str],
    allow_untested: bool,
    planner: Callable[..., list[RecipePlan]] = plan,
) -> list[RecipePlan]:
    """`plans`, with the recipes in `ids` planned again on their own (same order, same others),
    by `planner` (`plan`'s signature; preflight's serves statuses from the plan-result cache)."""
    chosen = [r for r in recipes if r.id in ids]
    alone = {p.recipe.id: p for p in planner(target, chosen, archs, applied=applied, allow_untested=allow_untested)}
    for p in plans:  # keep what the first plan learned (the probe's verdicts)
        if p.recipe.id in alone and p.probe:
            alone[p.recipe.id].probe = p.probe
    return [alone.get(p.recipe.id, p) for p in plans]


def _write(
    journal: Journal,
    target: Target,
    todo: Sequence[RecipePlan],
    proofs: dict[str, ProbeResult],
    arch_names: str,
    force: bool,
) -> None:
    """Check nothing changed under us, then one journaled transaction for every proven recipe."""
    final: dict[str, bytes] = {}
    for p in todo:
        for rel, (_, after) in p.changes.items():
            final[rel] = after
    # a file changed on disk since we planned would lose that change: refuse
    for rel in final:
        first = next(p.changes[rel][0] for p in todo if rel in p.changes)
        if (target.root / rel).read_bytes() != first:
            raise UserError(f"{target.root / rel}: changed while sm120patch was planning; run the command again")
    dirty = _git_dirty(target, sorted(final), journal)
    if dirty and not force:
        raise UserError(
            f"{target.root}: uncommitted changes in {', '.join(dirty)}; commit or stash them first, or pass --force"
        )
    # a file we patched before and the user edited since: writing over it would make the
    # next rollback restore the original and silently drop that edit
    edited = [rel for rel in sorted(final) if journal.file(rel) and file_state(journal, rel) != "as-applied"]
    if edited and not force:
        raise UserError(
            f"{target.root}: {', '.join(edited)} changed since sm120patch patched it; a later rollback would "
            "lose those edits. Roll back first, or pass --force (your version is kept in .sm120patch/saved/)"
        )
    for rel in edited:
        journal.keep_copy(rel)
    journal.write(final)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    from sm120patch.engine.pipstate import installed_version

    dist, source = installed_version(target)
    for p in todo:
        proof = proofs.get(p.recipe.id)
        journal.applied.append(
            {
                "id": p.recipe.id,
                "package": target.package,
                "sha256": p.recipe.sha256,
                "files": p.files,
                "at": stamp,
                "arch": arch_names,
                "version": target.version or "",
                **({"dist_version": dist} if source == "dist-info" and dist else {}),
                "evidence": proof.record() if proof else {"level": "none"},
            }
        )
        p.mark(APPLIED, f"applied to {', '.join(p.files)}" + (f"; {proof.reason}" if proof and p.recipe.needs else ""))
    journal.data.setdefault("dists", {})[target.package] = target.version  # per package: a site holds two
    journal.note("apply", recipes=[p.recipe.id for p in todo], arch=arch_names)
    journal.save()


def rollback_locked(
    journal: Journal,
    target: Target,
    recipes: Sequence[Recipe],
    arch: Arch | Sequence[Arch] | None,
    ids: Sequence[str] | None,
    *,
    force: bool,
) -> dict[str, Any]:
    """Roll back `ids` (all of this package's by default) with the journal locked, inside the
    command's transaction: the kept recipes are replayed over the originals."""
    applied = [a for a in journal.applied if a.get("package", target.package) == target.package]
    drop = [a for a in applied if ids is None or a["id"] in ids]
    keep = [a for a in applied if a not in drop]
    touched = sorted({rel for a in drop for rel in a["files"]})
    edited = [rel for rel in touched if file_state(journal, rel) in ("changed-since-apply", "missing")]
    if edited and not force:
        raise UserError(
            f"{target.root}: {', '.join(edited)} changed (or deleted) since apply; rollback would overwrite "
            "those edits. Pass --force to restore anyway (your version is kept in .sm120patch/saved/)"
        )
    kept_copies = [str(journal.keep_copy(rel)) for rel in edited if (target.root / rel).exists()]
    new = replay(journal, target, recipes, arch, keep, touched)
    journal.write(new)
    journal.data["applied"] = [a for a in journal.applied if a not in drop]
    started = [a["git"] for a in drop if isinstance(a.get("git"), dict)]
    if started and target.is_git and not any(isinstance(a.get("git"), dict) for a in keep):
        from sm120patch.gitops import go_back

        go_back(target.root, started[0])  # the branch and index the first --commit apply started from
    journal.note("rollback", recipes=[a["id"] for a in drop], forced=bool(edited))
    journal.save()
    return {
        "rolled_back": [a["id"] for a in drop],
        "kept_copies": kept_copies,
        "remaining": [a["id"] for a in keep],
        "files": touched,
    }


def replay(
    journal: Journal,
    target: Target,
    recipes: Sequence[Recipe],
    arch: Arch | Sequence[Arch] | None,
    keep: list[dict[str, Any]],
    touched: list[str],
) -> dict[str, bytes]:
    """What `touched` files should hold with only `keep` applied: originals, plus the kept recipes
    replayed over them (a file two recipes edited keeps the other recipe's change)."""
    new = {rel: journal.original(rel) for rel in touched}
    replay = [a for a in keep if set(a["files"]) & set(touched)]
    if not replay:
        return new
    by_id = {r.id: r for r in recipes}
    missing = [a["id"] for a in replay if a["id"] not in by_id]
    if missing:
        raise UserError(
            f"{target.root}: recipe(s) {', '.join(missing)} are applied here but no longer in the "
            "catalogue; roll back everything (no --recipe) or restore the recipe files"
        )
    from sm120patch.arch import parse_arch

    replay_arch = arch or [parse_arch(a) for a in replay[0].get("arch", "sm_120").split(",")]
    overlay = {target.root / rel: data for rel, data in new.items()}

    def read(path: Path) -> bytes:
        return overlay[path] if path in overlay else path.read_bytes()

    # what was applied is replayed as applied, also on a release newer than a recipe was tested on
    for p in plan(target, [by_id[a["id"]] for a in replay], replay_arch, read=read, allow_untested=True):
        if p.status == FAILED:  # a kept recipe that cannot be replayed must not vanish from the files
            raise UserError(f"{target.root}: {p.recipe.id} cannot be replayed over the original bytes: {p.reason}")
        for rel, (_, after) in p.changes.items():
            if rel in new:
                new[rel] = after
                overlay[target.root / rel] = after
    return new


def _commit(
    journal: Journal,
    target: Target,
    recipes: Sequence[Recipe],
    archs: Sequence[Arch],
    plans: Sequence[RecipePlan],
    arch: str,
) -> None:
    """One commit per recipe on branch sm120patch/<arch>, built in the index (the work tree is
    already written). Each commit's bytes are replayed from the originals with the recipes the
    journal holds up to that one, so a recipe the probe reverted never shows up in a commit."""
    import io

    import git  # gitpython: only needed for --commit
    from gitdb.base import IStream

    repo = git.Repo(target.root)
    branch = f"sm120patch/{arch.replace(',', '+')}"
    if repo.head.is_detached or repo.active_branch.name != branch:
        repo.git.checkout("-B", branch)
    order = [a["id"] for a in journal.applied]
    for p in plans:
        upto = journal.applied[: order.index(p.recipe.id) + 1]
        state = replay(journal, target, recipes, archs, upto, sorted(p.changes))
        for rel, data in sorted(state.items()):
            mode = "100755" if (target.root / rel).stat().st_mode & 0o111 else "100644"
            digest = repo.odb.store(IStream("blob", len(data), io.BytesIO(data))).hexsha.decode()
            repo.git.update_index("--cacheinfo", f"{mode},{digest},{rel}")
        repo.git.commit("-m", f"sm120patch: {p.recipe.id}\n\n{p.recipe.title}\n\nArch: {arch}", "--no-verify")
