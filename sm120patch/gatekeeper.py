"""Which GPUs, which FlashInfer, and the probe `apply` runs: the glue between the engine and the ladder.

Kept apart from plan/apply so those import nothing heavy: detection uses NVML or
nvidia-smi, FlashInfer is located in a subprocess, and probes that import FlashInfer
run in subprocesses with timeouts.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sm120patch.arch import DEFAULT, Arch, parse_arch
from sm120patch.rungs import LEVELS as PROBE_LEVELS

if TYPE_CHECKING:  # the CLI imports this module at start: keep it light
    from sm120patch.engine import Probe, ProbeFailure
    from sm120patch.recipes import Recipe
    from sm120patch.targets import Target

__all__ = ["PROBE_LEVELS", "make_probe", "resolve_archs", "resolve_flashinfer"]


def resolve_archs(given: Sequence[str]) -> tuple[list[Arch], str]:
    """--arch values, else the GPUs NVML/nvidia-smi see, else sm_120 with a note saying so."""
    if given:
        return sorted({parse_arch(a) for a in given}), "--arch"
    from sm120patch.device import archs_present, detect

    machine = detect(with_torch=False)
    found = archs_present(machine)
    if found:
        return found, "detected"
    return [parse_arch(DEFAULT)], f"no GPU detected: planning for {DEFAULT} (pass --arch)"


def resolve_flashinfer(targets: Sequence[Target], flashinfer: Path | None, python: str | None):  # noqa: ANN201
    """--flashinfer TREE, else a FlashInfer next to the target (site-packages), else what `python` imports."""
    from sm120patch import flashinfer_env

    if flashinfer is not None:
        return flashinfer_env.from_tree(flashinfer, python=python)
    for t in targets:
        if t.package == "flashinfer":
            return flashinfer_env.from_tree(t.package_dir, python=python)
        sibling = t.package_dir.parent / "flashinfer"
        if (sibling / "__init__.py").is_file():
            return flashinfer_env.from_tree(sibling, python=python or sys.executable)
    return flashinfer_env.from_python(python)


def make_probe(archs: Sequence[Arch], fi: object, level: str) -> Probe | None:
    """The check a recipe must pass to stay: every kernel it needs, for every arch present.

    An `unknown` verdict is not a pass: a gate stays shut unless a probe saw its kernels.
    """
    if level == "none":
        return None
    from sm120patch.engine import ProbeFailure
    from sm120patch.probes import ProbeCache, probe_recipe, recipe_passes

    cache = ProbeCache()

    def probe(recipe: Recipe) -> ProbeFailure | None:
        if not recipe.needs:
            return None
        if not getattr(fi, "found", False):
            return ProbeFailure(
                f"no FlashInfer to probe ({getattr(fi, 'error', '') or 'not found'}); "
                "pass --flashinfer PATH or --python VENV/bin/python, or --probe none to skip the check",
                "none",
            )
        verdicts = probe_recipe(recipe.needs, archs, fi, level, cache)  # type: ignore[arg-type]
        if recipe_passes(verdicts):
            return None
        bad = next(v for v in verdicts if v.result != "pass")
        word = "missing" if bad.result == "fail" else "not confirmed"
        return ProbeFailure(
            f"{bad.kernel} {word} for {bad.arch} in FlashInfer {getattr(fi, 'version', '?')}: {bad.reason}",
            bad.rung,
            [v.to_dict() for v in verdicts],
        )

    return probe
