"""verify's results, kept beside the journal: `verify.json` in the tree's journal folder.

Its own file, written atomically (temp file + rename), never journal.json: the journal stays the
engine's. One entry per recipe, the latest verdict on this tree, which `sm120patch status` shows:

    {"schema": 1, "recipes": {"<id>": {"kept": bool, "summary": str, "at": str,
                                      "candidate": str, "report": str | null}}}

No httpx here: `status` imports this module. The journal folder is removed by the engine when
nothing is applied there any more and a later run locks it; the records go with it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

FILENAME = "verify.json"
SCHEMA = 1


def path_for(root: Path) -> Path:
    from sm120patch.engine.journal import state_dir_for

    return state_dir_for(root) / FILENAME


def read(root: Path) -> dict[str, dict[str, Any]]:
    """The recorded verdicts by recipe id; {} when none (or the file is not ours to trust)."""
    try:
        data = json.loads(path_for(root).read_bytes())
    except (OSError, ValueError):
        return {}
    recipes = data.get("recipes") if isinstance(data, dict) and data.get("schema") == SCHEMA else None
    if not isinstance(recipes, dict):
        return {}
    return {k: v for k, v in recipes.items() if isinstance(k, str) and isinstance(v, dict)}


def write(root: Path, decisions: Iterable[dict[str, Any]], report: str | None) -> Path:
    """Record each decision under each of its recipes (merged with what earlier runs recorded)."""
    from sm120patch.engine.journal import atomic_write

    path = path_for(root)
    recipes = read(root)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    for d in decisions:
        for rid in d["recipes"]:
            recipes[rid] = {
                "kept": bool(d["keep"]),
                "summary": d["summary"],
                "at": stamp,
                "candidate": d["name"],
                "report": report,
            }
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = json.dumps({"schema": SCHEMA, "recipes": recipes}, indent=2, sort_keys=True).encode() + b"\n"
    atomic_write(path, blob, mode=0o644)
    return path


def status_lines(recs: dict[str, dict[str, Any]], applied: Iterable[str]) -> list[str]:
    """For `status`: one line per recorded recipe (`read`'s result), applied ones first."""
    applied = list(applied)
    order = [r for r in applied if r in recs] + sorted(r for r in recs if r not in applied)
    return [
        f"verified {rid}: {'kept' if recs[rid].get('kept') else 'rolled back'}: {recs[rid].get('summary', '')}"
        for rid in order
    ]
