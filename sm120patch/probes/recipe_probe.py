"""Which GPUs, which FlashInfer, and the probe `apply` runs: the glue between the engine and the ladder.

Kept apart from plan/apply so those import nothing heavy: detection uses NVML or
nvidia-smi, FlashInfer is located in a subprocess, and probes that import FlashInfer
run in subprocesses with timeouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sm120patch.arch import DEFAULT, Arch, parse_arch
from sm120patch.probes.rungs import LEVELS as PROBE_LEVELS
from sm120patch.probes.rungs import rung_index

if TYPE_CHECKING:  # the CLI imports this module at start: keep it light
    from sm120patch.catalogue.recipes import Recipe

__all__ = ["PROBE_LEVELS", "ProbeResult", "RecipeProbe", "make_probe", "resolve_archs"]


def resolve_archs(given: Sequence[str]) -> tuple[list[Arch], str]:
    """--arch values, else the GPUs NVML/nvidia-smi see, else sm_120 with a note saying so."""
    if given:
        return sorted({parse_arch(a) for a in given}), "--arch"
    from sm120patch.probes.environment.device import archs_present, detect

    machine = detect(with_torch=False)
    found = archs_present(machine)
    if found:
        return found, "detected"
    return [parse_arch(DEFAULT)], f"no GPU detected: planning for {DEFAULT} (pass --arch)"


@dataclass
class ProbeResult:
    """A recipe's probe, as the engine and the journal see it.

    `passed` only when every kernel the recipe needs passed for every arch (an unknown is
    not a pass); `rung` is the weakest rung those verdicts stand on; `verdicts` keep what
    each stood on (FlashInfer, files read with their sha256), so a later run can tell
    whether the proof still holds for the FlashInfer in front of it."""

    passed: bool
    reason: str
    rung: str
    level: str
    verdicts: list[dict[str, Any]] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        """What the journal keeps per applied recipe."""
        keep = ("kernel", "arch", "result", "rung", "asked", "evidence")
        verdicts = [{k: v.get(k) for k in keep} for v in self.verdicts]
        return {"level": self.level, "rung": self.rung, "verdicts": verdicts}


class RecipeProbe:
    """The check a recipe must pass to be written: every kernel it needs, for every arch, on `fi`."""

    def __init__(self, archs: Sequence[Arch], fi: Any, level: str) -> None:
        self.archs, self.fi, self.level = list(archs), fi, level

    def __call__(self, recipe: Recipe) -> ProbeResult:
        from sm120patch.probes import ProbeCache, probe_recipe, recipe_passes

        if not recipe.needs:
            return ProbeResult(True, "needs no kernels", "-", self.level)
        fi = self.fi
        if not getattr(fi, "found", False):
            return ProbeResult(
                False,
                f"no FlashInfer to probe ({getattr(fi, 'error', '') or 'not found'}); "
                "pass --flashinfer PATH or --python VENV/bin/python, or --probe none to skip the check",
                "none",
                self.level,
            )
        verdicts = probe_recipe(recipe.needs, self.archs, fi, self.level, ProbeCache())
        dicts = [v.to_dict() for v in verdicts]
        weakest = min((v.rung for v in verdicts), key=rung_index)
        if recipe_passes(verdicts):
            short = [v for v in verdicts if v.short_of_asked]
            above = [
                st["reason"]
                for st in (short[0].steps if short else [])
                if st["result"] == "unknown" and rung_index(st["rung"]) > rung_index(short[0].rung)
            ]
            note = f" (asked {self.level}: {'; '.join(above)})" if short else ""
            return ProbeResult(True, f"kernels proven at the {weakest} rung{note}", weakest, self.level, dicts)
        bad = next(v for v in verdicts if v.result != "pass")
        word = "missing" if bad.result == "fail" else "not confirmed"
        return ProbeResult(
            False,
            f"{bad.kernel} {word} for {bad.arch} in FlashInfer {getattr(fi, 'version', '?')}: {bad.reason}",
            bad.rung,
            self.level,
            dicts,
        )


def make_probe(archs: Sequence[Arch], fi: object, level: str) -> RecipeProbe | None:
    """The probe `plan`/`apply` run (None for --probe none: the check is skipped on purpose)."""
    return None if level == "none" else RecipeProbe(archs, fi, level)
