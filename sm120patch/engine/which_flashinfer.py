"""Which FlashInfer a command's probes judge: the one named, one among the targets, the one an
applied recipe's proof recorded (read from the journal, which is why this is the engine's
question and not the probes'), one beside the target, else what the interpreter imports."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sm120patch.planning.targets import Target


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
