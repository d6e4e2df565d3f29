"""Known workarounds for one library's SM12x failures (patches/workarounds.toml: each row with the thread that
settled it), added to a fatal finding whose lines and traceback name the library and show the row's cue.

The rows are data a reviewer checks against their sources; this module only loads them strictly and matches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sm120patch.catalogue.datafile import fail, read_toml
from sm120patch.catalogue.recipes import default_recipe_dir
from sm120patch.triage.diagnose import Diagnosis, Finding

FILE_NAME = "workarounds.toml"
KEYS = ("id", "libraries", "cue", "advice", "source")


@dataclass(frozen=True)
class Workaround:
    id: str
    libraries: tuple[str, ...]
    cue: re.Pattern[str]
    advice: str
    source: str

    def applies(self, text: str, low: str) -> bool:
        """The text names one of the libraries (any, for none) and shows the cue."""
        return (not self.libraries or any(lib in low for lib in self.libraries)) and bool(self.cue.search(text))


def load(path: Path | None = None) -> list[Workaround]:
    """Every row; a missing or unknown key, a cue that does not compile, a non-https source or an id given twice
    is a broken table (RecipeError, one line naming the file and the row)."""
    path = path or default_recipe_dir() / FILE_NAME
    data = read_toml(path, path.read_bytes(), "the workarounds table")
    if set(data) - {"workaround"}:
        raise fail(path, sorted(set(data) - {"workaround"})[0], "unknown table", "the file holds [[workaround]] rows")
    out: list[Workaround] = []
    for i, row in enumerate(data.get("workaround", [])):
        where = f"workaround[{i}]"
        if not isinstance(row, dict) or set(row) != set(KEYS):
            got = sorted(row) if isinstance(row, dict) else row
            raise fail(path, where, f"keys {got!r}", f"give exactly {', '.join(KEYS)}")
        libs = row["libraries"]
        if not isinstance(libs, list) or not all(isinstance(x, str) and x.strip() for x in libs):
            raise fail(path, f"{where}.libraries", repr(libs), "give a list of lower-case names ([] for any library)")
        for key in ("id", "cue", "advice", "source"):
            if not isinstance(row[key], str) or not row[key].strip():
                raise fail(path, f"{where}.{key}", repr(row[key]), "give a non-empty string")
        if not row["source"].startswith("https://"):
            raise fail(path, f"{where}.source", repr(row["source"]), "give the https URL the workaround is from")
        if any(w.id == row["id"] for w in out):
            raise fail(path, f"{where}.id", repr(row["id"]), "give each row its own id")
        try:
            cue = re.compile(row["cue"], re.I)
        except re.error as e:
            raise fail(path, f"{where}.cue", f"not a regular expression ({e})", "fix the pattern") from None
        out.append(Workaround(row["id"], tuple(x.lower() for x in libs), cue, row["advice"], row["source"]))
    return out


def finding_text(f: Finding, around: list[str]) -> str:
    """What a row is matched against: the finding's line, its details, the error lines near it, its traceback and
    the lines just after it (where cuda-gdb names the faulting kernel)."""
    return "\n".join([f.line, *f.details.values(), *around, *f.context, *f.after])


def add_workarounds(result: Diagnosis, table: list[Workaround] | None = None) -> None:
    """A note on each fatal finding per row that applies: the advice, then its source."""
    if not result.causes:
        return
    table = load() if table is None else table
    around = [e.line for e in result.unnamed_errors]
    for f in result.causes:
        text = finding_text(f, around)
        low = text.lower()
        for row in table:
            note = f"{row.advice} ({row.source})"
            if row.applies(text, low) and note not in f.notes:
                f.notes.append(note)
