"""The catalogue of known SM12x crash signatures (patches/signatures.toml), validated strictly.

Signatures are data, like recipes: a typo in the catalogue must fail loudly with
one line naming the file and the key, never turn into a pattern that silently
matches nothing. Regexes are compiled once at load time.
"""

from __future__ import annotations

import re
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sm120patch.errors import RecipeError
from sm120patch.recipes import default_recipe_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

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


def _fail(path: Path, key: str, problem: str, fix: str) -> RecipeError:
    return RecipeError(f"{path}: {key}: {problem}; {fix}")


def _compile(path: Path, key: str, text: str) -> re.Pattern[str]:
    try:
        return re.compile(text)
    except re.error as e:
        raise _fail(path, key, f"bad regex ({e})", "fix the pattern (TOML single quotes avoid escaping)") from None


def _placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def _load_one(path: Path, i: int, raw: Any) -> Signature:
    where = f"signature[{i}]"
    if not isinstance(raw, dict):
        raise _fail(path, where, "is not a table", "write it as [[signature]]")
    for k, v in raw.items():
        if k not in _KEYS:
            raise _fail(path, f"{where}.{k}", "unknown key", f"use one of {', '.join(_KEYS)}")
        if not isinstance(v, _KEYS[k]) or (isinstance(v, bool) and _KEYS[k] is not bool):
            raise _fail(path, f"{where}.{k}", f"is a {type(v).__name__}", f"give a {_KEYS[k].__name__}")
    for k in _REQUIRED:
        if k not in raw:
            raise _fail(path, f"{where}.{k}", "missing", "every signature needs " + ", ".join(_REQUIRED))
    sid = raw["id"]
    where = f"signature {sid!r}"
    if not _ID_RE.match(sid):
        raise _fail(path, f"{where}.id", "is not lowercase-with-dashes", "rename it, e.g. cuda-out-of-memory")
    if ("regex" in raw) == ("substring" in raw):
        raise _fail(path, where, "needs exactly one of 'regex' or 'substring'", "give one")
    if "regex" in raw:
        pattern = _compile(path, f"{where}.regex", raw["regex"])
    else:
        if not raw["substring"]:
            raise _fail(path, f"{where}.substring", "is empty", "give the text to look for")
        pattern = re.compile(re.escape(raw["substring"]))
    context = _compile(path, f"{where}.context", raw["context"]) if "context" in raw else None
    groups = set(pattern.groupindex) | (set(context.groupindex) if context else set())
    for k in ("meaning", "next_step"):
        if not raw[k].strip():
            raise _fail(path, f"{where}.{k}", "is empty", "write one sentence")
        unknown = _placeholders(raw[k]) - groups
        if unknown:
            raise _fail(
                path,
                f"{where}.{k}",
                f"uses {{{sorted(unknown)[0]}}} which no named group captures",
                "add the group or drop the placeholder",
            )
    sources = raw["sources"]
    if not sources or not all(isinstance(s, str) and s.startswith("https://") for s in sources):
        raise _fail(path, f"{where}.sources", "must be a non-empty list of https:// URLs", "cite the public report")
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
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise RecipeError(f"{path}: cannot read ({e.strerror}); check the path or set SM120PATCH_RECIPES") from None
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not UTF-8; save it as UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise RecipeError(f"{path}: invalid TOML ({e}); fix the syntax") from None
    for k in data:
        if k != "signature":
            raise _fail(path, k, "unknown key", "the file holds only [[signature]] tables")
    raw = data.get("signature", [])
    if not isinstance(raw, list) or not raw:
        raise _fail(path, "signature", "no [[signature]] tables", "add at least one")
    sigs = [_load_one(path, i, r) for i, r in enumerate(raw)]
    seen: set[str] = set()
    for s in sigs:
        if s.id in seen:
            raise _fail(path, f"signature {s.id!r}.id", "is used twice", "ids must be unique")
        seen.add(s.id)
    return sigs
