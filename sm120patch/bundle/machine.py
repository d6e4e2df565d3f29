"""Which trees, GPUs and interpreter of this machine a bundle command (`apply --bundle`,
`preflight --bundle`) works on: PATHs, else what Python imports; --arch, else the GPUs here."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sm120patch.errors import UserError
from sm120patch.planning.targets import discover, installed_for, targets_for
from sm120patch.probes.recipe_probe import resolve_archs

if TYPE_CHECKING:
    from sm120patch.arch import Arch
    from sm120patch.bundle.format import Bundle
    from sm120patch.planning.targets import Target


def found_targets(
    bundle: Bundle, paths: Sequence[Path], python: str | None, flashinfer: Path | None = None
) -> list[Target]:
    """Every package tree in PATHs; without PATH, what this Python (or --python) imports."""
    found: dict[Path, Target] = {}
    if paths:
        for t in targets_for(paths, False, None):
            found.setdefault(t.package_dir, t)
    else:
        wanted = [t.package for t in bundle.targets]
        for pkg in dict.fromkeys([*wanted, "flashinfer"]):
            try:
                t = installed_for(python, pkg)
            except UserError:
                if pkg in wanted:
                    raise
                continue
            found.setdefault(t.package_dir, t)
    if flashinfer is not None:  # the FlashInfer tree named on the command line stands for the one found
        fi = discover(flashinfer, "flashinfer")
        return [t for t in found.values() if t.package != "flashinfer"] + fi
    return list(found.values())


def probe_python(paths: Sequence[Path], python: str | None) -> str | None:
    """--python; else, for the packages this Python imports (no PATH), this Python: the one
    the server runs, which the spec rung needs to ask FlashInfer."""
    return python or (None if paths else sys.executable)


def bundle_archs(given: Sequence[str], bundle: Bundle) -> tuple[list[Arch], str]:
    """--arch; else the GPUs here; else (no GPU: an image build) the bundle's arch."""
    from sm120patch.arch import parse_arch

    archs, note = resolve_archs(given)
    if note in ("--arch", "detected"):
        return archs, note
    return sorted({parse_arch(a) for a in bundle.arch}), "no GPU detected: the bundle's arch (pass --arch)"
