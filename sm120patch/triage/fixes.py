"""Advice that points at our own fixes: a crash that matches a recipe's gate or kernels gets the
exact `sm120patch apply` command for the user's tree, instead of "run diagnose again".

A recipe matches a finding when its crash signature is in the finding's line, or when the
finding names a kernel module the recipe needs (`needs = ["flashinfer:trtllm_comm"]` and the
traceback's gen_trtllm_comm_module). Whether it would apply is asked of the planner itself
(`plan`, static: no probe, no torch), on the --target tree and the FlashInfer next to it, so a
release the recipe does not cover, or one that already has the fix, never gets the advice.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120patch.catalogue.recipes import Recipe
from sm120patch.planning.targets import Target
from sm120patch.status import APPLIED
from sm120patch.triage.diagnose import Diagnosis, Finding


@dataclass(frozen=True)
class Fix:
    """Recipes that would apply, on which trees, as one command."""

    recipe_ids: tuple[str, ...]
    paths: tuple[Path, ...]
    reasons: tuple[str, ...]

    @property
    def command(self) -> str:
        where = " ".join(shlex.quote(str(p)) for p in self.paths)
        only = " ".join(f"--recipe {shlex.quote(r)}" for r in self.recipe_ids)
        return f"sm120patch apply {where} {only}"


def matching_recipes(finding: Finding, recipes: Sequence[Recipe]) -> list[Recipe]:
    """Recipes whose crash signature is in the finding's line, that its signature names (`fixed_by`),
    or that build the kernel module the finding names (FlashInfer recipes: those provide kernels)."""
    module = finding.details.get("module", "")
    named = set(finding.sig.fixed_by) if finding.sig is not None else set()
    out = []
    for r in recipes:
        by_text = any(s in finding.line for s in r.crash_signatures)
        by_kernels = r.package == "flashinfer" and bool(module) and any(n.split(":", 1)[-1] == module for n in r.needs)
        if by_text or by_kernels or r.id in named:
            out.append(r)
    return out


def _trees(target: Path) -> dict[str, Target]:
    """package -> Target: the trees under --target, and the FlashInfer next to an SGLang tree."""
    from sm120patch.engine.which_flashinfer import recorded_flashinfer
    from sm120patch.errors import UserError
    from sm120patch.planning.targets import discover

    try:
        found = {t.package: t for t in discover(target)}
    except UserError:
        return {}
    sg = found.get("sglang")
    if sg is not None and "flashinfer" not in found:
        candidates = [sg.package_dir.parent / "flashinfer"]
        rec = recorded_flashinfer(sg)
        if rec:
            candidates.insert(0, Path(rec["location"]))
        for c in candidates:
            try:
                fi = discover(c, "flashinfer")
            except UserError:
                continue
            if fi:
                found["flashinfer"] = fi[0]
                break
    return found


def find_fix(diag: Diagnosis, recipes: Sequence[Recipe], target: Path, arch: str = "sm_120") -> Fix | None:
    """The apply command for the recipes that match the crash and would apply to these trees."""
    from sm120patch.arch import parse_arch
    from sm120patch.engine.journal import Journal
    from sm120patch.engine.tree import applied_reasons
    from sm120patch.planning.plan import APPLICABLE, UNTESTED, plan

    wanted: list[Recipe] = []
    for f in diag.causes:
        wanted += [r for r in matching_recipes(f, recipes) if r not in wanted]
    if not wanted:
        return None
    trees = _trees(target)
    ids: list[str] = []
    paths: list[Path] = []
    reasons: list[str] = []
    # FlashInfer first: the SGLang recipes' probes judge the FlashInfer patched
    for package in ("flashinfer", "sglang"):
        tree = trees.get(package)
        mine = [r for r in wanted if r.package == package]
        if tree is None or not mine:
            continue
        applied = applied_reasons(Journal.open(tree.root), tree)
        for p in plan(tree, mine, parse_arch(arch), applied=applied):
            if p.status in (APPLICABLE, UNTESTED):
                ids.append(p.recipe.id)
                reasons.append(f"{p.recipe.id} ({package} {tree.version}): {p.recipe.title}")
                if tree.root not in paths:
                    paths.append(tree.root)
    if not ids:
        return None
    return Fix(tuple(ids), tuple(reversed(paths)), tuple(reasons))  # SGLANG FLASHINFER; apply patches FlashInfer first


def log_arch(diag: Diagnosis) -> str:
    """sm_121 when the log shows a DGX Spark (GB10), else sm_120 (the recipes cover both)."""
    ev = (diag.gpu or {}).get("sm12x_evidence") or {}
    line = str(ev.get("line", ""))
    return "sm_121" if any(k in line for k in ("GB10", "Spark", "sm_121", "12.1")) else "sm_120"


def advise(diag: Diagnosis, recipes: Sequence[Recipe], target: Path) -> Fix | None:
    """Put the apply command into the matching findings: as the next step where nothing of ours
    is applied, as a note beside the rollback where the gate is open without its kernels."""
    fix = find_fix(diag, recipes, target, log_arch(diag))
    if fix is None:
        return None
    for f in diag.causes:
        if not matching_recipes(f, recipes):
            continue
        text = f"our fix for this crash on {target}: {fix.command} ({'; '.join(fix.reasons)})"
        if f.journal == APPLIED:
            f.notes.append(f"or keep the gate and add its kernels: {fix.command}")
        else:
            f.next_step = f"Apply sm120patch's fix: {fix.command}"
            f.notes.append(text)
    return fix


def advise_without_target(diag: Diagnosis, recipes: Sequence[Recipe]) -> None:
    """Without --target the trees are unknown: name the recipes and the command's shape."""
    for f in diag.causes:
        mine = matching_recipes(f, recipes)
        if not mine:
            continue
        packages = [p for p in ("flashinfer", "sglang") if any(r.package == p for r in mine)]
        where = " ".join(p.upper() for p in reversed(packages))  # SGLANG FLASHINFER, as apply's help says
        only = " ".join(f"--recipe {r.id}" for r in sorted(mine, key=lambda r: packages.index(r.package)))
        f.notes.append(
            f"sm120patch's fix, where these recipes are not applied yet: sm120patch apply {where} {only} "
            "(rerun diagnose with --target PATH for the exact command on your tree)"
        )
