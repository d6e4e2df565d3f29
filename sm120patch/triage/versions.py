"""The releases that fixed a toolchain for an SM12x arch (patches/fixed_versions.toml: facts, each with its
source), named in the advice for a crash whose log shows that tool lacking that arch."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sm120patch.catalogue.datafile import fail, read_toml
from sm120patch.catalogue.recipes import default_recipe_dir
from sm120patch.triage.diagnose import Diagnosis

FILE_NAME = "fixed_versions.toml"
KEYS = ("component", "archs", "version", "fact", "source")
# the words of a log line that name each component (a ptxas or nvcc error is CUDA's unless Triton is named)
_COMPONENT = {
    "triton": re.compile(r"(?i)\btriton\b|TRITON_PTXAS_PATH"),
    "cuda": re.compile(r"(?i)\bnvcc\b|\bptxas\b|\bgpu-(?:architecture|name)\b|\bcuda (?:toolkit|12\.\d)\b"),
}
_ARCH = re.compile(r"\b(?:sm|compute)_1[02]\d[af]?\b")


@dataclass(frozen=True)
class Fixed:
    component: str
    archs: tuple[str, ...]
    version: str
    fact: str
    source: str


def load(path: Path | None = None) -> list[Fixed]:
    """Every row; a row without all its keys, or without an https source, is a broken table (RecipeError)."""
    path = path or default_recipe_dir() / FILE_NAME
    data = read_toml(path, path.read_bytes(), "the fixed-versions table")
    rows = data.get("fix", [])
    out: list[Fixed] = []
    for i, row in enumerate(rows):
        missing = [k for k in KEYS if k not in row]
        if missing or set(row) - set(KEYS):
            raise fail(path, f"fix[{i}]", f"keys {sorted(row)}", f"give exactly {', '.join(KEYS)}")
        if not str(row["source"]).startswith("https://"):
            raise fail(path, f"fix[{i}].source", repr(row["source"]), "give the https URL the fact is from")
        out.append(Fixed(row["component"], tuple(row["archs"]), row["version"], row["fact"], row["source"]))
    return out


def rows_for(text: str, table: list[Fixed]) -> list[Fixed]:
    """The rows whose arch the text names and whose component it names (Triton before plain CUDA)."""
    archs = {m.group(0).lower() for m in _ARCH.finditer(text)}
    named = [c for c, p in _COMPONENT.items() if p.search(text)]
    if "triton" in named:
        named = ["triton"]  # Triton's own ptxas: the CUDA toolkit on PATH is not what failed
    return [r for r in table if r.component in named and archs & set(r.archs)]


def add_fixed_versions(result: Diagnosis, table: list[Fixed] | None = None) -> None:
    """A note on each toolchain finding with the releases that know the arch it lacks, and their sources."""
    causes = [f for f in result.causes if f.cls == "toolchain-lacks-arch"]
    if not causes:
        return
    table = load() if table is None else table
    around = [e.line for e in result.unnamed_errors]  # the lines near it say whose tool it is ("Triton ...")
    for f in causes:
        text = " ".join([f.line, *f.details.values(), *around])
        for row in rows_for(text, table):
            f.notes.append(f"{row.component} {row.version}: {row.fact} ({row.source})")
