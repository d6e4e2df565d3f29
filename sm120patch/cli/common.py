"""What every `sm120patch` command shares: options, how targets and probes are chosen, output.

Kept light: `--help` and usage errors must not pay for packaging, tomllib or libcst,
so what planning needs is imported inside the functions that plan.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sm120patch.arch import DEFAULT, KNOWN, Arch
from sm120patch.errors import EXIT_FAILED, EXIT_OK, UserError
from sm120patch.hints import rollback_command
from sm120patch.planning.targets import discover, installed
from sm120patch.probes.recipe_probe import PROBE_LEVELS, make_probe, resolve_flashinfer
from sm120patch.status import APPLICABLE, APPLIED, fails
from sm120patch.status import colour as status_colour

if TYPE_CHECKING:
    from sm120patch.catalogue.recipes import Recipe
    from sm120patch.engine.pipeline import Run
    from sm120patch.planning.plan import RecipePlan
    from sm120patch.planning.targets import Target


def load_recipes(directory: Path | None = None) -> list[Recipe]:
    """`recipes.load_recipes`, imported on first use (packaging, tomllib and the transforms)."""
    from sm120patch.catalogue.recipes import load_recipes as load

    return load(directory)


# --- shared options -------------------------------------------------------------------------


def arch_option(f: Any) -> Any:
    return click.option(
        "--arch",
        "arch",
        multiple=True,
        metavar="ARCH",
        help=f"GPU architecture to plan for ({', '.join(KNOWN)}); repeat for mixed GPUs. "
        f"Default: the GPUs NVML/nvidia-smi see, else {DEFAULT}.",
    )(f)


def probe_options(default: str) -> Any:
    def deco(f: Any) -> Any:
        f = click.option(
            "--probe",
            "--probe-level",
            "level",
            type=click.Choice(PROBE_LEVELS),
            default=default,
            show_default=True,
            help="How far up the probe ladder to check that a recipe's kernels exist: static (read "
            "FlashInfer's source), artifact (prebuilt cubins), spec (ask FlashInfer, no GPU), build "
            "(nvcc), run (GPU). 'none' skips the check.",
        )(f)
        f = click.option(
            "--flashinfer",
            "flashinfer",
            type=click.Path(path_type=Path),
            metavar="PATH",
            help="FlashInfer tree to probe (default: next to the target, else what --python imports).",
        )(f)
        return click.option(
            "--python",
            "python",
            metavar="EXE",
            help="Interpreter of the server's environment (default: this one).",
        )(f)

    return deco


def target_options(f: Any) -> Any:
    f = click.option(
        "--installed",
        is_flag=True,
        help="Use the SGLang and FlashInfer the current Python imports (found without importing them).",
    )(f)
    f = click.option(
        "--package", type=click.Choice(["sglang", "flashinfer"]), help="Only this package, when PATH holds several."
    )(f)
    return click.argument("paths", nargs=-1, type=click.Path(path_type=Path), metavar="[PATH]...")(f)


def choice_options(f: Any) -> Any:
    """--exclude and --ok-blocked: what an image build needs to run `apply` without `|| true`."""
    f = click.option(
        "--ok-blocked",
        is_flag=True,
        help="Exit 0 although recipes are `blocked` (their probe did not find the kernels, so their gate "
        "stays shut: a safe outcome). Failed, stale, reverted and untested recipes still exit 1.",
    )(f)
    return click.option(
        "--exclude",
        "exclude",
        multiple=True,
        metavar="ID",
        help="Leave this recipe out (repeatable): not probed, not written, reported as `excluded`.",
    )(f)


def check_ids(recipes: Sequence[Recipe], flag: str, ids: Sequence[str]) -> None:
    """An id no recipe has is a typo: refuse it (exit 2) before anything is planned."""
    unknown = [i for i in ids if i not in {r.id for r in recipes}]
    if unknown:
        raise UserError(f"{flag} {', '.join(unknown)}: no such recipe; see `sm120patch recipes`")


json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
recipes_option = click.option(
    "--recipes",
    "recipe_dir",
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="Recipe folder (default: the built-in catalogue, or $SM120PATCH_RECIPES).",
)


def targets_for(
    paths: Sequence[Path], installed_flag: bool, package: str | None, python: str | None = None
) -> list[Target]:
    """Every package tree the paths hold (an SGLang clone and a FlashInfer tree, or both in one
    site-packages), each once; or, with --installed, what this Python (or --python EXE) imports."""
    if installed_flag:
        if paths:
            raise UserError("give PATH or --installed, not both")
        found = []
        for pkg in [package] if package else ["sglang", "flashinfer"]:
            try:
                found.append(installed_for(python, pkg))
            except UserError:
                if package or pkg == "sglang":
                    raise
        return found
    if not paths:
        raise UserError("missing PATH: give the folder of an SGLang/FlashInfer clone or install, or --installed")
    out: dict[Path, Target] = {}
    for path in paths:
        for t in discover(path, package):
            out.setdefault(t.package_dir, t)
    return list(out.values())


def interrupted(targets: Sequence[Target]) -> str:
    """The line naming a state a killed run left (its undo is pending), with the one command that
    finishes it; "" when there is none. `plan` must not blame the release for half-written files."""
    from sm120patch.engine.journal import Journal

    for root in dict.fromkeys(t.root for t in targets):
        try:
            pending = Journal.open(root).data.get("pending")
        except UserError:
            continue
        if pending and pending.get("writes"):
            return (
                f"{root}: a run was killed while writing {', '.join(sorted(pending['writes']))}; the plan below "
                f"reads those half-written files. Run `{rollback_command(root)}` to finish its undo first"
            )
    return ""


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def report(
    archs: Sequence[Arch],
    targets: Sequence[Target],
    plans: Sequence[RecipePlan],
    as_json: bool,
    show_diff: bool,
    extra: dict[str, Any] | None = None,
    stat: bool = False,
    ok_blocked: bool = False,
) -> int:
    """Print the plans (statuses, then the diff: whole, or with `stat` one line per file) or
    their JSON; returns the exit code their statuses call for."""
    if as_json:
        emit_json(
            {
                "arch": ",".join(a.name for a in archs),
                "targets": [t.to_dict() for t in targets],
                "recipes": [p.to_dict() for p in plans],
                **(extra or {}),
            }
        )
    else:
        colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        for t in targets:
            click.echo(
                f"{t.package} {t.version or '(version unknown)'} at {t.root} "
                f"[version from {t.version_source}] for {', '.join(a.name for a in archs)}"
            )
        width = max((len(p.recipe.id) for p in plans), default=0)
        for p in plans:
            status = f"{p.status:<14}"
            if colour:
                status = click.style(status, fg=status_colour(p.status))
            click.echo(f"  {status} {p.recipe.id:<{width}}  {p.reason}")
        if show_diff and stat:
            _print_stat(plans)
        elif show_diff:
            from sm120patch.planning.diffs import colour as paint

            for p in plans:
                d = p.diff()
                if d:
                    click.echo("")
                    click.echo(paint(d) if colour else d, nl=False)
    return EXIT_FAILED if any(fails(p.status, ok_blocked) for p in plans) else EXIT_OK


def _print_stat(plans: Sequence[RecipePlan]) -> None:
    """`git diff --stat` of what the plans would write: per file, the lines added and removed by
    all the recipes that edit it (two recipes may edit one file), and which recipes those are."""
    from sm120patch.planning.diffs import stat

    files: dict[str, tuple[bytes, bytes, list[str]]] = {}
    for p in plans:
        for rel, (before, after) in sorted(p.changes.items()):
            first, _, ids = files.get(rel, (before, after, []))
            tag = p.recipe.id if p.status in (APPLICABLE, APPLIED) else f"{p.recipe.id}: {p.status}"
            files[rel] = (first, after, [*ids, tag])
    if not files:
        return
    click.echo("")
    width = max(len(rel) for rel in files)
    for rel, (before, after, ids) in sorted(files.items()):
        added, removed = stat(before.decode("utf-8"), after.decode("utf-8"))
        click.echo(f"  {rel:<{width}}  +{added} -{removed}  ({', '.join(ids)})")
    click.echo("  (the whole diff: the same command without --stat)")


def make_run(
    targets: Sequence[Target],
    archs: Sequence[Arch],
    level: str,
    flashinfer: Path | None,
    python: str | None,
    allow_untested: bool = False,
) -> Run:
    """What one plan/apply shares: the archs, the FlashInfer the probes judge, the rung."""
    from sm120patch.engine.pipeline import Run

    fi = None if level == "none" else resolve_flashinfer(targets, flashinfer, python)
    return Run(list(archs), fi, level, lambda a, f, lv: make_probe(a, f, lv), allow_untested)


def make_tree_probe(
    targets: Sequence[Target], archs: Sequence[Arch], level: str, flashinfer: Path | None, python: str | None
) -> Any:
    if level == "none":
        return None
    return make_probe(archs, resolve_flashinfer(targets, flashinfer, python), level)


def installed_for(python: str | None, package: str) -> Target:
    """The package `python` imports (this interpreter by default), located without importing it."""
    if python is None:
        return installed(package)
    import subprocess

    code = f"import importlib.util as u; s = u.find_spec({package!r}); print(list(s.submodule_search_locations)[0])"
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise UserError(f"--python {python}: cannot run it ({e.strerror}); give the server's interpreter") from None
    if r.returncode != 0:
        raise UserError(f"{python}: {package} is not installed there; give PATH or another --python")
    pkg = Path(r.stdout.strip().splitlines()[-1])
    return discover(pkg.parent, package)[0]
