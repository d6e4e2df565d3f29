"""Does the proof a recipe was applied on still hold for the FlashInfer in front of us now?

`apply` records, per recipe, what its probe stood on: the FlashInfer (version, where) and
the sha256 of every file the verdicts read. A `pip install` that re-pins FlashInfer, a new
image, or an edit to FlashInfer's sources changes those; then the recipe is probed again,
and one whose kernels are gone is `stale`: the seed's crash, waiting for the next start.
Reading hashes is cheap, so every `plan`, `status`, `preflight` and `apply` does it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sm120patch.catalogue.recipes import Recipe
    from sm120patch.probes.recipe_probe import ProbeResult, RecipeProbe


@dataclass
class Recheck:
    holds: bool  # the recipe may stay
    checked: bool  # a probe looked (False: nothing to check, or --probe none)
    changed: list[str] = field(default_factory=list)  # how FlashInfer differs from the recorded one
    probe: ProbeResult | None = None  # the new probe, when one ran
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"holds": self.holds, "checked": self.checked, "changed": self.changed, "reason": self.reason}


def recheck(entry: dict[str, Any], recipe: Recipe | None, probe: RecipeProbe | None) -> Recheck:
    """Compare an applied recipe's recorded proof with `probe.fi`; probe again if it differs."""
    if recipe is None or not recipe.needs:
        return Recheck(True, False, reason="needs no kernels")
    if probe is None:
        return Recheck(True, False, reason="not re-checked (--probe none)")
    evidence = entry.get("evidence")
    if evidence is not None and evidence.get("level") == "none":
        return Recheck(True, False, reason="applied with --probe none: no proof to re-check")
    verdicts = (evidence or {}).get("verdicts") or []
    if verdicts:
        from sm120patch.probes.evidence import changes  # late: `plan --probe none` never needs the probes

        changed = list(dict.fromkeys(c for v in verdicts for c in changes(v.get("evidence") or {}, probe.fi)))
        if not changed:
            fi = (verdicts[0].get("evidence") or {}).get("flashinfer") or {}
            rung = (entry.get("evidence") or {}).get("rung", "?")
            return Recheck(True, True, reason=f"proof holds: FlashInfer {fi.get('version')} unchanged ({rung} rung)")
    else:
        changed = ["no proof recorded (applied by an older sm120patch)"]
    result = probe(recipe)
    if result.passed:
        return Recheck(True, True, changed, result, f"{'; '.join(changed)}; probed again: {result.reason}")
    return Recheck(False, True, changed, result, f"{'; '.join(changed)}; {result.reason}")
