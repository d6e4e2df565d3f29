"""`apply --bundle`: the bundle's patches through the journal and the probe, as `apply` writes recipes.

One function, `apply_bundle`, from the bundle's folder to the plans `apply` reports; the command
line (cli/bundle.py) only parses its flags and prints what comes back.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sm120patch.bundle.machine import bundle_archs, found_targets, probe_python

if TYPE_CHECKING:
    from sm120patch.arch import Arch
    from sm120patch.planning.plan import RecipePlan
    from sm120patch.planning.targets import Target

ArchNote = Callable[[Sequence["Arch"], str], None]


@dataclass
class BundleApplied:
    """What `apply --bundle` did: the plans (as `apply` reports them) and whether the files now
    hold the bundle's bytes (`differ` names each file that does not)."""

    archs: list[Arch]
    targets: list[Target]
    plans: list[RecipePlan]
    bundle: dict[str, Any]  # the `bundle` key of --json
    differ: list[str]


def apply_bundle(
    bundle_dir: Path,
    paths: Sequence[Path],
    arch: Sequence[str],
    level: str | None,
    flashinfer: Path | None,
    python: str | None,
    *,
    force: bool,
    commit: bool,
    wait_s: float,
    on_arch: ArchNote = lambda archs, note: None,
) -> BundleApplied:
    """Read the bundle, refuse (before a byte is written) trees that are not its releases and bytes,
    and apply its patches as recipes. `level` None: the rung the bundle's proofs were made at.
    `on_arch` hears the GPUs chosen, before anything is probed."""
    from sm120patch.bundle.node import as_recipes, bundle_targets, bytes_match, check_for_apply
    from sm120patch.bundle.read import read
    from sm120patch.engine.pipeline import RunSettings, apply_many
    from sm120patch.planning.plan import APPLIED

    bundle = read(bundle_dir)
    found = found_targets(bundle, paths, python)
    targets = bundle_targets(bundle, found)
    check_for_apply(bundle, targets)
    archs, arch_note = bundle_archs(arch, bundle)
    on_arch(archs, arch_note)
    level = level or bundle.probe_level
    with tempfile.TemporaryDirectory(prefix="sm120patch-bundle-") as tmp:
        recipes = as_recipes(bundle, Path(tmp))
        run = RunSettings.probing(found, archs, level, flashinfer, probe_python(paths, python))
        plans = apply_many(targets, recipes, run, force=force, commit=commit, wait_s=wait_s)
    complete = bool(plans) and all(p.status == APPLIED for p in plans)
    differ = bytes_match(bundle, targets) if complete else []
    summary = {
        "dir": str(bundle.dir),
        "probe_level": level,
        "complete": complete,
        "bytes_match": complete and not differ,
        "differ": differ,
    }
    return BundleApplied(archs, targets, plans, summary, differ)
