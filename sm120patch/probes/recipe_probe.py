"""Which GPUs, which FlashInfer, and the probe `apply` runs: the glue between the engine and the ladder.

Kept apart from plan/apply so those import nothing heavy: detection uses NVML or
nvidia-smi, FlashInfer is located in a subprocess, and probes that import FlashInfer
run in subprocesses with timeouts.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sm120patch.arch import DEFAULT, Arch, parse_arch
from sm120patch.probes.rungs import LEVELS as PROBE_LEVELS
from sm120patch.probes.rungs import rung_index

if TYPE_CHECKING:  # the CLI imports this module at start: keep it light
    from sm120patch.catalogue.recipes import Recipe
    from sm120patch.planning.targets import Target

__all__ = ["PROBE_LEVELS", "ProbeResult", "RecipeProbe", "make_probe", "resolve_archs", "resolve_flashinfer"]


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


def resolve_flashinfer(targets: Sequence[Target], flashinfer: Path | None, python: str | None):  # noqa: ANN201
    """--flashinfer TREE; else a FlashInfer among the targets; else the one an applied recipe's
    proof recorded (so `plan`/`status` re-check the FlashInfer a tree was patched against);
    else one next to the target (site-packages); else what `python` imports."""
    from sm120patch.probes.environment import flashinfer as flashinfer_env

    if flashinfer is not None:
        return flashinfer_env.from_tree(flashinfer, python=python)
    on_path = {str(Path(x).resolve()) for x in sys.path if x}
    for t in targets:
        if t.package == "flashinfer":
            # the copy this interpreter imports (--installed, our own site-packages) runs under it
            mine = str(t.package_dir.parent.resolve()) in on_path
            return flashinfer_env.from_tree(t.package_dir, python=python or (sys.executable if mine else None))
    for t in targets:
        if rec := recorded_flashinfer(t):
            recorded_python = rec.get("python") if rec.get("python") and Path(rec["python"]).exists() else None
            return flashinfer_env.from_tree(rec["location"], python=python or recorded_python)
    for t in targets:
        sibling = t.package_dir.parent / "flashinfer"
        if (sibling / "__init__.py").is_file():
            return flashinfer_env.from_tree(sibling, python=python or sys.executable)
    return flashinfer_env.from_python(python)


def recorded_flashinfer(target: Target) -> dict[str, Any] | None:
    """The FlashInfer the newest applied recipe of `target` was proven against, if it still exists."""
    from sm120patch.engine.journal import Journal
    from sm120patch.errors import UserError

    try:
        applied = Journal.open(target.root).applied
    except UserError:
        return None
    for a in reversed(applied):
        for v in (a.get("evidence") or {}).get("verdicts") or []:
            fi = (v.get("evidence") or {}).get("flashinfer") or {}
            if fi.get("location") and (Path(fi["location"]) / "__init__.py").is_file():
                return fi
    return None


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
