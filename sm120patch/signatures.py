"""The catalogue of known SM12x crash signatures (patches/signatures.toml), validated strictly.

Signatures are data, like recipes: a typo in the catalogue must fail loudly with
one line naming the file and the key, never turn into a pattern that silently
matches nothing. Regexes are compiled once at load time.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120patch.datafile import check_table, fail, read_toml
from sm120patch.errors import RecipeError
from sm120patch.recipes import default_recipe_dir

FILE_NAME = "signatures.toml"
_ID_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_KEYS: dict[str, type] = {
    "id": str,
    "regex": str,
    "substring": str,
    "context": str,
    "fatal": bool,
    "meaning": str,
    "next_step": str,
    "sources": list,
}
_REQUIRED = ("id", "fatal", "meaning", "next_step", "sources")


@dataclass(frozen=True)
class Signature:
    """One known crash text: how to find it, what it means, what to do next."""

    id: str
    pattern: re.Pattern[str]
    fatal: bool
    meaning: str
    next_step: str
    sources: tuple[str, ...]
    context: re.Pattern[str] | None = None

    def search(self, line: str) -> re.Match[str] | None:
        return self.pattern.search(line)


def default_signatures_path() -> Path:
    """The catalogue next to the recipe packages (repo checkout or installed wheel)."""
    return default_recipe_dir() / FILE_NAME


def _compile(path: Path, key: str, text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as e:
        raise fail(path, key, f"bad regex ({e})", "fix the pattern (TOML single quotes avoid escaping)") from None


def _placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def _load_one(path: Path, i: int, raw: Any) -> Signature:
    where = f"signature[{i}]"
    if not isinstance(raw, dict):
        raise fail(path, where, "is not a table", "write it as [[signature]]")
    check_table(path, where, raw, _KEYS)
    for k in _REQUIRED:
        if k not in raw:
            raise fail(path, f"{where}.{k}", "missing", "every signature needs " + ", ".join(_REQUIRED))
    sid = raw["id"]
    where = f"signature {sid!r}"
    if not _ID_RE.match(sid):
        raise fail(path, f"{where}.id", "is not lowercase-with-dashes", "rename it, e.g. cuda-out-of-memory")
    if ("regex" in raw) == ("substring" in raw):
        raise fail(path, where, "needs exactly one of 'regex' or 'substring'", "give one")
    if "regex" in raw:
        pattern = _compile(path, f"{where}.regex", raw["regex"])
    else:
        if not raw["substring"]:
            raise fail(path, f"{where}.substring", "is empty", "give the text to look for")
        pattern = re.compile(re.escape(raw["substring"]))
    context = _compile(path, f"{where}.context", raw["context"]) if "context" in raw else None
    groups = set(pattern.groupindex) | (set(context.groupindex) if context else set())
    for k in ("meaning", "next_step"):
        if not raw[k].strip():
            raise fail(path, f"{where}.{k}", "is empty", "write one sentence")
        unknown = _placeholders(raw[k]) - groups
        if unknown:
            raise fail(
                path,
                f"{where}.{k}",
                f"uses {{{sorted(unknown)[0]}}} which no named group captures",
                "add the group or drop the placeholder",
            )
    sources = raw["sources"]
    if not sources or not all(isinstance(s, str) and s.startswith("https://") for s in sources):
        raise fail(path, f"{where}.sources", "must be a non-empty list of https:// URLs", "cite the public report")
    return Signature(
        id=sid,
        pattern=pattern,
        fatal=raw["fatal"],
        meaning=raw["meaning"].strip(),
        next_step=raw["next_step"].strip(),
        sources=tuple(sources),
        context=context,
    )


def load_signatures(path: Path | None = None) -> list[Signature]:
    """Every signature in the catalogue, in file order (most specific first)."""
    path = path or default_signatures_path()
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise RecipeError(f"{path}: cannot read ({e.strerror}); check the path or set SM120PATCH_RECIPES") from None
    data = read_toml(path, blob, "the signature catalogue")
    for k in data:
        if k != "signature":
            raise fail(path, k, "unknown key", "the file holds only [[signature]] tables")
    raw = data.get("signature", [])
    if not isinstance(raw, list) or not raw:
        raise fail(path, "signature", "no [[signature]] tables", "add at least one")
    sigs = [_load_one(path, i, r) for i, r in enumerate(raw)]
    seen: set[str] = set()
    for s in sigs:
        if s.id in seen:
            raise fail(path, f"signature {s.id!r}.id", "is used twice", "ids must be unique")
        seen.add(s.id)
    return sigs
