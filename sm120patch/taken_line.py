"""The taken line, read back: `sm120patch: <recipe-id> taken`, which patched code logs once per
process the first time a recipe's gate is taken (sm120patch/planning/taken.py writes the helper).

One parser for verify (a recipe whose line never appears was not exercised by the workload),
diagnose and guard (the last gate taken before a crash). The line may sit inside a logger's
prefix (`[2026-12-02 10:00:00 TP0] sm120patch: <id> taken`) and may appear twice per process
(the logger and stderr both reach the log) and once per process of a multi-process server.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# the id as recipes spell it (lowercase, digits, dashes), then " taken" ending the line
TAKEN_RE = re.compile(r"(?:^|[\s\]:|>)])sm120patch: ([a-z0-9][a-z0-9-]*[a-z0-9]) taken\s*$")


def taken_id(line: str) -> str | None:
    """The recipe id a log line says was taken, else None."""
    m = TAKEN_RE.search(line.rstrip("\r\n"))
    return m.group(1) if m else None


def taken_ids(lines: Iterable[str]) -> list[str]:
    """Every recipe id taken in `lines`, each once, in the order each was first taken."""
    seen: dict[str, None] = {}
    for line in lines:
        rid = taken_id(line)
        if rid is not None:
            seen.setdefault(rid, None)
    return list(seen)


def taken_in_text(text: str) -> list[str]:
    return taken_ids(text.splitlines())


def taken_positions(lines: Iterable[str]) -> list[tuple[int, str]]:
    """(0-based line number, recipe id) of every taken line, in log order (repeats kept)."""
    return [(i, rid) for i, line in enumerate(lines) if (rid := taken_id(line)) is not None]


def taken_before(lines: list[str], index: int) -> list[str]:
    """The recipes taken on lines before `index` (a crash's first line), each once, in order."""
    return taken_ids(lines[:index])
