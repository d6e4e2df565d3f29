"""Commands that change or inspect a tree: plan, apply, rollback, status, clone."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sm120patch import cli
from sm120patch.cli import common
from sm120patch.cli.bundle import apply_bundle
from sm120patch.cli.common import emit_json, report
from sm120patch.cli.options import (
    ALLOW_UNTESTED,
    TreeOptions,
    allow_untested_option,
    bundle_option,
    recipes_option,
    tree_options,
    wait_option,
)
from sm120patch.errors import EXIT_FAILED, EXIT_OK, UserError
from sm120patch.hints import apply_command, rollback_command
from sm120patch.planning.targets import targets_for
from sm120patch.probes.recipe_probe import resolve_archs
from sm120patch.status import APPLIED

if TYPE_CHECKING:
    from sm120patch.arch import Arch
    from sm120patch.engine.actions import Action
    from sm120patch.planning.plan import RecipePlan
    from sm120patch.planning.targets import Target


@click.command("plan", short_help=cli.summary("plan"))
@tree_options("static", choice=True)
@allow_untested_option(ALLOW_UNTESTED)
@click.option("--no-diff", is_flag=True, help="Statuses only.")
@click.option("--stat", "stat", is_flag=True, help="One line per file changed (lines added and removed), not the diff.")
def plan_cmd(opts: TreeOptions, no_diff: bool, stat: bool) -> int:
    """Dry run: each recipe's status on PATH and the unified diff it would write.

    PATH may be given twice: an SGLang tree and the FlashInfer it runs on (or one
    site-packages holding both). FlashInfer recipes are planned first, and the SGLang
    recipes' probes judge FlashInfer as those recipes would leave it.

    Nothing is written. The diff applies with `git apply` from the tree's root. A
    recipe whose kernels the probe cannot find for the GPU shows as `blocked`; an
    applied one whose kernels are gone from the FlashInfer now in front of it, `stale`
    (exit 1, with the rollback command).
    """
    from sm120patch.engine.pipeline import RunSettings, reconcile

    recipes, targets, archs, arch_note = common.inputs(opts)
    run = RunSettings.probing(targets, archs, opts.level, opts.flashinfer, opts.python, opts.allow_untested)
    decided = reconcile(targets, recipes, run, exclude=opts.exclude)
    plans = decided.plans
    common.say_arch(archs, arch_note, opts.as_json)
    killed = common.interrupted(targets)
    if killed and not opts.as_json:
        click.echo(killed, err=True)
    code = report(archs, targets, plans, opts.as_json, show_diff=not no_diff, ok_blocked=opts.ok_blocked, stat=stat,
                  extra={"interrupted": killed} if killed else None, actions=decided.actions)  # fmt: skip
    return EXIT_FAILED if killed else code


@click.command("apply", short_help=cli.summary("apply"))
@tree_options("spec", choice=True)
@click.option("--recipe", "only", multiple=True, metavar="ID", help="Apply only this recipe (repeatable).")
@click.option("--force", is_flag=True, help="Apply over uncommitted changes in a git target.")
@click.option("--commit", is_flag=True, help="On a git target, commit each recipe on branch sm120patch/<arch>.")
@wait_option
@allow_untested_option(ALLOW_UNTESTED)
@click.option("--diff", "show_diff", is_flag=True, help="Also print the unified diff of what was written.")
@click.option("--no-diff", "no_diff", is_flag=True, hidden=True, help="The default (kept for scripts that pass it).")
@bundle_option(
    "Apply this bundle (`sm120patch export -o DIR`) instead of the catalogue: its patches, byte for byte, "
    "through the journal and the probe. PATH defaults to what this Python imports; refused (exit 2) when "
    "its releases or bytes are not the bundle's."
)
def apply_cmd(
    opts: TreeOptions,
    only: tuple[str, ...],
    force: bool,
    commit: bool,
    wait_s: float,
    show_diff: bool,
    no_diff: bool,
    bundle_dir: Path | None,
) -> int:
    """Apply every applicable recipe to PATH whose kernels the probe proves: probe, then
    journal, then write. With an SGLang tree and a FlashInfer tree (two PATHs, or one
    site-packages), FlashInfer goes first and the SGLang probes judge it patched.

    A recipe whose probe does not find its kernels for every GPU arch is never written
    (`blocked`, exit 1). The journal (.sm120patch/ at the tree's root) records the
    original bytes and what each proof stood on, so `sm120patch rollback PATH` restores
    the bytes even after a crash or a kill, and a later run notices when the FlashInfer
    under an applied recipe changed: it probes again and rolls back what lost its
    kernels (`reverted`, exit 1).

    With --bundle DIR, the edits are the bundle's patches (an image build: `sm120patch
    apply --bundle DIR --arch sm_120`, no GPU needed); `rollback` and `status` work as after
    any apply.

    It prints what it did: a line per recipe, then each file written (lines added and
    removed, by which recipes). --diff adds the diff of what was written; `plan` shows
    the diff of what would be.
    """
    from sm120patch.engine.pipeline import RunSettings, apply_many

    if bundle_dir is not None:
        if only or opts.recipe_dir or opts.allow_untested or opts.package or opts.exclude:
            raise UserError(
                "--bundle applies the bundle's own recipes: leave out --recipe, --exclude, --recipes, --package, "
                "--allow-untested"
            )
        if opts.installed and opts.paths:
            raise UserError("give PATH or --installed, not both (without PATH, --bundle patches what Python imports)")
        return apply_bundle(bundle_dir, opts, force=force, commit=commit, wait_s=wait_s, no_diff=not show_diff)

    recipes, targets, archs, arch_note = common.inputs(opts, only)
    common.say_arch(archs, arch_note, opts.as_json)
    run = RunSettings.probing(targets, archs, opts.level, opts.flashinfer, opts.python, opts.allow_untested)
    done: list[Action] = []
    plans = apply_many(
        targets, recipes, run, force=force, commit=commit, wait_s=wait_s, only=only or None, exclude=opts.exclude,
        log=done,
    )  # fmt: skip
    extra = {"actions": [a.to_dict() for a in done]}  # what it carried out, in `plan`'s words
    code = report(archs, targets, plans, opts.as_json, show_diff=False, ok_blocked=opts.ok_blocked, extra=extra)
    if not opts.as_json:
        _print_written(plans, show_diff and not no_diff)
    return code


def _print_written(plans: Sequence[RecipePlan], show_diff: bool) -> None:
    """What this apply wrote, per file (`git diff --stat`'s figures, and the recipes behind each
    file); with `show_diff`, the diff of exactly those writes. A recipe left blocked, untested or
    failed wrote nothing, so none of its lines appear here (`plan` shows what it would write)."""
    from sm120patch.planning.diffs import colour, stat

    written = [p for p in plans if p.status == APPLIED and p.changes]
    files: dict[str, tuple[bytes, bytes, list[str]]] = {}
    for p in written:
        for rel, (before, after) in sorted(p.changes.items()):
            first, _, ids = files.get(rel, (before, after, []))
            files[rel] = (first, after, [*ids, p.recipe.id])
    if not files:
        click.echo("wrote nothing")
        return
    click.echo(f"wrote {len(files)} file(s):")
    width = max(len(rel) for rel in files)
    for rel, (before, after, ids) in sorted(files.items()):
        added, removed = stat(before.decode("utf-8"), after.decode("utf-8"))
        click.echo(f"  {rel:<{width}}  +{added} -{removed}  ({', '.join(ids)})")
    if show_diff:
        paint = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
        for p in written:
            click.echo("")
            click.echo(colour(p.diff()) if paint else p.diff(), nl=False)


@click.command("rollback", short_help=cli.summary("rollback"))
@tree_options(arch=False, recipes=False)
@click.option("--recipe", "ids", multiple=True, metavar="ID", help="Roll back only this recipe (repeatable).")
@click.option("--force", is_flag=True, help="Restore even files edited since apply (your version is kept).")
@wait_option
@recipes_option
@click.option("--python", "python", metavar="EXE", help="With --installed: the packages this interpreter imports.")
def rollback_cmd(opts: TreeOptions, ids: tuple[str, ...], force: bool, wait_s: float) -> int:
    """Restore the original bytes of every file sm120patch changed (or only --recipe ID's).

    Also finishes an apply that was killed midway, returning those files to their
    state before it. Refuses to overwrite a file you edited after apply unless --force.
    Rolling back a FlashInfer recipe first rolls back the SGLang recipes that were
    proven on it (in any tree, one site-packages too), and says so; SGLang trees go
    before FlashInfer ones.

    What pip changed since apply is seen, not fought: a recipe whose files pip put back
    at the release's bytes is `replaced-by-pip`, one applied to another version of the
    package `other-release`; both are retired (the journal only) and their recorded
    bytes are never written, not even with --force. Ctrl-C puts back what was written.
    """
    from sm120patch.engine.pipeline import rollback_many

    recipes = common.load_recipes(opts.recipe_dir)
    targets = targets_for(opts.paths, opts.installed, opts.package, opts.python)
    results = rollback_many(targets, recipes, ids=ids or None, force=force, wait_s=wait_s)
    if opts.as_json:
        emit_json({"targets": results})
        return EXIT_OK
    for r in results:
        t = r["target"]
        if r.get("because"):
            click.echo(f"{t['package']} at {t['root']}: rolled back too, {r['because']}")
        for x in r.get("retired", []):
            click.echo(f"{t['package']} at {t['root']}: {x['state']:<15} {x['id']}: {x['why']}")
        if not r["rolled_back"] and not r["recovered"] and not r.get("retired"):
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
    return EXIT_OK


@click.command("status", short_help=cli.summary("status"))
@tree_options("static")
def status_cmd(opts: TreeOptions) -> int:
    """What sm120patch has applied to PATH, which files changed since, and whether each
    recipe's proof still holds for the FlashInfer in front of it (default: the one it was
    proven against; --flashinfer/--python to name another).

    Exit 1 when a file changed since apply, an apply was interrupted, or a recipe is
    stale (its kernels are gone: the line gives the rollback command).
    """
    from sm120patch.engine import tree as engine

    targets = targets_for(opts.paths, opts.installed, opts.package, opts.python)
    recipes = common.load_recipes(opts.recipe_dir)
    archs = _status_archs(targets, opts.arch)
    probe = common.make_tree_probe(targets, archs, opts.level, opts.flashinfer, opts.python) if archs else None
    results = [{"target": t.to_dict(), **engine.status(t, recipes, probe)} for t in targets]
    from sm120patch.verify import record  # verify's verdicts, kept beside the journal (no httpx)

    for t, r in zip(targets, results, strict=True):
        r["verify"] = record.read(t.root)
    bad = any(
        r["interrupted"]
        or r["stale"]
        or r["retire"]
        or r["damaged"]
        or r["legacy"]
        or any(f["state"] != "as-applied" for f in r["files"])
        for r in results
    )
    if opts.as_json:
        emit_json({"targets": results})
        return EXIT_FAILED if bad else EXIT_OK
    for r in results:
        t = r["target"]
        click.echo(f"{t['package']} {t['version']} at {t['root']}")
        if r["interrupted"]:
            click.echo(
                f"  an apply was interrupted while writing {', '.join(r['interrupted'])}: "
                f"run `{rollback_command(t['root'])}`"
            )
        if r["damaged"]:
            click.echo(f"  DAMAGED JOURNAL: {r['damaged']}")
        if r["legacy"]:
            click.echo(f"  note: {r['legacy']}")
        if not r["applied"]:
            click.echo("  nothing applied")
        for a in r["applied"]:
            check = a.get("recheck") or {}
            word = "STALE   " if check.get("holds") is False else "applied "
            if a.get("state", APPLIED) != APPLIED:
                word = a["state"]
            click.echo(f"  {word} {a['id']}  ({a['arch']}, {a['at']})")
            if a.get("why"):
                click.echo(f"           {a['why']}: `{apply_command(t['root'])}` plans this release afresh")
            if check.get("reason"):
                click.echo(f"           {check['reason']}")
            if a.get("rollback"):
                click.echo(f"           run `{a['rollback']}` before the next server start")
        for f in r["files"]:
            mark = "" if f["state"] == "as-applied" else f"  <- {f['state']}"
            click.echo(f"    {f['path']}{mark}")
        for line in record.status_lines(r["verify"], [a["id"] for a in r["applied"]]):
            click.echo(f"  {line}")
    return EXIT_FAILED if bad else EXIT_OK


def _status_archs(targets: Sequence[Target], given: tuple[str, ...]) -> list[Arch]:
    """--arch, else the archs the applied recipes were proven for (a status check re-asks the
    same question of the FlashInfer now present)."""
    from sm120patch.arch import parse_arch
    from sm120patch.engine.journal import Journal

    if given:
        return resolve_archs(given)[0]
    names = {n for t in targets for a in Journal.open(t.root).entries(t.package) for n in a.archs}
    return sorted({parse_arch(n) for n in names})


@click.command("clone", short_help=cli.summary("clone"))
@click.argument("source", metavar="URL[@REF]")
@click.argument("dest", type=click.Path(path_type=Path))
@tree_options(targets=False, arch=False, recipes=False)
def clone_cmd(opts: TreeOptions, source: str, dest: Path) -> int:
    """Make a fresh clone to patch: `sm120patch clone https://github.com/sgl-project/sglang@v0.5.9 sglang`."""
    from sm120patch.gitops import clone

    info = clone(source, dest)
    if opts.as_json:
        emit_json(info)
    else:
        click.echo(f"cloned {info['url']} at {info['ref'] or 'default branch'} ({info['commit'][:12]}) into {dest}")
        click.echo(f"next: sm120patch plan {dest}")
    return EXIT_OK
