"""A cache of plan statuses, so a warm `preflight` answers without parsing anything.

Statuses only (no bytes, no diffs): `plan` and `apply` always recompute. An entry is
valid while this tool's code, the recipes, the archs, the target and the journal are
as they were, and every file the plan read or looked for has the same stamp (or, if
rewritten, the same bytes).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sm120patch.arch import Arch
from sm120patch.hashing import sha256_file, sha256_json
from sm120patch.planning.plan import EditResult, RecipePlan, Workspace, _plan, plan

if TYPE_CHECKING:
    from sm120patch.catalogue.recipes import Recipe
    from sm120patch.planning.locate import PackageIndex
    from sm120patch.planning.targets import Target


def _stamp(path: Path) -> list[int] | None:
    """What changes when a file is rewritten, replaced or removed."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return [st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino]


def _tool_stamp() -> list[object]:
    """This sm120patch's own code, every module of the package: a new version or an edited module
    (a transform, the planner, the catalogue reader) invalidates the cache."""
    package = Path(__file__).resolve().parent.parent  # sm120patch/ (this module is sm120patch/planning/)
    return [[p.relative_to(package).as_posix(), _stamp(p)] for p in sorted(package.rglob("*.py"))]


def _listing(index: PackageIndex, read: set[str]) -> str:
    """Every .py file of the package, hashed with its stamp: what a package scan depended on.
    Files in `read` enter by name only: their bytes are checked on their own (`files`)."""
    root = index.target.package_dir
    entries = []
    for p in index.files():
        entries.append([p.relative_to(root).as_posix(), None if str(p) in read else _stamp(p)])
    return sha256_json(entries)


def _unchanged(path: Path, stamp: list[int] | None, digest: str | None) -> bool:
    """Same stamp; or, for a file rewritten with the same bytes (an apply rolled back), the
    same type, size and sha256."""
    now = _stamp(path)
    if now == stamp:
        return True
    if now is None or stamp is None or digest is None or now[:2] != stamp[:2]:
        return False
    return sha256_file(path) == digest


def plan_statuses(
    target: Target,
    recipes: Sequence[Recipe],
    arch: Arch | Sequence[Arch],
    applied: dict[str, str] | None = None,
    cache_dir: Path | None = None,
) -> list[RecipePlan]:
    """`plan`'s statuses, reasons and edit outcomes, for reports (`preflight`), served from a
    cache when nothing they depend on changed. The plans carry no bytes (`changes` is
    empty, no diff): never write from them; `plan` and `apply` always recompute.

    The cache key holds this tool's code stamps, the recipes (id, sha256), the archs,
    the target (with its version) and the journal's `applied` reasons; the entry holds the
    stamp (mode, size, mtime_ns, inode) of every file the plan read or looked for (each
    edit's hinted files, present or not) and the sha256 of those it read, and, when an edit
    searched the whole package, a hash of the package's .py listing with their stamps. A
    changed stamp recomputes, unless the file was only rewritten with the same bytes (same
    type, size and sha256: an apply that was rolled back).
    """
    from sm120patch.probes.verdict_cache import ProbeCache, default_cache_dir

    mine = [r for r in recipes if r.package == target.package]
    if any(e.diff_path is not None for r in mine for e in r.edits):
        return plan(target, recipes, arch, applied)  # a diff edit reads its .diff file: not keyed
    archs = [arch] if isinstance(arch, Arch) else list(arch)
    cache = ProbeCache(cache_dir or default_cache_dir().parent / "plans")
    key = ProbeCache.key(
        {
            "kind": "plan-statuses",
            "tool": _tool_stamp(),
            "recipes": [[r.id, r.sha256] for r in mine],
            "arch": [a.name for a in archs],
            "target": target.to_dict(),
            "applied": applied or {},
        }
    )
    hit = cache.get(key)
    if hit is not None:
        plans = _from_cache(hit, target, mine)
        if plans is not None:
            return plans
    ws = Workspace(target)
    plans = _plan(ws, recipes, arch, applied)
    looked = {target.package_dir / h for r in mine for e in r.edits for h in e.files}
    looked.update(ws.index._text, ws.text)
    read = {str(p) for p in (*ws.index._text, *ws.text)}
    cache.put(
        key,
        {
            "files": sorted([str(p), _stamp(p), sha256_file(p) if str(p) in read else None] for p in looked),
            "listing": _listing(ws.index, read) if ws.index._hits else None,
            "plans": [
                {"id": p.recipe.id, "status": p.status, "reason": p.reason, "edits": [e.to_dict() for e in p.edits]}
                for p in plans
            ],
        },
    )
    return plans


def _from_cache(hit: dict[str, object], target: Target, recipes: Sequence[Recipe]) -> list[RecipePlan] | None:
    """The cached plans, or None when a file they depend on changed (or the entry is odd)."""
    try:
        files = hit["files"]
        for path, stamp, digest in files:  # type: ignore[attr-defined]
            if not _unchanged(Path(path), stamp, digest):
                return None
        read = {path for path, _, digest in files if digest is not None}  # type: ignore[attr-defined]
        from sm120patch.planning.locate import PackageIndex

        if hit["listing"] is not None and _listing(PackageIndex(target), read) != hit["listing"]:
            return None
        by_id = {r.id: r for r in recipes}
        return [
            RecipePlan(by_id[d["id"]], target, d["status"], d["reason"], [EditResult(**e) for e in d["edits"]])
            for d in hit["plans"]  # type: ignore[attr-defined]
        ]
    except (KeyError, TypeError, ValueError):
        return None
