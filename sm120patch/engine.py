"""apply, rollback and status: the plan, written through the journal, probed, kept or reverted.

Plain functions over plain data; the CLI only parses flags and prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120patch.arch import Arch
from sm120patch.errors import UserError
from sm120patch.journal import Journal, sha256
from sm120patch.plan import APPLICABLE, APPLIED, BLOCKED, REVERTED, RecipePlan, plan
from sm120patch.recipes import Recipe, load_recipes
from sm120patch.targets import Target, discover

# A probe answers for one recipe: None when its kernels exist, else (reason, rung, verdicts).
Probe = Callable[[Recipe], "ProbeFailure | None"]


@dataclass
class ProbeFailure:
    reason: str
    rung: str
    verdicts: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FileState:
    rel: str
    state: str  # as-applied | changed-since-apply | missing | pending
    recipes: list[str]

    def to_dict(self) -> dict[str, object]:
        return {"path": self.rel, "state": self.state, "recipes": self.recipes}


def applied_reasons(journal: Journal, target: Target) -> dict[str, str]:
    """Recipes the journal holds for this target's package, with a one-line reason."""
    out = {}
    for a in journal.applied:
        if a.get("package", target.package) != target.package:
            continue
        states = [file_state(journal, rel) for rel in a["files"]]
        edited = [s for s in states if s != "as-applied"]
        out[a["id"]] = f"applied {a.get('at', '')}".strip() + (
            f"; {len(edited)} file(s) changed since" if edited else ""
        )
    return out


def file_state(journal: Journal, rel: str) -> str:
    entry = journal.file(rel)
    path = journal.root / rel
    if not path.exists():
        return "missing"
    if entry is None:
        return "as-applied"
    return "as-applied" if sha256(path.read_bytes()) == entry.current else "changed-since-apply"


def make_plan(
    target: Target, recipes: Sequence[Recipe], arch: Arch | Sequence[Arch], probe: Probe | None = None
) -> list[RecipePlan]:
    """The dry run: statuses and diffs; an applicable recipe whose probe fails is `blocked`."""
    journal = Journal.open(target.root)
    plans = plan(target, recipes, arch, applied=applied_reasons(journal, target))
    block_failing(plans, probe)
    return plans


def block_failing(plans: Sequence[RecipePlan], probe: Probe | None) -> None:
    """Mark each applicable recipe whose probe fails `blocked`, with the rung and the reason."""
    if probe is None:
        return
    for p in plans:
        if p.status == APPLICABLE:
            failure = probe(p.recipe)
            if failure is not None:
                p.status, p.reason, p.probe = BLOCKED, f"{failure.rung} rung: {failure.reason}", failure.verdicts


def _git_dirty(target: Target, rels: Sequence[str], journal: Journal) -> list[str]:
    """Files with uncommitted changes that are not our own applied changes."""
    if not target.is_git or not rels:
        return []
    from sm120patch.gitops import dirty_files

    dirty = dirty_files(target.root, list(rels))
    return [d for d in dirty if not (journal.file(d) and file_state(journal, d) == "as-applied")]


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
) -> list[RecipePlan]:
    """Plan, journal, write, probe; revert what the probe rejects. Returns the final per-recipe plans."""
    archs = [arch] if isinstance(arch, Arch) else list(arch)
    arch_names = ",".join(a.name for a in archs)
    journal = Journal.open(target.root)
    with journal.lock(wait_s):
        journal.recover()
        applied = applied_reasons(journal, target)
        plans = plan(target, recipes, archs, applied=applied)
        if only:
            # plan the chosen ones on their own, so their before-bytes are the tree's and not
            # another recipe's output; the others are still reported
            alone = {p.recipe.id: p for p in plan(target, [r for r in recipes if r.id in only], archs, applied=applied)}
            plans = [alone.get(p.recipe.id, p) for p in plans]
        todo = [p for p in plans if p.status == APPLICABLE and (not only or p.recipe.id in only)]
        if not todo:
            journal.remove_if_empty()
            return plans
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
        for p in todo:
            journal.applied.append(
                {
                    "id": p.recipe.id,
                    "package": target.package,
                    "sha256": p.recipe.sha256,
                    "files": p.files,
                    "at": stamp,
                    "arch": arch_names,
                    "version": target.version,
                }
            )
            p.status, p.reason = APPLIED, f"applied to {', '.join(p.files)}"
        journal.data.update(package=target.package, version=target.version)
        journal.note("apply", recipes=[p.recipe.id for p in todo], arch=arch_names)
        journal.save()
        if probe is not None:
            failed = {}
            for p in todo:
                verdict = probe(p.recipe)
                if verdict is not None:
                    failed[p.recipe.id] = verdict
                    p.probe = verdict.verdicts
            if failed:
                _rollback_locked(journal, target, recipes, archs, list(failed), force=False)
                for p in todo:
                    if p.recipe.id in failed:
                        f = failed[p.recipe.id]
                        p.status, p.reason = REVERTED, f"reverted: probe failed at the {f.rung} rung: {f.reason}"
        if commit and target.is_git:
            _commit(journal, target, recipes, archs, [p for p in todo if p.status == APPLIED], arch_names)
        return plans


def rollback(
    target: Target,
    recipes: Sequence[Recipe],
    arch: Arch | None = None,
    *,
    ids: Sequence[str] | None = None,
    force: bool = False,
    wait_s: float = 0.0,
) -> dict[str, Any]:
    """Take recipes back out (all by default), restoring the recorded original bytes."""
    journal = Journal.open(target.root)
    if not journal.exists and not journal.dir.exists():
        return {"rolled_back": [], "recovered": [], "kept_copies": [], "remaining": []}
    with journal.lock(wait_s):  # (a folder without journal.json is what a killed run left: cleaned below)
        recovered = journal.recover()
        unknown = [i for i in ids or [] if i not in journal.applied_ids()]
        if unknown:
            raise UserError(
                f"{target.root}: {', '.join(unknown)} not applied here; "
                f"applied: {', '.join(journal.applied_ids()) or 'none'}"
            )
        result = _rollback_locked(journal, target, recipes, arch, ids, force=force)
        result["recovered"] = recovered
        journal.remove_if_empty()
        return result


def _rollback_locked(
    journal: Journal,
    target: Target,
    recipes: Sequence[Recipe],
    arch: Arch | Sequence[Arch] | None,
    ids: Sequence[str] | None,
    *,
    force: bool,
) -> dict[str, Any]:
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
    new = _replay(journal, target, recipes, arch, keep, touched)
    journal.write(new)
    journal.data["applied"] = [a for a in journal.applied if a not in drop]
    journal.note("rollback", recipes=[a["id"] for a in drop], forced=bool(edited))
    journal.save()
    return {
        "rolled_back": [a["id"] for a in drop],
        "kept_copies": kept_copies,
        "remaining": [a["id"] for a in keep],
        "files": touched,
    }


def _replay(
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

    for p in plan(target, [by_id[a["id"]] for a in replay], replay_arch, read=read):
        for rel, (_, after) in p.changes.items():
            if rel in new:
                new[rel] = after
                overlay[target.root / rel] = after
    return new


def status(target: Target) -> dict[str, Any]:
    journal = Journal.open(target.root)
    files = []
    for a in journal.applied:
        for rel in a["files"]:
            files.append(FileState(rel, file_state(journal, rel), [a["id"]]))
    merged: dict[str, FileState] = {}
    for f in files:
        if f.rel in merged:
            merged[f.rel].recipes += f.recipes
        else:
            merged[f.rel] = f
    pending = journal.data.get("pending")
    return {
        "journal": str(journal.dir) if journal.exists else None,
        "applied": [{k: a.get(k) for k in ("id", "at", "arch", "version", "files")} for a in journal.applied],
        "files": [f.to_dict() for f in merged.values()],
        "interrupted": sorted(pending["writes"]) if pending else [],
    }


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
        state = _replay(journal, target, recipes, archs, upto, sorted(p.changes))
        for rel, data in sorted(state.items()):
            mode = "100755" if (target.root / rel).stat().st_mode & 0o111 else "100644"
            digest = repo.odb.store(IStream("blob", len(data), io.BytesIO(data))).hexsha.decode()
            repo.git.update_index("--cacheinfo", f"{mode},{digest},{rel}")
        repo.git.commit("-m", f"sm120patch: {p.recipe.id}\n\n{p.recipe.title}\n\nArch: {arch}", "--no-verify")


# --- entry points other modules (guard, diagnose) use -------------------------------------------


def _target_at(path: Path) -> Target:
    targets = discover(path)
    return targets[0]


def applied_recipes(target_path: Path) -> set[str]:
    """Recipe ids the journal at `target_path` says are applied."""
    t = _target_at(target_path)
    return set(Journal.open(t.root).applied_ids())


def rollback_recipes(target_path: Path, recipe_ids: list[str]) -> list[str]:
    """Roll back these recipes where applied; returns the ids actually rolled back."""
    t = _target_at(target_path)
    applied = set(Journal.open(t.root).applied_ids())
    ids = [i for i in recipe_ids if i in applied]
    if not ids:
        return []
    return rollback(t, load_recipes(), ids=ids)["rolled_back"]
