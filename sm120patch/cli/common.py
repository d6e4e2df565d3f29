"""What the `sm120patch` commands share once their options are parsed (cli/options.py): the recipes,
the arch line, the plan report and the probe `status` re-checks with.

Kept light: `--help` and usage errors must not pay for packaging, tomllib or libcst,
so what planning needs is imported inside the functions that plan.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sm120patch.errors import EXIT_FAILED, EXIT_OK, UserError
from sm120patch.hints import rollback_command
from sm120patch.planning.targets import targets_for
from sm120patch.probes import recipe_probe
from sm120patch.status import APPLICABLE, APPLIED, fails
from sm120patch.status import colour as status_colour

if TYPE_CHECKING:
    from sm120patch.arch import Arch
    from sm120patch.catalogue.recipes import Recipe
    from sm120patch.cli.options import TreeOptions
    from sm120patch.engine.actions import Action
    from sm120patch.planning.plan import RecipePlan
    from sm120patch.planning.targets import Target


def load_recipes(directory: Path | None = None) -> list[Recipe]:
    """`recipes.load_recipes`, imported on first use (packaging, tomllib and the transforms)."""
    from sm120patch.catalogue.recipes import load_recipes as load

    return load(directory)


def inputs(opts: TreeOptions, only: Sequence[str] = ()) -> tuple[list[Recipe], list[Target], list[Arch], str]:
    """What plan, apply and export read first, in this order (so the first mistake is the one
    named): the recipes, the --recipe/--exclude ids, the trees, the archs (and where they came from)."""
    recipes = load_recipes(opts.recipe_dir)
    check_ids(recipes, "--recipe", only)
    check_ids(recipes, "--exclude", opts.exclude)
    targets = targets_for(opts.paths, opts.installed, opts.package, opts.python)
    archs, note = recipe_probe.resolve_archs(opts.arch)
    return recipes, targets, archs, note


def check_ids(recipes: Sequence[Recipe], flag: str, ids: Sequence[str]) -> None:
    """An id no recipe has is a typo: refuse it (exit 2) before anything is planned."""
    unknown = [i for i in ids if i not in {r.id for r in recipes}]
    if unknown:
        raise UserError(f"{flag} {', '.join(unknown)}: no such recipe; see `sm120patch recipes`")


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


def say_arch(archs: Sequence[Arch], note: str, as_json: bool, quiet: Sequence[str] = ("--arch",)) -> None:
    """On stderr, which GPUs a command plans for when they were not given (or not found)."""
    if note not in quiet and not as_json:
        click.echo(f"arch: {', '.join(a.name for a in archs)} ({note})", err=True)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def write_report(
    report: dict[str, Any], report_file: Path | None, as_json: bool, render: Callable[[dict[str, Any]], str]
) -> None:
    """`preflight`'s report: to --report FILE when given, then on stdout as JSON or as text."""
    if report_file is not None:
        report_file.parent.mkdir(parents=True, exist_ok=True)
        report_file.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if as_json:
        emit_json(report)
    else:
        click.echo(render(report))


def report(
    archs: Sequence[Arch],
    targets: Sequence[Target],
    plans: Sequence[RecipePlan],
    as_json: bool,
    show_diff: bool,
    extra: dict[str, Any] | None = None,
    stat: bool = False,
    ok_blocked: bool = False,
    actions: Sequence[Action] | None = None,
) -> int:
    """Print the plans (statuses, then `actions`: what an apply does, then the diff: whole, or
    with `stat` one line per file) or their JSON; returns the exit code their statuses call for."""
    if as_json:
        emit_json(
            {
                "arch": ",".join(a.name for a in archs),
                "targets": [t.to_dict() for t in targets],
                "recipes": [p.to_dict() for p in plans],
                **({"actions": [a.to_dict() for a in actions]} if actions is not None else {}),
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
        if actions is not None and show_diff:
            from sm120patch.engine.actions import render

            click.echo("")
            for line in render(actions):
                click.echo(line)
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


def make_tree_probe(
    targets: Sequence[Target], archs: Sequence[Arch], level: str, flashinfer: Path | None, python: str | None
) -> Any:
    if level == "none":
        return None
    from sm120patch.engine import which_flashinfer

    return recipe_probe.make_probe(archs, which_flashinfer.resolve_flashinfer(targets, flashinfer, python), level)
