"""Commands that change or inspect a tree: plan, apply, rollback, status, clone."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from sm120patch import cli_common as common
from sm120patch.cli_common import (
    arch_option,
    emit_json,
    json_option,
    probe_options,
    recipes_option,
    report,
    target_options,
    targets_for,
)
from sm120patch.errors import EXIT_FAILED, EXIT_OK, UserError
from sm120patch.gatekeeper import resolve_archs


@click.command("plan")
@target_options
@arch_option
@probe_options("static")
@recipes_option
@click.option("--no-diff", is_flag=True, help="Statuses only.")
@json_option
def plan_cmd(
    path: Path | None,
    installed: bool,
    package: str | None,
    arch: tuple[str, ...],
    level: str,
    flashinfer: Path | None,
    python: str | None,
    recipe_dir: Path | None,
    no_diff: bool,
    as_json: bool,
) -> None:
    """Dry run: each recipe's status on PATH and the unified diff it would write.

    Nothing is written. The diff applies with `git apply` from the tree's root. A
    recipe whose kernels the probe cannot find for the GPU shows as `blocked`.
    """
    from sm120patch.engine import make_plan

    recipes = common.load_recipes(recipe_dir)
    targets = targets_for(path, installed, package)
    archs, arch_note = resolve_archs(arch)
    probe = common.make_tree_probe(targets, archs, level, flashinfer, python)
    plans = [p for t in targets for p in make_plan(t, recipes, archs, probe=probe)]
    if arch_note != "--arch" and not as_json:
        click.echo(f"arch: {', '.join(a.name for a in archs)} ({arch_note})", err=True)
    sys.exit(report(archs, targets, plans, as_json, show_diff=not no_diff))


@click.command("apply")
@target_options
@arch_option
@probe_options("spec")
@recipes_option
@click.option("--recipe", "only", multiple=True, metavar="ID", help="Apply only this recipe (repeatable).")
@click.option("--force", is_flag=True, help="Apply over uncommitted changes in a git target.")
@click.option("--commit", is_flag=True, help="On a git target, commit each recipe on branch sm120patch/<arch>.")
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=0.0,
    metavar="SECONDS",
    help="Wait this long for another run on the same tree to finish.",
)
@click.option("--no-diff", is_flag=True, help="Do not print the diffs written.")
@json_option
def apply_cmd(
    path: Path | None,
    installed: bool,
    package: str | None,
    arch: tuple[str, ...],
    level: str,
    flashinfer: Path | None,
    python: str | None,
    recipe_dir: Path | None,
    only: tuple[str, ...],
    force: bool,
    commit: bool,
    wait_s: float,
    no_diff: bool,
    as_json: bool,
) -> None:
    """Apply every applicable recipe to PATH: journal, write, probe, revert what fails.

    The journal (.sm120patch/ at the tree's root) records the original bytes first,
    so `sm120patch rollback PATH` restores them even after a crash or a kill. A recipe
    whose probe does not find its kernels for every GPU arch is reverted (exit 1).
    """
    from sm120patch import engine

    recipes = common.load_recipes(recipe_dir)
    unknown = [i for i in only if i not in {r.id for r in recipes}]
    if unknown:
        raise UserError(f"--recipe {', '.join(unknown)}: no such recipe; see `sm120patch recipes`")
    targets = targets_for(path, installed, package)
    archs, arch_note = resolve_archs(arch)
    if arch_note != "--arch" and not as_json:
        click.echo(f"arch: {', '.join(a.name for a in archs)} ({arch_note})", err=True)
    probe = common.make_tree_probe(targets, archs, level, flashinfer, python)
    plans = [
        p
        for t in targets
        for p in engine.apply(
            t, recipes, archs, probe=probe, force=force, commit=commit, wait_s=wait_s, only=only or None
        )
    ]
    sys.exit(report(archs, targets, plans, as_json, show_diff=not no_diff))


@click.command("rollback")
@target_options
@click.option("--recipe", "ids", multiple=True, metavar="ID", help="Roll back only this recipe (repeatable).")
@click.option("--force", is_flag=True, help="Restore even files edited since apply (your version is kept).")
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=0.0,
    metavar="SECONDS",
    help="Wait this long for another run on the same tree to finish.",
)
@recipes_option
@json_option
def rollback_cmd(
    path: Path | None,
    installed: bool,
    package: str | None,
    ids: tuple[str, ...],
    force: bool,
    wait_s: float,
    recipe_dir: Path | None,
    as_json: bool,
) -> None:
    """Restore the original bytes of every file sm120patch changed (or only --recipe ID's).

    Also finishes an apply that was killed midway, returning those files to their
    state before it. Refuses to overwrite a file you edited after apply unless --force.
    """
    from sm120patch import engine

    recipes = common.load_recipes(recipe_dir)
    targets = targets_for(path, installed, package)
    results = [
        {"target": t.to_dict(), **engine.rollback(t, recipes, ids=ids or None, force=force, wait_s=wait_s)}
        for t in targets
    ]
    if as_json:
        emit_json({"targets": results})
        return
    for r in results:
        t = r["target"]
        if not r["rolled_back"] and not r["recovered"]:
            click.echo(f"{t['package']} at {t['root']}: nothing to roll back")
            continue
        if r["recovered"]:
            click.echo(
                f"{t['package']} at {t['root']}: finished an interrupted run, restored {', '.join(r['recovered'])}"
            )
        for rid in r["rolled_back"]:
            click.echo(f"  rolled back     {rid}")
        for c in r["kept_copies"]:
            click.echo(f"  your edited version was kept at {c}")
        if r["remaining"]:
            click.echo(f"  still applied:  {', '.join(r['remaining'])}")


@click.command("status")
@target_options
@json_option
def status_cmd(path: Path | None, installed: bool, package: str | None, as_json: bool) -> None:
    """What sm120patch has applied to PATH, and which files changed since."""
    from sm120patch import engine

    targets = targets_for(path, installed, package)
    results = [{"target": t.to_dict(), **engine.status(t)} for t in targets]
    if as_json:
        emit_json({"targets": results})
        return
    changed = False
    for r in results:
        t = r["target"]
        click.echo(f"{t['package']} {t['version']} at {t['root']}")
        if r["interrupted"]:
            click.echo(
                f"  an apply was interrupted while writing {', '.join(r['interrupted'])}: "
                f"run `sm120patch rollback {t['root']}`"
            )
        if not r["applied"]:
            click.echo("  nothing applied")
        for a in r["applied"]:
            click.echo(f"  applied  {a['id']}  ({a['arch']}, {a['at']})")
        for f in r["files"]:
            mark = "" if f["state"] == "as-applied" else f"  <- {f['state']}"
            changed |= f["state"] != "as-applied"
            click.echo(f"    {f['path']}{mark}")
    sys.exit(EXIT_FAILED if changed or any(r["interrupted"] for r in results) else EXIT_OK)


@click.command("clone")
@click.argument("source", metavar="URL[@REF]")
@click.argument("dest", type=click.Path(path_type=Path))
@json_option
def clone_cmd(source: str, dest: Path, as_json: bool) -> None:
    """Make a fresh clone to patch: `sm120patch clone https://github.com/sgl-project/sglang@v0.5.9 sglang`."""
    from sm120patch.gitops import clone

    info = clone(source, dest)
    if as_json:
        emit_json(info)
    else:
        click.echo(f"cloned {info['url']} at {info['ref'] or 'default branch'} ({info['commit'][:12]}) into {dest}")
        click.echo(f"next: sm120patch plan {dest}")
