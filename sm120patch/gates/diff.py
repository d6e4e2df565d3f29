"""Two releases: the sites added, removed, moved and changed, and whether each recipe's sites moved.

A site is the same across releases when its test and the code it guards are the same once layout
and line numbers are set aside (`Site.key`). Same key in the same file and function: unchanged,
wherever the lines went. Same key elsewhere: moved. Same file, function and test with other code
behind it: changed. The rest is added or removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sm120patch.gates.coverage import RecipeCoverage
from sm120patch.gates.site import Site


@dataclass
class Moved:
    old: Site
    new: Site


@dataclass
class GateDiff:
    added: list[Site] = field(default_factory=list)
    removed: list[Site] = field(default_factory=list)
    moved: list[Moved] = field(default_factory=list)
    changed: list[Moved] = field(default_factory=list)
    unchanged: int = 0
    recipes: list[dict[str, Any]] = field(default_factory=list)


def _take(pool: dict[Any, list[Site]], key: Any) -> Site | None:
    bucket = pool.get(key)
    if not bucket:
        return None
    return bucket.pop(0)


def diff_sites(old: list[Site], new: list[Site]) -> GateDiff:
    out = GateDiff()
    old_left = sorted(old, key=lambda s: (s.file, s.line))
    new_left = sorted(new, key=lambda s: (s.file, s.line))

    def match(key_of: Any) -> list[tuple[Site, Site]]:
        nonlocal old_left, new_left
        pool: dict[Any, list[Site]] = {}
        for s in new_left:
            pool.setdefault(key_of(s), []).append(s)
        pairs, rest = [], []
        for s in old_left:
            hit = _take(pool, key_of(s))
            if hit is None:
                rest.append(s)
            else:
                pairs.append((s, hit))
        used = {id(b) for _, b in pairs}
        old_left, new_left = rest, [s for s in new_left if id(s) not in used]
        return pairs

    out.unchanged = len(match(lambda s: (s.package, s.file, s.function, s.key)))
    out.moved = [Moved(a, b) for a, b in match(lambda s: (s.package, s.key))]
    out.changed = [Moved(a, b) for a, b in match(lambda s: (s.package, s.file, s.function, s.norm_test))]
    out.removed, out.added = old_left, new_left
    return out


def recipe_moves(old: list[RecipeCoverage], new: list[RecipeCoverage]) -> list[dict[str, Any]]:
    """Per recipe: its status in each release and whether the places it edits moved."""
    by_id = {c.id: c for c in new}
    out = []
    for o in old:
        n = by_id.pop(o.id, None)
        before = sorted({(s.file, s.function) for s in o.sites})
        after = sorted({(s.file, s.function) for s in n.sites}) if n else []
        if not before and not after:
            state = "no sites"
        elif not after:
            state = "gone"
        elif not before:
            state = "new"
        elif before == after:
            state = "same"
        else:
            state = "moved"
        out.append(
            {
                "id": o.id,
                "old_status": o.status,
                "new_status": n.status if n else None,
                "sites": state,
                "old": [f"{f}:{fn}" for f, fn in before],
                "new": [f"{f}:{fn}" for f, fn in after],
            }
        )
    for n in by_id.values():
        after = sorted({(s.file, s.function) for s in n.sites})
        out.append(
            {
                "id": n.id,
                "old_status": None,
                "new_status": n.status,
                "sites": "new" if after else "no sites",
                "old": [],
                "new": [f"{f}:{fn}" for f, fn in after],
            }
        )
    return out
