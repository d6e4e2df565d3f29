"""The options the tree commands share, parsed once into one frozen `TreeOptions`.

`plan`, `apply`, `status`, `rollback`, `export`, `verify`, `preflight`, `probe` and `recipes` take
the same PATH/--installed/--package, --arch, --probe/--flashinfer/--python, --recipes,
--exclude/--ok-blocked and --json. `@tree_options(...)` declares the ones a command takes, in one
order (they come before the command's own options; --exclude, --ok-blocked and --json after), and
hands the command one `TreeOptions` as its first argument instead of a dozen parameters. A command
that declares its own option under a field's name (rollback's --python, preflight's --package,
--allow-untested) gets it in the `TreeOptions` too.

Kept light (click and dataclasses): `CMD --help` imports this, not the planner.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import click

from sm120patch.arch import DEFAULT, KNOWN
from sm120patch.probes.rungs import LEVELS as PROBE_LEVELS


@dataclass(frozen=True)
class TreeOptions:
    """What a tree command was asked, before anything is read: which trees, GPUs, rung and recipes."""

    paths: tuple[Path, ...] = ()
    installed: bool = False
    package: str | None = None
    arch: tuple[str, ...] = ()
    level: str = "none"  # --probe; a command without the option probes nothing
    probe_given: bool = False  # --probe was on the command line (a bundle's own rung yields to it)
    flashinfer: Path | None = None
    python: str | None = None
    recipe_dir: Path | None = None
    allow_untested: bool = False
    exclude: tuple[str, ...] = ()
    ok_blocked: bool = False
    as_json: bool = False


_FIELDS = frozenset(f.name for f in fields(TreeOptions)) - {"probe_given"}


def _target_params() -> list[click.Parameter]:
    return [
        click.Argument(["paths"], nargs=-1, type=click.Path(path_type=Path), metavar="[PATH]..."),
        click.Option(
            ["--package"],
            type=click.Choice(["sglang", "flashinfer"]),
            help="Only this package, when PATH holds several.",
        ),
        click.Option(
            ["--installed"],
            is_flag=True,
            help="Use the SGLang and FlashInfer the current Python imports (found without importing them).",
        ),
    ]


def _arch_params() -> list[click.Parameter]:
    return [
        click.Option(
            ["--arch", "arch"],
            multiple=True,
            metavar="ARCH",
            help=f"GPU architecture to plan for ({', '.join(KNOWN)}); repeat for mixed GPUs. "
            f"Default: the GPUs NVML/nvidia-smi see, else {DEFAULT}.",
        )
    ]


def _probe_params(default: str) -> list[click.Parameter]:
    return [
        click.Option(
            ["--python", "python"], metavar="EXE", help="Interpreter of the server's environment (default: this one)."
        ),
        click.Option(
            ["--flashinfer", "flashinfer"],
            type=click.Path(path_type=Path),
            metavar="PATH",
            help="FlashInfer tree to probe (default: next to the target, else what --python imports).",
        ),
        click.Option(
            ["--probe", "--probe-level", "level"],
            type=click.Choice(PROBE_LEVELS),
            default=default,
            show_default=True,
            help="How far up the probe ladder to check that a recipe's kernels exist: static (read "
            "FlashInfer's source), artifact (prebuilt cubins), spec (ask FlashInfer, no GPU), build "
            "(nvcc), run (GPU). 'none' skips the check.",
        ),
    ]


_RECIPES: dict[str, Any] = {
    "type": click.Path(path_type=Path),
    "metavar": "DIR",
    "help": "Recipe folder (default: the built-in catalogue, or $SM120PATCH_RECIPES).",
}


def _recipes_params() -> list[click.Parameter]:
    return [click.Option(["--recipes", "recipe_dir"], **_RECIPES)]


def recipes_option(f: Any) -> Any:
    """--recipes where a command lists it among its own options (rollback)."""
    return click.option("--recipes", "recipe_dir", **_RECIPES)(f)


def _choice_params() -> list[click.Parameter]:
    """--exclude and --ok-blocked: what an image build needs to run `apply` without `|| true`."""
    return [
        click.Option(
            ["--exclude", "exclude"],
            multiple=True,
            metavar="ID",
            help="Leave this recipe out (repeatable): not probed, not written, reported as `excluded`.",
        ),
        click.Option(
            ["--ok-blocked"],
            is_flag=True,
            help="Exit 0 although recipes are `blocked` (their probe did not find the kernels, so their gate "
            "stays shut: a safe outcome). Failed, stale, reverted and untested recipes still exit 1.",
        ),
    ]


def _json_params() -> list[click.Parameter]:
    return [click.Option(["--json", "as_json"], is_flag=True, help="Machine-readable output on stdout.")]


def tree_options(
    probe: str | None = None,
    *,
    targets: bool = True,
    arch: bool = True,
    recipes: bool = True,
    choice: bool = False,
    json: bool = True,
) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Declare the shared options (`probe`: the --probe default; None: no probe options) and pass
    the command a `TreeOptions` built from them as its first argument."""
    head = [
        *(_target_params() if targets else []),
        *(_arch_params() if arch else []),
        *(_probe_params(probe) if probe else []),
        *(_recipes_params() if recipes else []),
    ]
    tail = [*(_choice_params() if choice else []), *(_json_params() if json else [])]

    def deco(f: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(f)
        def command(*args: Any, **kw: Any) -> int:
            given = {k: kw.pop(k) for k in _FIELDS & kw.keys()}
            if "level" in given:
                source = click.get_current_context().get_parameter_source("level")
                given["probe_given"] = source is not None and source.name != "DEFAULT"
            return f(TreeOptions(**given), *args, **kw)

        # click lists a command's parameters in the reverse order the decorators attached them: the
        # shared head goes first, the command's own options (decorated below this) next, the tail last
        own = getattr(f, "__click_params__", [])
        command.__click_params__ = [*reversed(tail), *own, *reversed(head)]  # type: ignore[attr-defined]
        return command

    return deco


def allow_untested_option(text: str) -> Callable[[Any], Any]:
    """--allow-untested, with the command's own words for it (its value lands in TreeOptions)."""
    return click.option("--allow-untested", is_flag=True, help=text)


ALLOW_UNTESTED = "Also plan/apply recipes on releases newer than the newest they were tested on (status `untested`)."

wait_option = click.option(
    "--wait",
    "wait_s",
    type=float,
    default=0.0,
    metavar="SECONDS",
    help="Wait this long for another run on the same tree to finish.",
)


def bundle_option(what: str) -> Callable[[Any], Any]:
    return click.option("--bundle", "bundle_dir", type=click.Path(path_type=Path), metavar="DIR", help=what)
