"""The `sm120patch` command: a thin click layer over plain functions.

Exit codes (stable, documented in README):
  0  done, including "nothing to do"
  1  a recipe failed, was blocked by its probe, or was reverted
  2  bad input or usage; nothing was written
  3  an internal error (a bug: please report it with SM120PATCH_DEBUG=1 output)
  130 interrupted (Ctrl-C)
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from sm120patch import __version__
from sm120patch.arch import DEFAULT, KNOWN, Arch
from sm120patch.commands_triage import diagnose_cmd, guard_cmd
from sm120patch.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, UserError
from sm120patch.gatekeeper import PROBE_LEVELS, make_probe, resolve_archs, resolve_flashinfer
from sm120patch.plan import BLOCKED, FAILED, REVERTED
from sm120patch.targets import discover, installed

if TYPE_CHECKING:  # `--help` and usage errors must not pay for packaging/tomllib/libcst
    from sm120patch.plan import RecipePlan
    from sm120patch.recipes import Recipe
    from sm120patch.targets import Target

EXIT_INTERNAL = 3
_STATUS_COLOUR = {
    "applicable": "yellow",
    "satisfied": "green",
    "not-applicable": "bright_black",
    "blocked": "red",
    "applied": "cyan",
    "reverted": "magenta",
    "failed": "red",
}


def load_recipes(directory: Path | None = None) -> list[Recipe]:
    """`recipes.load_recipes`, imported on first use (packaging, tomllib and the transforms)."""
    from sm120patch.recipes import load_recipes as load

    return load(directory)


# --- shared options -------------------------------------------------------------------------


def _arch_option(f: Any) -> Any:
    return click.option(
        "--arch",
        "arch",
        multiple=True,
        metavar="ARCH",
        help=f"GPU architecture to plan for ({', '.join(KNOWN)}); repeat for mixed GPUs. "
        f"Default: the GPUs NVML/nvidia-smi see, else {DEFAULT}.",
    )(f)


def _probe_options(default: str) -> Any:
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


def _target_options(f: Any) -> Any:
    f = click.option(
        "--installed", is_flag=True, help="Use the copy the current Python imports (found without importing it)."
    )(f)
    f = click.option(
        "--package", type=click.Choice(["sglang", "flashinfer"]), help="Only this package, when PATH holds several."
    )(f)
    return click.argument("path", required=False, type=click.Path(path_type=Path))(f)


_json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
_recipes_option = click.option(
    "--recipes",
    "recipe_dir",
    type=click.Path(path_type=Path),
    metavar="DIR",
    help="Recipe folder (default: the built-in catalogue, or $SM120PATCH_RECIPES).",
)


def _targets(path: Path | None, installed_flag: bool, package: str | None) -> list[Target]:
    if installed_flag:
        if path is not None:
            raise UserError("give PATH or --installed, not both")
        return [installed(package or "sglang")]
    if path is None:
        raise UserError("missing PATH: give the folder of an SGLang/FlashInfer clone or install, or --installed")
    return discover(path, package)


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _report(
    archs: Sequence[Arch],
    targets: Sequence[Target],
    plans: Sequence[RecipePlan],
    as_json: bool,
    show_diff: bool,
    extra: dict[str, Any] | None = None,
) -> int:
    if as_json:
        _emit_json(
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
                status = click.style(status, fg=_STATUS_COLOUR.get(p.status))
            click.echo(f"  {status} {p.recipe.id:<{width}}  {p.reason}")
        if show_diff:
            from sm120patch.diffs import colour as paint

            for p in plans:
                d = p.diff()
                if d:
                    click.echo("")
                    click.echo(paint(d) if colour else d, nl=False)
    return EXIT_FAILED if any(p.status in (FAILED, BLOCKED, REVERTED) for p in plans) else EXIT_OK


# --- commands ----------------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="sm120patch")
def cli() -> None:
    """Open SGLang/FlashInfer fast paths that are gated to SM90/SM100 on SM120/SM121 GPUs
    (RTX PRO 6000, RTX 5090, DGX Spark), only where the kernels behind them exist,
    and undo every change byte for byte.

    \b
    Typical session:
      sm120patch recipes                      what can be opened, and why
      sm120patch plan ~/src/sglang            dry run: statuses and diffs, nothing written
      sm120patch apply ~/src/sglang           write, probe, revert what the probe rejects
      sm120patch status ~/src/sglang          what is applied, what changed since
      sm120patch rollback ~/src/sglang        restore the original bytes

    PATH is a git clone (python/sglang/), an unpacked wheel or site-packages
    (sglang/), or the package folder itself; --installed finds the copy Python imports.

    \b
    Exit codes: 0 done (also "nothing to do"), 1 a recipe failed, was blocked or
    reverted, 2 bad input or usage (nothing written), 3 internal error, 130 Ctrl-C.
    """


@cli.command("recipes")
@_recipes_option
@_json_option
def recipes_cmd(recipe_dir: Path | None, as_json: bool) -> None:
    """List the recipe catalogue: what each opens, for which versions and GPUs, and why."""
    recipes = load_recipes(recipe_dir)
    if as_json:
        _emit_json({"recipes": [_recipe_dict(r) for r in recipes]})
        return
    for r in recipes:
        click.echo(f"{r.id}  ({r.package} {r.versions}; {', '.join(a.name for a in r.arch)})")
        click.echo(f"  {r.title}")
        for line in r.why.splitlines():
            click.echo(f"    {line}")
        if r.needs:
            click.echo(f"  needs: {', '.join(r.needs)}")
        click.echo(f"  edits: {', '.join(e.name for e in r.edits)}")
        click.echo("")


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


@cli.command("plan")
@_target_options
@_arch_option
@_probe_options("static")
@_recipes_option
@click.option("--no-diff", is_flag=True, help="Statuses only.")
@_json_option
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

    recipes = load_recipes(recipe_dir)
    targets = _targets(path, installed, package)
    archs, arch_note = resolve_archs(arch)
    probe = _probe(targets, archs, level, flashinfer, python)
    plans = [p for t in targets for p in make_plan(t, recipes, archs, probe=probe)]
    if arch_note != "--arch" and not as_json:
        click.echo(f"arch: {', '.join(a.name for a in archs)} ({arch_note})", err=True)
    sys.exit(_report(archs, targets, plans, as_json, show_diff=not no_diff))


@cli.command("apply")
@_target_options
@_arch_option
@_probe_options("spec")
@_recipes_option
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
@_json_option
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

    recipes = load_recipes(recipe_dir)
    unknown = [i for i in only if i not in {r.id for r in recipes}]
    if unknown:
        raise UserError(f"--recipe {', '.join(unknown)}: no such recipe; see `sm120patch recipes`")
    targets = _targets(path, installed, package)
    archs, arch_note = resolve_archs(arch)
    if arch_note != "--arch" and not as_json:
        click.echo(f"arch: {', '.join(a.name for a in archs)} ({arch_note})", err=True)
    probe = _probe(targets, archs, level, flashinfer, python)
    plans = [
        p
        for t in targets
        for p in engine.apply(
            t, recipes, archs, probe=probe, force=force, commit=commit, wait_s=wait_s, only=only or None
        )
    ]
    sys.exit(_report(archs, targets, plans, as_json, show_diff=not no_diff))


def _probe(
    targets: Sequence[Target], archs: Sequence[Arch], level: str, flashinfer: Path | None, python: str | None
) -> Any:
    if level == "none":
        return None
    return make_probe(archs, resolve_flashinfer(targets, flashinfer, python), level)


@cli.command("probe")
@click.argument("kernels", nargs=-1, metavar="KERNEL...")
@_arch_option
@_probe_options("spec")
@_json_option
def probe_cmd(
    kernels: tuple[str, ...],
    arch: tuple[str, ...],
    level: str,
    flashinfer: Path | None,
    python: str | None,
    as_json: bool,
) -> None:
    """Climb the probe ladder for kernels (default: every kernel in the catalogue).

    \b
    sm120patch probe flashinfer:trtllm_comm --arch sm_120
    sm120patch probe flashinfer:norm --probe run        (on the GPU box)
    """
    from sm120patch.kernels import load_kernels
    from sm120patch.probes import ProbeCache, probe_kernel

    catalogue = load_kernels()
    names = list(kernels) or sorted(catalogue)
    unknown = [k for k in names if k not in catalogue]
    if unknown:
        raise UserError(f"{', '.join(unknown)}: not in the kernel catalogue; known: {', '.join(sorted(catalogue))}")
    if level == "none":
        raise UserError("--probe none probes nothing; pick a rung: static, artifact, spec, build or run")
    archs, arch_note = resolve_archs(arch)
    fi = resolve_flashinfer([], flashinfer, python)
    if not fi.found:
        raise UserError(f"no FlashInfer to probe ({fi.error}); pass --flashinfer PATH or --python EXE")
    cache = ProbeCache()
    verdicts = [probe_kernel(k, a, fi, level, cache) for k in names for a in archs]
    if as_json:
        _emit_json(
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
            click.echo(f"  {v.result:<8} {v.kernel:<36} {v.arch:<7} {v.rung:<9} {v.elapsed_s:6.2f}s  {v.reason}")
    sys.exit(EXIT_OK if all(v.result == "pass" for v in verdicts) else EXIT_FAILED)


@cli.command("preflight")
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--package", type=click.Choice(["sglang", "flashinfer"]), help="Only this package.")
@_arch_option
@_probe_options("spec")
@_recipes_option
@click.option("--no-torch", is_flag=True, help="Skip asking torch (in a subprocess) for its CUDA and arch list.")
@_json_option
def preflight_cmd(
    path: Path | None,
    package: str | None,
    arch: tuple[str, ...],
    level: str,
    flashinfer: Path | None,
    python: str | None,
    recipe_dir: Path | None,
    no_torch: bool,
    as_json: bool,
) -> None:
    """What will sm120patch do on this box? GPUs, driver, CUDA, torch, the SGLang and
    FlashInfer it would patch and probe, and per recipe: status, probe verdict, rung, advice.

    PATH defaults to the SGLang installed for --python (or this interpreter). Works
    without a GPU: `sm120patch preflight --arch sm_120`.
    """
    from sm120patch.preflight import preflight, render

    recipes = load_recipes(recipe_dir)
    targets = [_installed_for(python, package or "sglang")] if path is None else discover(path, package)
    archs, arch_note = resolve_archs(arch)
    fi = resolve_flashinfer(targets, flashinfer, python)
    report = preflight(targets, recipes, archs, arch_note, fi, level, with_torch=not no_torch, python=python)
    if as_json:
        _emit_json(report)
    else:
        click.echo(render(report))
    blocked = any(r["status"] in (BLOCKED, FAILED) for r in report["recipes"])
    sys.exit(EXIT_FAILED if blocked else EXIT_OK)


def _installed_for(python: str | None, package: str) -> Target:
    """The package `python` imports (this interpreter by default), located without importing it."""
    if python is None:
        return installed(package)
    import subprocess

    code = f"import importlib.util as u; s = u.find_spec({package!r}); print(list(s.submodule_search_locations)[0])"
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise UserError(f"{python}: {package} is not installed there; give PATH or another --python")
    pkg = Path(r.stdout.strip().splitlines()[-1])
    return discover(pkg.parent, package)[0]


@cli.command("rollback")
@_target_options
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
@_recipes_option
@_json_option
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

    recipes = load_recipes(recipe_dir)
    targets = _targets(path, installed, package)
    results = [
        {"target": t.to_dict(), **engine.rollback(t, recipes, ids=ids or None, force=force, wait_s=wait_s)}
        for t in targets
    ]
    if as_json:
        _emit_json({"targets": results})
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


@cli.command("status")
@_target_options
@_json_option
def status_cmd(path: Path | None, installed: bool, package: str | None, as_json: bool) -> None:
    """What sm120patch has applied to PATH, and which files changed since."""
    from sm120patch import engine

    targets = _targets(path, installed, package)
    results = [{"target": t.to_dict(), **engine.status(t)} for t in targets]
    if as_json:
        _emit_json({"targets": results})
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


@cli.command("clone")
@click.argument("source", metavar="URL[@REF]")
@click.argument("dest", type=click.Path(path_type=Path))
@_json_option
def clone_cmd(source: str, dest: Path, as_json: bool) -> None:
    """Make a fresh clone to patch: `sm120patch clone https://github.com/sgl-project/sglang@v0.5.9 sglang`."""
    from sm120patch.gitops import clone

    info = clone(source, dest)
    if as_json:
        _emit_json(info)
    else:
        click.echo(f"cloned {info['url']} at {info['ref'] or 'default branch'} ({info['commit'][:12]}) into {dest}")
        click.echo(f"next: sm120patch plan {dest}")


cli.add_command(diagnose_cmd)
cli.add_command(guard_cmd)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: user mistakes end in one line and exit 2, never a traceback."""
    try:
        cli.main(args=list(argv) if argv is not None else None, prog_name="sm120patch", standalone_mode=False)
    except UserError as e:
        # names from recipes or journals may hold control characters: keep the error one line
        msg = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(e))
        click.echo(f"sm120patch: error: {msg}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("sm120patch: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as e:
        e.show()
        sys.exit(EXIT_USAGE if e.exit_code == 2 else e.exit_code)
    except KeyboardInterrupt:
        click.echo("sm120patch: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except SystemExit:
        raise
    except BaseException as e:  # a bug, not the user's fault
        if os.environ.get("SM120PATCH_DEBUG"):
            raise
        click.echo(
            f"sm120patch: internal error: {type(e).__name__}: {e} (rerun with SM120PATCH_DEBUG=1 and report it)",
            err=True,
        )
        sys.exit(EXIT_INTERNAL)
    sys.exit(EXIT_OK)
