"""Strict checks shared by the data files under patches/ (recipes, kernels, signatures).

Every problem becomes one line, `<file>: <key>: <problem>; <fix>`, raised as RecipeError:
a typo in data must never turn into a silent no-op or a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from sm120patch.errors import RecipeError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = ["check_table", "fail", "one_line", "read_toml", "str_list", "tomllib"]


def one_line(text: str) -> str:
    """Names from a data file may hold newlines (quoted TOML keys); an error stays one line."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def fail(path: Path, key: str, problem: str, fix: str) -> RecipeError:
    return RecipeError(one_line(f"{path}: {key}: {problem}; {fix}"))


def read_toml(path: Path, blob: bytes, what: str) -> dict[str, Any]:
    """Parse a file's bytes; `what` names it in the fix ("the recipe")."""
    try:
        return tomllib.loads(blob.decode("utf-8"))
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not UTF-8; save {what} as UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise RecipeError(f"{path}: invalid TOML ({one_line(str(e))}); fix the syntax") from None
    except RecursionError:
        raise RecipeError(f"{path}: nested too deeply to be {what}; fix the TOML") from None


def _tname(want: type | tuple[type, ...]) -> str:
    names = {str: "string", list: "list", dict: "table", bool: "boolean (true/false)"}
    if isinstance(want, tuple):
        return " or ".join(names.get(w, w.__name__) for w in want)
    return names.get(want, want.__name__)


def check_type(path: Path, key: str, value: Any, want: type | tuple[type, ...]) -> None:
    """`value` is a `want` (TOML booleans are not numbers or strings here)."""
    if isinstance(value, bool) and want is not bool:
        raise fail(path, key, "is a boolean", f"give a {_tname(want)}")
    if not isinstance(value, want):
        raise fail(path, key, f"is a {type(value).__name__}", f"give a {_tname(want)}")


def check_table(path: Path, where: str, raw: dict[str, Any], keys: dict[str, Any]) -> None:
    """No unknown key in a table, and each known one of its type. `where` prefixes the key."""
    for k, v in raw.items():
        key = f"{where}.{k}" if where else k
        if k not in keys:
            raise fail(path, key, "unknown key", f"use one of {', '.join(keys)}")
        check_type(path, key, v, keys[k])


def str_list(path: Path, key: str, value: list[Any]) -> tuple[str, ...]:
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise fail(path, f"{key}[{i}]", "is not a non-empty string", "quote it")
    return tuple(value)
