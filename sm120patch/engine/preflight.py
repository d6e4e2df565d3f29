"""Pre-flight: what will sm120patch do on this box? Machine, packages, and per recipe a verdict.

Answers without writing anything and without importing torch or FlashInfer here:
GPUs come from NVML/nvidia-smi (torch only in a subprocess), FlashInfer is located
in a subprocess, and probe verdicts come from the cache when nothing they depend on changed.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sm120patch.arch import Arch
from sm120patch.catalogue.recipes import Recipe
from sm120patch.planning.plan import APPLICABLE, BLOCKED, RecipePlan
from sm120patch.planning.plan_cache import plan_statuses
from sm120patch.planning.targets import Target
from sm120patch.probes.recipe_probe import make_probe
from sm120patch.probes.rungs import rung_index
from sm120patch.status import advice


def preflight(
    targets: Sequence[Target],
    recipes: Sequence[Recipe],
    archs: Sequence[Arch],
    arch_source: str,
    fi: Any,
    level: str,
    with_torch: bool = True,
    python: str | None = None,
    census_sites: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """`census_sites`: site-packages to census ([]: --python's or the targets'); None (default): no census."""
    from sm120patch.probes.environment.device import can_build_for, detect

    machine = detect(list(archs) if arch_source == "--arch" else None, python=python, with_torch=with_torch)
    probe = make_probe(archs, fi, level)
    if probe is not None and getattr(fi, "found", False) and not any(t.package == "flashinfer" for t in targets):
        from sm120patch.probes import ProbeCache, prefetch_spec

        # every recipe's spec questions in one FlashInfer import per arch, not one per check
        prefetch_spec([n for r in recipes for n in r.needs], archs, fi, level, ProbeCache())
    # the one reconciler decides, as for plan and apply: FlashInfer targets first (their recipes change
    # what SGLang's probes see); without a FlashInfer target, statuses from the plan-result cache
    # (`_cached_plan`), so a warm pre-flight parses nothing
    from sm120patch.engine.pipeline import RunSettings, reconcile

    by_pkg = {t.package: t for t in targets}
    cached = {} if "flashinfer" in by_pkg else {"planner": _cached_plan}
    decided = reconcile(targets, recipes, RunSettings(list(archs), fi, level, make_probe), **cached)
    pairs = [(by_pkg[p.recipe.package], p) for p in decided.plans]
    # the advice names the backports this apply writes first, as apply decides them
    written = decided.writes("flashinfer")
    stands_on = {i: hits for i, on in decided.stands_on.items() if (hits := [x for x in on if x in written])}
    rows = []
    for t, p in pairs:
        verdicts = p.probe
        rows.append(
            {
                "id": p.recipe.id,
                "package": p.recipe.package,
                "status": p.status,
                "reason": p.reason,
                "probe": verdicts,
                "rung": _rung(verdicts),
                "advice": advice(p.status, shlex.quote(str(t.root)), shlex.quote(p.recipe.id))
                + (
                    f" (it stands on {', '.join(stands_on[p.recipe.id])}, which that apply writes first)"
                    if p.status == APPLICABLE and p.recipe.id in stands_on
                    else ""
                ),
                "needs_recipes": stands_on.get(p.recipe.id, []),
            }
        )
    builds = {
        a.name: dict(zip(("ok", "why"), can_build_for(machine.cuda, a, family=a.major == 12), strict=True))
        for a in archs
    }
    report: dict[str, Any] = {
        "machine": machine.to_dict(),
        "archs": [a.name for a in archs],
        "arch_source": arch_source,
        "can_build": builds,
        "targets": [t.to_dict() for t in targets],
        "flashinfer": fi.to_dict() if hasattr(fi, "to_dict") else None,
        "probe_level": level,
        "recipes": rows,
    }
    if not any(t.package == "flashinfer" for t in targets):
        _note_backport(rows, targets, recipes, archs, fi, level)
    if census_sites is not None:  # compiled code in the environment vs these GPUs (sm120patch/census/)
        from sm120patch.census import for_preflight

        dirs = [t.package_dir for t in targets]
        report["census"] = for_preflight(machine, archs, python, dirs, list(census_sites))
        _note_census(rows, report["census"], {p.recipe.id: p.recipe.needs for _, p in pairs})
        report["census_fails"], report["census_warnings"] = census_fails(report["census"])
    return report


def census_fails(census: dict[str, Any]) -> tuple[list[str], list[str]]:
    """One line per package a server loads (torch, sgl-kernel/sglang-kernel, flashinfer) that cannot run on a GPU
    it was judged for: where a module without an image is loaded at import, it fails every server start, so
    preflight exits 1. Where the package's own source loads each such module only in a try block or when a feature
    calls it (census/loading.py: sglang-kernel's flashmla_ops), the server starts and those features fail: a
    warning, not a failure. Each problem gets `loading` (module -> how its package loads it)."""
    from sm120patch.census.loading import how_loaded
    from sm120patch.census.scan import SERVER_PACKAGES, failing

    sites = [Path(s) for s in census.get("site_packages", [])]
    fails: list[str] = []
    warnings: list[str] = []
    for p in failing(census, SERVER_PACKAGES):
        head = f"{p['package']} {p['version']} cannot run on {p['gpu']} ({p['status']})"
        loads = {}
        for rel in p.get("modules", []):
            site = next((s for s in sites if (s / rel).exists()), None)
            loads[rel] = how_loaded(site, rel) if site is not None else None
        p["loading"] = {rel: (ld.kind if ld else "unknown") for rel, ld in loads.items()}
        if not loads or any(ld is None or ld.at_start for ld in loads.values()):
            fails.append(f"{head}: {'; '.join(p['you_will_see'])}")
            continue
        said = "; ".join(f"{rel}: {ld.say()}" for rel, ld in loads.items() if ld is not None)
        warnings.append(
            f"{head} in {len(loads)} module{'s' if len(loads) > 1 else ''} the server does not load at start "
            f"({said}): it starts, and the features that call them fail with: {'; '.join(p['you_will_see'])}"
        )
    return fails, warnings


def _note_backport(
    rows: list[dict[str, Any]],
    targets: Sequence[Target],
    recipes: Sequence[Recipe],
    archs: Sequence[Arch],
    fi: Any,
    level: str,
) -> None:
    """A FlashInfer given by --flashinfer (or beside the tree) is not a target, so its recipes are not
    planned: ask what `apply SGLANG FLASHINFER` would do, and where a blocked SGLang gate opens with
    the FlashInfer backport, say so with that command (the answer apply itself would give)."""
    blocked = [r for r in rows if r["status"] == BLOCKED and r["package"] == "sglang"]
    if not blocked or not getattr(fi, "found", False) or not any(r.package == "flashinfer" for r in recipes):
        return
    from sm120patch.engine.pipeline import RunSettings, plan_many
    from sm120patch.errors import UserError
    from sm120patch.hints import apply_command
    from sm120patch.planning.targets import discover

    try:
        fi_targets = discover(Path(fi.location), "flashinfer")
    except UserError:
        return  # not a tree sm120patch can patch (no version, say): nothing to advise
    both = [*fi_targets, *targets]
    run = RunSettings(list(archs), fi, level, make_probe)
    planned = {p.recipe.id: p for p in plan_many(both, recipes, run, planner=_cached_plan)}
    fixes = [i for i, p in planned.items() if p.recipe.package == "flashinfer" and p.status == APPLICABLE]
    for r in blocked:
        if fixes and (p := planned.get(r["id"])) is not None and p.status == APPLICABLE:
            cmd = apply_command(*dict.fromkeys(t.root for t in [*targets, *fi_targets]))
            r["advice"] = (
                f"opens with the FlashInfer backport ({', '.join(fixes)}): run `{cmd}` (FlashInfer first, "
                "each probed), or upgrade FlashInfer"
            )
            r["needs_recipes"] = fixes


def _cached_plan(
    target: Target,
    recipes: Sequence[Recipe],
    archs: Sequence[Arch],
    applied: dict[str, str] | None = None,
    allow_untested: bool = False,
) -> list[RecipePlan]:
    """`plan`, with the statuses from the plan-result cache (`plan_statuses`): the backport note
    reads statuses only, so a warm pre-flight parses none of the SGLang files again."""
    if allow_untested:  # not keyed by the cache
        from sm120patch.planning.plan import plan

        return plan(target, recipes, archs, applied=applied, allow_untested=True)
    return plan_statuses(target, recipes, archs, applied=applied)


def _note_census(rows: list[dict[str, Any]], census: dict[str, Any], needs: dict[str, Any]) -> None:
    """A recipe whose kernels live in a package that has no image for a GPU says so (row["census"])."""
    from sm120patch.census.verdicts import recipe_notes

    for rid, lines in recipe_notes(census, needs).items():
        for r in rows:
            if r["id"] == rid:
                r["census"] = lines


def _rung(verdicts: Sequence[dict[str, Any]]) -> str:
    """The weakest rung the recipe's verdicts reached (a recipe is as proven as its least proven need)."""
    if not verdicts:
        return "-"
    return min((str(v.get("rung", "none")) for v in verdicts), key=rung_index)


def render(report: dict[str, Any]) -> str:
    """The human table."""
    m = report["machine"]
    out = []
    gpus = m["gpus"] or []
    if gpus:
        for g in gpus:
            out.append(f"GPU {g['index']}: {g['name']} ({g['arch']}, from {g['source']})")
    else:
        out.append("GPU: none detected")
    for note in m.get("notes", []):
        out.append(f"  note: {note}")
    out.append(f"planning for: {', '.join(report['archs'])} ({report['arch_source']})")
    out.append(f"driver: {m.get('driver') or '-'}")
    cuda = m["cuda"]
    out.append(f"CUDA toolkit: {cuda.get('version') or 'not found'} {cuda.get('home') or ''}".rstrip())
    for arch, b in report["can_build"].items():
        out.append(f"  build for {arch}: {'yes' if b['ok'] else 'no'} ({b['why']})")
    t = m.get("torch")
    if t:
        out.append(
            f"torch: {t.get('version') or 'not importable'} (CUDA {t.get('cuda') or '-'}; "
            f"archs {' '.join(t.get('arch_list') or []) or '-'})" + (f" [{t['error']}]" if t.get("error") else "")
        )
    for tgt in report["targets"]:
        out.append(f"{tgt['package']}: {tgt['version']} at {tgt['root']}")
    if report.get("sglang_missing"):
        out.append(
            f"sglang: not found ({report['sglang_missing']}); no recipe to plan, the machine and census still answer"
        )
    fi = report.get("flashinfer") or {}
    if fi.get("package_dir"):
        out.append(f"flashinfer: {fi.get('version')} at {fi.get('package_dir')}")
        for k, v in (fi.get("dist_versions") or {}).items():
            out.append(f"  {k} {v}")
    else:
        out.append(f"flashinfer: not found ({fi.get('error') or 'pass --flashinfer PATH'})")
    out.append(f"probe level: {report['probe_level']}")
    out.append("")
    width = max((len(r["id"]) for r in report["recipes"]), default=10)
    if report["recipes"]:
        out.append(f"{'recipe':<{width}}  {'status':<14} {'rung':<8} what to do")
    else:
        out.append("recipes: none planned (no SGLang or FlashInfer tree to patch)")
    for r in report["recipes"]:
        out.append(f"{r['id']:<{width}}  {r['status']:<14} {r['rung']:<8} {r['advice']}")
        out.append(f"{'':<{width}}  {r['reason']}")
        for line in r.get("census", []):
            out.append(f"{'':<{width}}  census: {line}")
    if report.get("census"):
        from sm120patch.census.render import render_lines

        out += ["", *render_lines(report["census"])]
    for line in report.get("census_fails", []):
        out.append(f"census: {line} (preflight exits 1)")
    for line in report.get("census_warnings", []):
        out.append(f"census: WARNING: {line}")
    return "\n".join(out)
