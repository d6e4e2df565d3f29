"""Bundles on the command line: `export`, and what `apply --bundle` / `preflight --bundle` print.

The commands only parse flags, call one function and print: `bundle/export.py` writes a bundle,
`bundle/apply.py` applies one, `bundle/check.py` checks a node against one.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sm120patch import cli
from sm120patch.cli import common
from sm120patch.cli.options import TreeOptions, allow_untested_option, tree_options
from sm120patch.errors import EXIT_FAILED, EXIT_OK
from sm120patch.status import fails

if TYPE_CHECKING:
    from sm120patch.bundle.format import Bundle
    from sm120patch.planning.targets import Target


@click.command("export", short_help=cli.summary("export"))
@tree_options("spec", choice=True)
@click.option(
    "-o",
    "--output",
    "out",
    required=True,
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="Folder to write the bundle into (absent or empty; not a symlink, not inside PATH).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace an earlier bundle in DIR (only one export wrote, holding nothing else).",
)
@allow_untested_option("Export recipes on a release newer than any they were tested on (as `apply --allow-untested`).")
def export_cmd(opts: TreeOptions, out: Path, force: bool) -> int:
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
    from sm120patch.engine.pipeline import RunSettings

    recipes, targets, archs, arch_note = common.inputs(opts)
    common.say_arch(archs, arch_note, opts.as_json)
    # what this Python imports runs under this Python: the spec rung needs the interpreter
    python = opts.python or (sys.executable if opts.installed else None)
    run = RunSettings.probing(targets, archs, opts.level, opts.flashinfer, python, opts.allow_untested)
    bundle, _ = export(targets, recipes, dataclasses.replace(run, exclude=frozenset(opts.exclude)), out, force=force)
    failed = [r for r in bundle.recipes if fails(r.status, opts.ok_blocked)]
    if opts.as_json:
        common.emit_json({"bundle": str(bundle.dir), **bundle.to_dict()})
    else:
        _print_export(bundle, targets)
    return EXIT_FAILED if failed else EXIT_OK


def _print_export(bundle: Bundle, targets: Sequence[Target]) -> None:
    for t in targets:
        click.echo(f"{t.package} {t.version} at {t.root} for {', '.join(bundle.arch)} (probe: {bundle.probe_level})")
    width = max((len(r.id) for r in bundle.recipes), default=0)
    for r in bundle.recipes:
        click.echo(f"  {r.status:<14} {r.id:<{width}}  {r.patch or r.reason}")
    click.echo(f"bundle: {bundle.dir} ({len(bundle.series)} patch(es), series, manifest.json)")
    for t in bundle.targets:
        click.echo(f"  {t.package} {t.version}: apply from {t.apply_from}")


def apply_bundle(
    bundle_dir: Path, opts: TreeOptions, *, force: bool, commit: bool, wait_s: float, no_diff: bool
) -> int:
    """`apply --bundle`: bundle/apply.py does it; this prints it as `apply` prints its plans."""
    from sm120patch.bundle.apply import apply_bundle as apply

    done = apply(
        bundle_dir, opts.paths, opts.arch, opts.level if opts.probe_given else None, opts.flashinfer, opts.python,
        force=force, commit=commit, wait_s=wait_s,
        on_arch=lambda archs, note: common.say_arch(archs, note, opts.as_json),
    )  # fmt: skip
    code = common.report(
        done.archs, done.targets, done.plans, opts.as_json, show_diff=not no_diff, extra={"bundle": done.bundle}
    )
    if done.differ:
        if not opts.as_json:
            click.echo(f"sm120patch: the files do not hold the bundle's bytes: {'; '.join(done.differ)}", err=True)
        return EXIT_FAILED
    return code


def preflight_bundle(bundle_dir: Path, path: Path | None, opts: TreeOptions, report_file: Path | None) -> int:
    """`preflight --bundle`: bundle/check.py checks the node; this prints its report."""
    from sm120patch.bundle.check import check_bundle

    level = opts.level if opts.probe_given else None
    report = check_bundle(bundle_dir, path, opts.arch, level, opts.flashinfer, opts.python)
    common.write_report(report, report_file, opts.as_json, render_node)
    return EXIT_OK if report["ok"] else EXIT_FAILED


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
