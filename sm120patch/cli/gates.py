"""`sm120patch gates PATH [PATH2]`: every architecture gate in a release, and what changed since the last.

The logic is sm120patch/gates/; this is only the command: which trees, which FlashInfer, which form.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from sm120patch import cli
from sm120patch.cli.common import emit_json, load_recipes
from sm120patch.errors import EXIT_OK, UserError

if TYPE_CHECKING:
    from sm120patch.gates import GateMap
    from sm120patch.planning.targets import Target
    from sm120patch.probes.environment.flashinfer import FlashInferEnv


def _target(path: Path, package: str | None) -> tuple[Target, Target | None]:
    """The tree to map (SGLang when PATH holds both) and a FlashInfer found in PATH, if any."""
    from sm120patch.planning.targets import discover

    found = discover(path, package)
    sglang = [t for t in found if t.package == "sglang"]
    fi = [t for t in found if t.package == "flashinfer"]
    return (sglang or fi)[0], (fi[0] if fi else None)


def _flashinfer(given: Path | None, target: Target, fi_target: Target | None) -> FlashInferEnv | None:
    """--flashinfer; else a FlashInfer in PATH or next to the tree; else none (the kernels stay unknown)."""
    from sm120patch.probes.environment import flashinfer as flashinfer_env

    if given is not None:
        return flashinfer_env.from_tree(given)
    if fi_target is not None:
        return flashinfer_env.from_tree(fi_target.package_dir)
    if target.package == "flashinfer":
        return flashinfer_env.from_tree(target.package_dir)
    sibling = target.package_dir.parent / "flashinfer"
    if (sibling / "__init__.py").is_file():
        return flashinfer_env.from_tree(sibling)
    return None


def _map(path: Path, package: str | None, flashinfer: Path | None, recipe_dir: Path | None) -> GateMap:
    from sm120patch.catalogue.kernels import load_kernels
    from sm120patch.gates import gate_map

    target, fi_target = _target(path, package)
    fi = _flashinfer(flashinfer, target, fi_target)
    return gate_map(target, load_recipes(recipe_dir), load_kernels(), fi)


@click.command("gates", short_help=cli.summary("gates"))
@click.argument("path", type=click.Path(path_type=Path))
@click.argument("path2", required=False, type=click.Path(path_type=Path))
@click.option(
    "--flashinfer",
    type=click.Path(path_type=Path),
    metavar="FI",
    help="FlashInfer tree whose kernels decide which shut gates are candidates "
    "(default: one in PATH or next to it; else those stay unknown).",
)
@click.option("--package", type=click.Choice(["sglang", "flashinfer"]), help="Only this package, when PATH holds both.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (shape: docs/gates.md).")
@click.option("--markdown", "as_markdown", is_flag=True, help="Markdown tables, for a tracking issue.")
@click.option("--all", "show_all", is_flag=True, help="Text: list every site, not the first 25 of each long group.")
@click.option("--recipes", "recipe_dir", type=click.Path(path_type=Path), metavar="DIR", help="Recipe folder.")
def gates_cmd(
    path: Path,
    path2: Path | None,
    flashinfer: Path | None,
    package: str | None,
    as_json: bool,
    as_markdown: bool,
    show_all: bool,
    recipe_dir: Path | None,
) -> int:
    """Every architecture gate in the release at PATH: where it is, the test as written, which
    GPUs it admits, and what it is for SM12x (covered by a recipe, open, a candidate whose
    kernels FlashInfer has, rightly shut, unknown), candidates first.

    With PATH2 (a newer release): the sites added, removed and moved since PATH, and whether
    each recipe's sites moved. Nothing is written. Exit 0 done; 2 bad input.
    """
    from sm120patch.gates import render

    if as_json and as_markdown:
        raise UserError("--json and --markdown: give one of them")
    old = _map(path, package, flashinfer, recipe_dir)
    if path2 is None:
        if as_json:
            emit_json(old.to_dict())
        elif as_markdown:
            click.echo(render.markdown(old))
        else:
            click.echo(render.text(old, None if show_all else 25))
        return EXIT_OK
    from sm120patch.gates.diff import diff_sites, recipe_moves

    new = _map(path2, package or old.target.package, flashinfer, recipe_dir)
    if new.target.package != old.target.package:
        raise UserError(
            f"{path2}: holds {new.target.package}, {path} holds {old.target.package}; compare like with like"
        )
    d = diff_sites(old.sites, new.sites)
    d.recipes = recipe_moves(old.recipes, new.recipes)
    if as_json:
        emit_json(render.diff_dict(old, new, d))
    elif as_markdown:
        click.echo(render.diff_markdown(old, new, d))
    else:
        click.echo(render.diff_text(old, new, d))
    return EXIT_OK
