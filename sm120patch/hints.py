"""The sm120patch commands the tool tells users to run, built and shell-quoted in one place, so
that a path with a space (or a recipe id from a hand-edited journal) still gives a command that
works when pasted."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path


def rollback_command(where: Path | str, recipes: Sequence[str] = ()) -> str:
    """`sm120patch rollback WHERE [--recipe ID ...]`, every argument quoted for a POSIX shell."""
    args = ["sm120patch", "rollback", str(where)]
    for rid in recipes:
        args += ["--recipe", rid]
    return shlex.join(args)


def apply_command(*paths: Path | str, flags: Sequence[str] = ()) -> str:
    """`sm120patch apply PATH... [FLAGS]`, quoted the same way."""
    return shlex.join(["sm120patch", "apply", *map(str, paths), *flags])


def git_reverse_command(where: Path | str, patches: Sequence[Path | str], directory: str | None = None) -> str:
    """`cd WHERE && git apply -R [--directory=DIR] PATCH && ...` (patches in the order given),
    each argument quoted, for a tree patched with git that no journal records."""
    flags = [f"--directory={directory}"] if directory else []
    steps = [shlex.join(["git", "apply", "-R", *flags, str(p)]) for p in patches]
    return " && ".join([shlex.join(["cd", str(where)]), *steps])
