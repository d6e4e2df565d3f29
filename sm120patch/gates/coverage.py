"""Where each recipe edits a tree, from the planner itself: the sites a recipe covers.

`plan` gives, per recipe, the edits with their files and functions and the bytes each file has
before and after the recipe. The lines a recipe changes (in the release's own line numbers: an
earlier recipe's change to the same file is mapped back through a diff) are the places it edits;
a site there, in a function the edit names, is covered by it. An edit the release already does
(`satisfied`) changes no line: there, the sites of the named functions that admit SM12x are its.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sm120patch.arch import Arch
from sm120patch.gates.site import Site

if TYPE_CHECKING:
    from sm120patch.catalogue.recipes import Recipe
    from sm120patch.planning.plan import RecipePlan
    from sm120patch.planning.targets import Target

PLAN_ARCH = Arch(12, 0)


@dataclass
class Location:
    file: str  # relative to the folder holding the package, like Site.file
    functions: frozenset[str]  # empty: any (a diff edit names none)
    ranges: list[tuple[int, int]] | None  # 1-based inclusive, release line numbers; None: satisfied


@dataclass
class RecipeCoverage:
    id: str
    status: str
    reason: str
    needs: list[str]
    locations: list[Location] = field(default_factory=list)
    sites: list[Site] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "needs": self.needs,
            "files": sorted({loc.file for loc in self.locations}),
            "functions": sorted({f for loc in self.locations for f in loc.functions}),
            "sites": [{"file": s.file, "function": s.function, "line": s.line} for s in self.sites],
        }


def _lines(data: bytes) -> list[str]:
    return data.decode("utf-8", errors="replace").splitlines()


def changed_ranges(before: list[str], after: list[str]) -> list[tuple[int, int]]:
    """The lines of `before` (1-based, inclusive) a change replaces, deletes or inserts beside."""
    out = []
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, before, after, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        if i1 == i2:  # an insertion: the lines on either side of it
            out.append((max(1, i1), i1 + 1))
        else:
            out.append((i1 + 1, i2))
    return out


def to_release_lines(release: list[str], before: list[str], ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Map line ranges of `before` (a text earlier recipes changed) to the release's numbers."""
    if release == before:
        return ranges
    mapping: dict[int, int] = {}
    for a, b, size in difflib.SequenceMatcher(None, release, before, autojunk=False).get_matching_blocks():
        for k in range(size):
            mapping[b + k + 1] = a + k + 1
    known = sorted(mapping)

    def near(line: int) -> int:
        if line in mapping:
            return mapping[line]
        lower = [k for k in known if k < line]
        return mapping[lower[-1]] + 1 if lower else 1

    return [(near(a), near(b)) for a, b in ranges]


def recipe_coverage(target: Target, recipes: list[Recipe]) -> list[RecipeCoverage]:
    """Plan the tree's recipes (for sm_120; no probe) and read where each one edits."""
    from sm120patch.planning.plan import plan

    plans = plan(target, [r for r in recipes if r.package == target.package], [PLAN_ARCH])
    return [_coverage(target, p) for p in plans]


def _pkg_rel(target: Target, rel: str) -> str:
    return (target.root / rel).resolve().relative_to(target.package_dir.parent.resolve()).as_posix()


def _coverage(target: Target, p: RecipePlan) -> RecipeCoverage:
    cov = RecipeCoverage(p.recipe.id, str(p.status), p.reason, list(p.recipe.needs))
    functions_of: dict[str, set[str]] = {}
    satisfied: dict[str, set[str]] = {}
    for edit, res in zip(p.recipe.edits, p.edits, strict=False):
        for f in res.files:
            if res.outcome == "changed":
                functions_of.setdefault(f, set()).update(edit.functions)
                if not edit.functions:
                    functions_of[f] = set()
            elif res.outcome == "satisfied":
                satisfied.setdefault(f, set()).update(edit.functions)
    for rel, (before, after) in sorted(p.changes.items()):
        try:
            release = _lines((target.root / rel).read_bytes())
        except OSError:
            continue
        b = _lines(before)
        ranges = to_release_lines(release, b, changed_ranges(b, _lines(after)))
        fns = functions_of.get(rel, set())
        cov.locations.append(Location(_pkg_rel(target, rel), frozenset(fns), ranges))
    for rel, fns in sorted(satisfied.items()):
        cov.locations.append(Location(_pkg_rel(target, rel), frozenset(fns), None))
    return cov


def _in_functions(site: Site, functions: frozenset[str]) -> bool:
    return not functions or any(part in functions for part in site.function.split("."))


def covers(loc: Location, site: Site) -> bool:
    if site.file != loc.file or not _in_functions(site, loc.functions):
        return False
    if loc.ranges is None:
        return site.path is not None and PLAN_ARCH.name in site.path
    spans = [(site.line, site.end_line), *site.defined_at]
    return any(a <= end and start <= b for a, b in loc.ranges for start, end in spans)


def mark(sites: list[Site], coverage: list[RecipeCoverage]) -> None:
    """Each site a recipe edits names the recipe (the first, in catalogue order) and its status."""
    by_file: dict[str, list[Site]] = {}
    for s in sites:
        by_file.setdefault(s.file, []).append(s)
    for cov in coverage:
        for loc in cov.locations:
            for s in by_file.get(loc.file, ()):
                if covers(loc, s):
                    if s not in cov.sites:
                        cov.sites.append(s)
                    if s.recipe is None:
                        s.recipe, s.recipe_status = cov.id, cov.status
