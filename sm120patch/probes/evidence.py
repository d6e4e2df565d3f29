"""What a verdict stood on, and whether it still holds for the FlashInfer in front of us now:
the one module that answers "does the proof still hold" (`recheck`) and "what does it stand on"
(`stands_on`).

A verdict records the FlashInfer it judged (version, where) and the sha256 of every file
it read, relative to the `flashinfer/` package. `pip install` of another release, a new
container image, or a patch to FlashInfer's sources changes those bytes; `changes` then
names what differs, and `recheck` probes again instead of trusting the old answer; a recipe
whose kernels are gone is `stale`: the seed's crash, waiting for the next start. Reading
hashes is cheap, so every `plan`, `status`, `preflight` and `apply` does it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sm120patch.hashing import sha256_file

if TYPE_CHECKING:
    from sm120patch.catalogue.kernels import Kernel
    from sm120patch.catalogue.recipes import Recipe
    from sm120patch.probes.environment.flashinfer import FlashInferEnv
    from sm120patch.probes.recipe_probe import ProbeResult, RecipeProbe

MISSING = "missing"


def file_sha(path: Path) -> str:
    return sha256_file(path) or MISSING


def hash_files(package_dir: Path | None, rels: Iterable[str]) -> dict[str, str]:
    """rel -> sha256 (or "missing") of files under the flashinfer package."""
    if package_dir is None:
        return {}
    return {rel: file_sha(package_dir / rel) for rel in sorted(set(rels))}


def static_files(kernel: Kernel) -> list[str]:
    """The files the static rung reads for a kernel: its generator and its source checks."""
    return [kernel.file, *(c.file for c in kernel.source_checks)]


def fingerprint(fi: FlashInferEnv, kernel: Kernel) -> dict[str, str]:
    return hash_files(fi.package_dir, static_files(kernel))


def changes(recorded: Mapping[str, Any], fi: FlashInferEnv) -> list[str]:
    """How the FlashInfer now differs from the one a verdict recorded (empty: it still holds)."""
    out = []
    was = recorded.get("flashinfer") or {}
    if was.get("location") != fi.identity:  # an overlay is the FlashInfer it stands for
        out.append(f"FlashInfer moved: {was.get('location') or 'none'} -> {fi.identity or 'none'}")
    if was.get("version") != fi.version:
        out.append(f"FlashInfer {was.get('version')} -> {fi.version}")
    files = recorded.get("files") or {}
    now = hash_files(fi.package_dir, files)
    differ = sorted(rel for rel, sha in files.items() if now.get(rel) != sha)
    if differ:
        shown = ", ".join(differ[:3]) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
        out.append(f"changed since the probe: {shown}")
    return out


def stands_on(
    verdicts: Iterable[Mapping[str, Any]], changed: Iterable[str], location: str | Path | None = None
) -> bool:
    """The one "stands on" rule (apply records dependents by it, rollback and pip's retirement find
    them by it, preflight names the backport an SGLang gate needs by it): a proof stands on a
    FlashInfer recipe when one of its verdicts read a file that recipe changes (`changed`: paths
    inside the `flashinfer/` package, as verdicts record them), in that FlashInfer when `location`
    (its package folder) is given."""
    changed = set(changed)
    for v in verdicts:
        ev = v.get("evidence") or {}
        if location is not None:
            where = (ev.get("flashinfer") or {}).get("location")
            if not where or Path(where) != Path(location):
                continue
        if set(ev.get("files") or {}) & changed:
            return True
    return False


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
