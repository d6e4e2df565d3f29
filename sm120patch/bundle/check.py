"""`preflight --bundle`: does this node hold the bundle's bytes, and run its kernels?

One function, `check_bundle`, from the bundle's folder to the report `preflight --bundle --json`
prints (cli/bundle.py renders it as text).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sm120patch.bundle.machine import found_targets, probe_python
from sm120patch.probes.recipe_probe import resolve_archs


def check_bundle(
    bundle_dir: Path,
    path: Path | None,
    arch: Sequence[str],
    level: str | None,
    flashinfer: Path | None,
    python: str | None,
) -> dict[str, Any]:
    """The node report: its GPUs, the FlashInfer it imports, per package the files that hold the
    bundle's bytes, per recipe ok or mismatch, the problems, and `ok`. `level` None: the bundle's rung."""
    from sm120patch.bundle.node import MISMATCH, bundle_targets, check_node, file_states
    from sm120patch.bundle.read import read
    from sm120patch.engine.which_flashinfer import resolve_flashinfer

    bundle = read(bundle_dir)
    paths = [path] if path else []
    found = found_targets(bundle, paths, python, flashinfer)
    targets = bundle_targets(bundle, found)
    archs, arch_note = resolve_archs(arch)
    problems: list[str] = []
    if arch_note not in ("--arch", "detected"):
        problems.append("no GPU detected on this node: nothing to check the kernels against (pass --arch to name one)")
    level = level or bundle.probe_level
    fi = resolve_flashinfer(found, flashinfer, probe_python(paths, python)) if level != "none" else None
    checks, version_problems = check_node(bundle, targets, archs, fi, level)
    problems = version_problems + problems
    ok = not problems and not any(c.state == MISMATCH for c in checks)
    return {
        "bundle": {
            "dir": str(bundle.dir),
            "tool_version": bundle.tool_version,
            "arch": bundle.arch,
            "probe_level": bundle.probe_level,
        },
        "archs": [a.name for a in archs],
        "arch_source": arch_note,
        "probe_level": level,
        "flashinfer": fi.to_dict() if fi is not None else None,
        "targets": [
            {
                **t.to_dict(),
                "bundle_version": bundle.target(t.package).version,  # type: ignore[union-attr]
                "files": file_states(bundle, t),
            }
            for t in targets
        ],
        "problems": problems,
        "recipes": [c.to_dict() for c in checks],
        "ok": ok,
    }
