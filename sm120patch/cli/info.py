"""Read-only commands: the recipe catalogue, the probe ladder, the pre-flight report."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sm120patch import cli
from sm120patch.cli import common
from sm120patch.cli.bundle import preflight_bundle
from sm120patch.cli.common import emit_json
from sm120patch.cli.options import TreeOptions, bundle_option, tree_options
from sm120patch.engine.which_flashinfer import resolve_flashinfer
from sm120patch.errors import EXIT_FAILED, EXIT_OK, UserError
from sm120patch.planning.targets import discover, targets_for
from sm120patch.probes.recipe_probe import resolve_archs
from sm120patch.status import fails

if TYPE_CHECKING:
    from sm120patch.catalogue.recipes import Recipe


@click.command("recipes", short_help=cli.summary("recipes"))
@tree_options(targets=False, arch=False)
def recipes_cmd(opts: TreeOptions) -> int:
    """List the recipe catalogue: what each opens, for which versions and GPUs, and why."""
    recipes = common.load_recipes(opts.recipe_dir)
    if opts.as_json:
        emit_json({"recipes": [_recipe_dict(r) for r in recipes]})
        return EXIT_OK
    for r in recipes:
        click.echo(f"{r.id}  ({r.package} {r.versions}; {', '.join(a.name for a in r.arch)})")
        click.echo(f"  {r.title}")
        for line in r.why.splitlines():
            click.echo(f"    {line}")
        if r.needs:
            click.echo(f"  needs: {', '.join(r.needs)}")
        click.echo(f"  edits: {', '.join(e.name for e in r.edits)}")
        click.echo("")
    return EXIT_OK


def _recipe_dict(r: Recipe) -> dict[str, Any]:
    return {
        "id": r.id,
        "package": r.package,
        "title": r.title,
        "why": r.why,
        "versions": str(r.versions),
        "arch": [a.name for a in r.arch],
        "needs": list(r.needs),
        "crash_signatures": list(r.crash_signatures),
        "advice": r.advice,
        "edits": [e.name for e in r.edits],
        "path": str(r.path),
        "sha256": r.sha256,
    }


@click.command("probe", short_help=cli.summary("probe"))
@click.argument("kernels", nargs=-1, metavar="KERNEL...")
@tree_options("spec", targets=False, recipes=False)
def probe_cmd(opts: TreeOptions, kernels: tuple[str, ...]) -> int:
    """Climb the probe ladder for kernels (default: every kernel in the catalogue).

    Each line says the rung the verdict reached and, when lower, the rung asked for.
    Exit 0 only when every kernel passed on the rung asked for; 1 otherwise (a fail,
    an unknown, or a pass that stands on a lower rung because a higher one could not look).

    \b
    sm120patch probe flashinfer:trtllm_comm --arch sm_120
    sm120patch probe flashinfer:norm --probe run        (on the GPU box)
    """
    from sm120patch.catalogue.kernels import load_kernels
    from sm120patch.probes import ProbeCache, prefetch_spec, probe_kernel
    from sm120patch.probes.run import timing as run_timing

    catalogue = load_kernels()
    names = list(kernels) or sorted(catalogue)
    unknown = [k for k in names if k not in catalogue]
    if unknown:
        raise UserError(f"{', '.join(unknown)}: not in the kernel catalogue; known: {', '.join(sorted(catalogue))}")
    level = opts.level
    if level == "none":
        raise UserError("--probe none probes nothing; pick a rung: static, artifact, spec, build or run")
    archs, arch_note = resolve_archs(opts.arch)
    fi = resolve_flashinfer([], opts.flashinfer, opts.python)
    if not fi.found:
        raise UserError(f"no FlashInfer to probe ({fi.error}); pass --flashinfer PATH or --python EXE")
    cache = ProbeCache()
    prefetch_spec(names, archs, fi, level, cache)  # one FlashInfer import per arch, not one per check
    verdicts = [probe_kernel(k, a, fi, level, cache) for k in names for a in archs]
    if opts.as_json:
        emit_json(
            {
                "flashinfer": fi.to_dict(),
                "archs": [a.name for a in archs],
                "level": level,
                "verdicts": [v.to_dict() for v in verdicts],
            }
        )
    else:
        click.echo(f"FlashInfer {fi.version} at {fi.location}; {', '.join(a.name for a in archs)} ({arch_note})")
        for v in verdicts:
            reached = v.rung if v.rung == level else f"{v.rung} (asked {level})"
            click.echo(f"  {v.result:<8} {v.kernel:<36} {v.arch:<7} {reached:<20} {v.elapsed_s:6.2f}s  {v.reason}")
            for line in run_timing.table(run_timing.of_verdict(v.to_dict())):
                click.echo(f"      {line}")
    # a pass that stands on a lower rung than asked is not what was asked for: say so, exit 1
    proven = all(v.result == "pass" and not v.short_of_asked for v in verdicts)
    return EXIT_OK if proven else EXIT_FAILED


@click.command("preflight", short_help=cli.summary("preflight"))
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--package", type=click.Choice(["sglang", "flashinfer"]), help="Only this package.")
@tree_options("spec", targets=False)
@click.option("--no-torch", is_flag=True, help="Skip asking torch (in a subprocess) for its CUDA and arch list.")
@bundle_option(
    "Check this node against a bundle: the installed packages are its releases holding its patched bytes, "
    "and each recipe it opened has its kernels for this node's GPUs on the FlashInfer imported here "
    "(--flashinfer PATH: that tree). Probes at the bundle's rung unless --probe."
)
@click.option(
    "--report",
    "report_file",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help="Also write the JSON report to FILE (e.g. a volume the server container reads).",
)
@click.option(
    "--site-packages",
    "site_packages",
    multiple=True,
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    metavar="DIR",
    help="Census the compiled CUDA code in DIR (repeatable; default: --python's site-packages, or the one "
    "holding PATH).",
)
@click.option("--no-census", is_flag=True, help="Skip the census of compiled extensions (SASS/PTX per GPU).")
def preflight_cmd(
    opts: TreeOptions,
    path: Path | None,
    no_torch: bool,
    bundle_dir: Path | None,
    report_file: Path | None,
    site_packages: tuple[Path, ...],
    no_census: bool,
) -> int:
    """What will sm120patch do on this box? GPUs, driver, CUDA, torch, the SGLang and
    FlashInfer it would patch and probe, and per recipe: status, probe verdict, rung, advice.
    Then a census of every installed distribution with compiled CUDA code (torch,
    sglang-kernel, FlashInfer's caches, vLLM, ...): the SASS and PTX it carries, whether each
    GPU can run it, what you would see if not and what to install; and Triton's ptxas.

    PATH defaults to the SGLang installed for --python (or this interpreter). Works
    without a GPU: `sm120patch preflight --arch sm_120`.

    \b
    Can a DGX Spark run this venv's wheels? (the census; docs/census.md)
      sm120patch preflight --python /opt/venv/bin/python --arch sm_121

    \b
    On a GPU node (an init container before the server starts):
      sm120patch preflight --bundle /opt/sm120patch/bundle
    exits 1, naming the recipe and the command that takes it back, when the node cannot
    run what the image opened (another GPU, a swapped FlashInfer, bytes not the bundle's).

    Exits 1 too when torch, sgl-kernel / sglang-kernel or FlashInfer cannot run on a GPU it
    judged (the census). Without SGLang it says so and still reports the machine and the census
    (`sm120patch census` is that part alone).
    """
    from sm120patch.engine.preflight import preflight, render

    if bundle_dir is not None:
        if opts.package or opts.recipe_dir:
            raise UserError("--bundle checks the bundle's recipes: leave out --package and --recipes")
        return preflight_bundle(bundle_dir, path, opts, report_file)

    recipes = common.load_recipes(opts.recipe_dir)
    # what `apply --installed` would patch (both packages where both are installed: bug 13)
    missing = ""
    if path is None:
        targets, missing = _installed_targets(opts.package, opts.python, site_packages)
    else:
        targets = discover(path, opts.package)
    archs, arch_note = resolve_archs(opts.arch)
    fi = resolve_flashinfer(targets, opts.flashinfer, opts.python)
    report = preflight(
        targets,
        recipes,
        archs,
        arch_note,
        fi,
        opts.level,
        with_torch=not no_torch,
        python=opts.python,
        census_sites=None if no_census else list(site_packages),
    )
    if missing:
        report["sglang_missing"] = missing
    common.write_report(report, report_file, opts.as_json, render)
    blocked = any(fails(r["status"]) for r in report["recipes"])
    return EXIT_FAILED if blocked or report.get("census_fails") else EXIT_OK


def _installed_targets(
    package: str | None, python: str | None, site_packages: tuple[Path, ...]
) -> tuple[list[Any], str]:
    """What `apply --installed` would patch; with no SGLang installed (a vLLM or plain-torch
    environment, an image being built) no targets and the reason, so the machine report and the
    census still answer. Another mistake (a --python that does not run) stays exit 2."""
    try:
        return targets_for([], True, package, python), ""
    except UserError as e:
        if "not installed" not in str(e):
            raise
        for site in site_packages:  # --site-packages DIR holding sglang/: that one
            if (site / "sglang" / "__init__.py").is_file() and package in (None, "sglang"):
                return discover(site / "sglang", package), ""
        return [], str(e)
