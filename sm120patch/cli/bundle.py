"""Bundles on the command line: `export`, and what `apply --bundle` / `preflight --bundle` run.

The commands only parse flags and print; `bundle/` makes and reads bundles, `bundle/node.py`
applies one and checks a node against one.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sm120patch.cli import common
from sm120patch.cli.common import arch_option, emit_json, json_option, probe_options, recipes_option, target_options
from sm120patch.errors import EXIT_FAILED, EXIT_OK, UserError
from sm120patch.probes.recipe_probe import resolve_archs
from sm120patch.status import fails

if TYPE_CHECKING:
    from sm120patch.arch import Arch
    from sm120patch.bundle.format import Bundle
    from sm120patch.planning.targets import Target


def bundle_option(what: str) -> Any:
    return click.option(
        "--bundle",
        "bundle_dir",
        type=click.Path(path_type=Path),
        metavar="DIR",
        help=what,
    )


def level_given(default_from_bundle: str, level: str) -> str:
    """--probe when the user gave it, else the rung the bundle's proofs were made at."""
    ctx = click.get_current_context()
    source = ctx.get_parameter_source("level")
    return level if source is not None and source.name != "DEFAULT" else default_from_bundle


@click.command("export")
@target_options
@arch_option
@probe_options("spec")
@recipes_option
@click.option(
    "-o",
    "--output",
    "out",
    required=True,
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="Folder to write the bundle into (absent or empty).",
)
@click.option("--force", is_flag=True, help="Replace an earlier bundle in DIR.")
@click.option(
    "--allow-untested",
    is_flag=True,
    help="Export recipes on a release newer than any they were tested on (as `apply --allow-untested`).",
)
@common.choice_options
@json_option
def export_cmd(
    paths: tuple[Path, ...],
    installed: bool,
    package: str | None,
    arch: tuple[str, ...],
    level: str,
    flashinfer: Path | None,
    python: str | None,
    recipe_dir: Path | None,
    out: Path,
    force: bool,
    allow_untested: bool,
    exclude: tuple[str, ...],
    ok_blocked: bool,
    as_json: bool,
) -> None:
    """Write what `apply` would do to PATH as a bundle of patches anyone can apply with git,
    for images and fleets. Nothing in PATH is written.

    \b
    DIR/series         the patches in apply order (FlashInfer first)
    DIR/0001-<id>.patch  one per kept recipe, git format-patch form: the recipe's
                       title, why, the release it was made from, the probe's evidence
    DIR/manifest.json  tool version, arch, each package and version, per recipe its
                       status, files (sha256 before/after) and proof

    Blocked, satisfied and not-applicable recipes are listed in the manifest, not exported.
    Paths in the patches are relative to the folder that holds the package (site-packages
    in an image, python/ in an SGLang clone):

    \b
      sm120patch export ~/site --arch sm_120 -o bundle      (no GPU needed: --arch)
      cd /usr/lib/python3/dist-packages && while read p; do git apply ~/bundle/$p; done < ~/bundle/series
      sm120patch apply --bundle bundle                       (journaled, probed, rollback works)
      sm120patch preflight --bundle bundle                   (on each GPU node)

    Exit 1 when a recipe was blocked by its probe, or is untested on a release newer than its
    tests (the bundle is written without it; --allow-untested exports it).
    The output is reproducible: the same releases, recipes and flags give the same bytes
    (dates come from $SOURCE_DATE_EPOCH, else 1970).
    """
    from sm120patch.bundle.export import export

    recipes = common.load_recipes(recipe_dir)
    common.check_ids(recipes, "--exclude", exclude)
    targets = common.targets_for(paths, installed, package, python)
    archs, arch_note = resolve_archs(arch)
    if arch_note != "--arch" and not as_json:
        click.echo(f"arch: {', '.join(a.name for a in archs)} ({arch_note})", err=True)
    # what this Python imports runs under this Python: the spec rung needs the interpreter
    run = common.make_run(
        targets, archs, level, flashinfer, python or (sys.executable if installed else None), allow_untested
    )
    run.exclude = frozenset(exclude)
    bundle, _ = export(targets, recipes, run, out, force=force)
    failed = [r for r in bundle.recipes if fails(r.status, ok_blocked)]
    if as_json:
        emit_json({"bundle": str(bundle.dir), **bundle.to_dict()})
    else:
        _print_export(bundle, targets)
    sys.exit(EXIT_FAILED if failed else EXIT_OK)


def _print_export(bundle: Bundle, targets: Sequence[Target]) -> None:
    for t in targets:
        click.echo(f"{t.package} {t.version} at {t.root} for {', '.join(bundle.arch)} (probe: {bundle.probe_level})")
    width = max((len(r.id) for r in bundle.recipes), default=0)
    for r in bundle.recipes:
        click.echo(f"  {r.status:<14} {r.id:<{width}}  {r.patch or r.reason}")
    click.echo(f"bundle: {bundle.dir} ({len(bundle.series)} patch(es), series, manifest.json)")
    for t in bundle.targets:
        click.echo(f"  {t.package} {t.version}: apply from {t.apply_from}")


# --- apply --bundle -------------------------------------------------------------------------------


def found_targets(
    bundle: Bundle, paths: Sequence[Path], python: str | None, flashinfer: Path | None = None
) -> list[Target]:
    """Every package tree in PATHs; without PATH, what this Python (or --python) imports."""
    from sm120patch.planning.targets import discover

    found: dict[Path, Target] = {}
    if paths:
        for t in common.targets_for(paths, False, None):
            found.setdefault(t.package_dir, t)
    else:
        wanted = [t.package for t in bundle.targets]
        for pkg in dict.fromkeys([*wanted, "flashinfer"]):
            try:
                t = common.installed_for(python, pkg)
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


def apply_bundle(
    bundle_dir: Path,
    paths: Sequence[Path],
    arch: Sequence[str],
    level: str,
    flashinfer: Path | None,
    python: str | None,
    *,
    force: bool,
    commit: bool,
    wait_s: float,
    show_diff: bool,
    as_json: bool,
) -> int:
    """`apply --bundle`: the bundle's patches through the journal and the probe, as `apply`."""
    import tempfile

    from sm120patch.bundle.node import as_recipes, bundle_targets, bytes_match, check_for_apply
    from sm120patch.bundle.read import read
    from sm120patch.engine.pipeline import apply_many
    from sm120patch.planning.plan import APPLIED

    bundle = read(bundle_dir)
    found = found_targets(bundle, paths, python)
    targets = bundle_targets(bundle, found)
    check_for_apply(bundle, targets)
    archs, arch_note = bundle_archs(arch, bundle)
    if arch_note not in ("--arch",) and not as_json:
        click.echo(f"arch: {', '.join(a.name for a in archs)} ({arch_note})", err=True)
    level = level_given(bundle.probe_level, level)
    with tempfile.TemporaryDirectory(prefix="sm120patch-bundle-") as tmp:
        recipes = as_recipes(bundle, Path(tmp))
        run = common.make_run(found, archs, level, flashinfer, probe_python(paths, python))
        plans = apply_many(targets, recipes, run, force=force, commit=commit, wait_s=wait_s)
    complete = bool(plans) and all(p.status == APPLIED for p in plans)
    differ = bytes_match(bundle, targets) if complete else []
    extra = {
        "bundle": {
            "dir": str(bundle.dir),
            "probe_level": level,
            "complete": complete,
            "bytes_match": complete and not differ,
            "differ": differ,
        }
    }
    code = common.report(archs, targets, plans, as_json, show_diff=show_diff, extra=extra)
    if differ:
        if not as_json:
            click.echo(f"sm120patch: the files do not hold the bundle's bytes: {'; '.join(differ)}", err=True)
        return EXIT_FAILED
    return code


# --- preflight --bundle --------------------------------------------------------------------------


def preflight_bundle(
    bundle_dir: Path,
    path: Path | None,
    arch: Sequence[str],
    level: str,
    flashinfer: Path | None,
    python: str | None,
    *,
    as_json: bool,
    report_file: Path | None,
) -> int:
    """`preflight --bundle`: does this node hold the bundle's bytes, and run its kernels?"""
    from sm120patch.bundle.node import MISMATCH, bundle_targets, check_node, file_states
    from sm120patch.bundle.read import read
    from sm120patch.probes.recipe_probe import resolve_flashinfer

    bundle = read(bundle_dir)
    paths = [path] if path else []
    found = found_targets(bundle, paths, python, flashinfer)
    targets = bundle_targets(bundle, found)
    archs, arch_note = resolve_archs(arch)
    problems: list[str] = []
    if arch_note not in ("--arch", "detected"):
        problems.append("no GPU detected on this node: nothing to check the kernels against (pass --arch to name one)")
    level = level_given(bundle.probe_level, level)
    fi = resolve_flashinfer(found, flashinfer, probe_python(paths, python)) if level != "none" else None
    checks, version_problems = check_node(bundle, targets, archs, fi, level)
    problems = version_problems + problems
    ok = not problems and not any(c.state == MISMATCH for c in checks)
    report = {
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
    if report_file is not None:
        report_file.parent.mkdir(parents=True, exist_ok=True)
        report_file.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if as_json:
        emit_json(report)
    else:
        click.echo(render_node(report))
    return EXIT_OK if ok else EXIT_FAILED


def render_node(report: dict[str, Any]) -> str:
    b = report["bundle"]
    out = [
        f"bundle: {b['dir']} (made for {', '.join(b['arch'])} by sm120patch {b['tool_version']}, "
        f"probe {b['probe_level']})",
        f"this node: {', '.join(report['archs'])} ({report['arch_source']}); probing at the "
        f"{report['probe_level']} rung",
    ]
    fi = report.get("flashinfer") or {}
    if fi.get("package_dir"):
        out.append(f"flashinfer: {fi.get('version')} at {fi['package_dir']}")
    elif report["probe_level"] != "none":
        out.append(f"flashinfer: not found ({fi.get('error') or 'pass --flashinfer PATH'})")
    for t in report["targets"]:
        states = list(t["files"].values())
        held = sum(1 for s in states if s == "patched")
        files = f"{held} of {len(states)} file(s) hold the bundle's bytes" if states else "nothing patched here"
        out.append(f"{t['package']} {t['version']} at {t['root']} (bundle: {t['bundle_version']}): {files}")
    width = max((len(r["id"]) for r in report["recipes"]), default=10)
    for r in report["recipes"]:
        word = {"ok": "ok", "mismatch": "MISMATCH", "not-exported": "shut"}[r["state"]]
        out.append(f"  {word:<9} {r['id']:<{width}}  {r['reason']}")
        if r.get("rollback"):
            out.append(f"  {'':<9} {'':<{width}}  take it back: {r['rollback']}")
    for p in report["problems"]:
        out.append(f"problem: {p}")
    bad = [r["id"] for r in report["recipes"] if r["state"] == "mismatch"]
    if report["ok"]:
        out.append("node OK: it holds the bundle's bytes and runs what the bundle opened")
    else:
        out.append(
            "node MISMATCH: "
            + (f"{', '.join(bad)} cannot run here" if bad else "see the problems above")
            + "; schedule onto matching nodes, or take the recipe back with the command shown"
        )
    return "\n".join(out)
