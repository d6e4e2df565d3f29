"""`sm120patch gates`: every architecture gate in a release, what it is for SM12x, what changed.

find.py and cuda_arch.py find the sites by syntax tree (predicates.py and evaluate.py read and
evaluate the release's own predicates), coverage.py asks the planner where each recipe edits,
judge.py says what each site is for SM12x, diff.py compares two releases, render.py writes text,
markdown and JSON. `gate_map` is the one entry point that puts them together for one tree.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sm120patch.gates.coverage import RecipeCoverage, mark, recipe_coverage
from sm120patch.gates.judge import judge_all
from sm120patch.gates.scan import scan_target
from sm120patch.gates.site import VERDICTS, Predicate, Site

if TYPE_CHECKING:
    from sm120patch.catalogue.kernels import Kernel
    from sm120patch.catalogue.recipes import Recipe
    from sm120patch.planning.targets import Target
    from sm120patch.probes.environment.flashinfer import FlashInferEnv

SCHEMA = 1


@dataclass
class GateMap:
    """The gates of one tree, judged."""

    target: Target
    sites: list[Site]
    predicates: list[Predicate]
    recipes: list[RecipeCoverage]
    files: int
    parsed: int
    flashinfer: FlashInferEnv | None = None
    notes: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        c = Counter(s.verdict for s in self.sites)
        return {v: c.get(v, 0) for v in VERDICTS}

    def tree(self) -> dict[str, Any]:
        return {
            "package": self.target.package,
            "version": self.target.version,
            "root": str(self.target.root),
            "files": self.files,
            "parsed": self.parsed,
            "sites": len(self.sites),
        }

    def to_dict(self) -> dict[str, Any]:
        fi = self.flashinfer
        return {
            "schema": SCHEMA,
            "tree": self.tree(),
            "flashinfer": {"location": fi.location, "version": fi.version} if fi is not None and fi.found else None,
            "counts": self.counts(),
            "sites": [s.to_dict() for s in self.sites],
            "recipes": [r.to_dict() for r in self.recipes],
            "predicates": [p.to_dict() for p in self.predicates],
            "notes": self.notes,
        }


def gate_map(
    target: Target,
    recipes: list[Recipe],
    catalogue: dict[str, Kernel],
    fi: FlashInferEnv | None,
    *,
    with_recipes: bool = True,
) -> GateMap:
    scan = scan_target(target)
    coverage = recipe_coverage(target, recipes) if with_recipes else []
    mark(scan.sites, coverage)
    sites = judge_all(scan.sites, catalogue, fi)
    return GateMap(target, sites, scan.predicates, coverage, scan.files, scan.parsed, fi)
