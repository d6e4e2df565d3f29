"""Unified diffs that `git apply` accepts, including files without a final newline."""

from __future__ import annotations

import difflib

NO_EOL = "\\ No newline at end of file\n"


def unified(rel: str, before: str, after: str) -> str:
    """A git-style diff of one file; difflib alone drops the no-final-newline marker."""
    a, b = _lines(before), _lines(after)
    out = [f"diff --git a/{rel} b/{rel}\n"]
    for line in difflib.unified_diff(a, b, f"a/{rel}", f"b/{rel}", n=3):
        if line.endswith("\n"):
            out.append(line)
        else:  # the last line of a file that has no final newline
            out.append(line + "\n" + NO_EOL)
    return "".join(out) if len(out) > 1 else ""


def stat(before: str, after: str) -> tuple[int, int]:
    """Lines added and removed, as `git diff --stat` counts them."""
    added = removed = 0
    for line in difflib.unified_diff(_lines(before), _lines(after), n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return added, removed


def _lines(text: str) -> list[str]:
    """Split at \n only, as git does: str.splitlines() also breaks at \f, \x1c, \u2028..."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def colour(diff: str) -> str:
    """ANSI colours for a terminal; callers decide whether stdout is one."""
    lines = []
    for line in diff.splitlines(keepends=True):
        if line.startswith(("+++", "---", "diff --git")):
            lines.append(f"\x1b[1m{line.rstrip(chr(10))}\x1b[0m\n")
        elif line.startswith("@@"):
            lines.append(f"\x1b[36m{line.rstrip(chr(10))}\x1b[0m\n")
        elif line.startswith("+"):
            lines.append(f"\x1b[32m{line.rstrip(chr(10))}\x1b[0m\n")
        elif line.startswith("-"):
            lines.append(f"\x1b[31m{line.rstrip(chr(10))}\x1b[0m\n")
        else:
            lines.append(line)
    return "".join(lines)
