"""The releases that first worked on an SM12x arch (patches/fixed_versions.toml: facts, each with its source),
named in the advice for a crash whose log shows that component lacking that arch.

Two kinds of row. A toolchain's (CUDA, Triton) is named when the log's words show that tool failing on the arch
(add_fixed_versions). A library's is named when a finding of the row's classes (by default a binary without the
arch) names that library in its line, its frames or its details (library_rows): a wheel older than the row's
version has no code for the GPU, the row says which release has and how to install it. A library row that names
a PyPI `wheel` and the release `before` it is checked against what those real wheels carry
(tools/calibrate_versions.py records it in tests/data/versions/wheels.json, and the tests hold the table to it)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from sm120patch.catalogue.datafile import fail, read_toml
from sm120patch.catalogue.recipes import default_recipe_dir
from sm120patch.triage.classes import CLASSES
from sm120patch.triage.diagnose import Diagnosis

FILE_NAME = "fixed_versions.toml"
KEYS = ("component", "archs", "version", "fact", "source")
# optional: the command that installs it; the PyPI wheel whose binaries show it, the release before (whose wheels
# lack it) and the platform tag the calibration downloads; the finding classes a library row answers
OPTIONAL: dict[str, type] = {"install": str, "wheel": str, "before": str, "platform": str, "classes": list}
DEFAULT_PLATFORM = "manylinux_2_28_x86_64"
LIBRARY_CLASSES = ("binary-lacks-arch",)
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
    install: str = ""
    wheel: str = ""
    before: str = ""
    platform: str = DEFAULT_PLATFORM
    classes: tuple[str, ...] = ()  # a library row's (LIBRARY_CLASSES unless it says); a toolchain's: unused

    @property
    def toolchain(self) -> bool:
        """A compiler's row (matched by the log's words), not a library's (matched by the finding's names)."""
        return self.component in _COMPONENT

    def note(self) -> str:
        install = f" {self.install}" if self.install else ""
        return f"{self.component} {self.version}: {self.fact}{install} ({self.source})"


def load(path: Path | None = None) -> list[Fixed]:
    """Every row; a row without all its keys, or without an https source, is a broken table (RecipeError)."""
    path = path or default_recipe_dir() / FILE_NAME
    data = read_toml(path, path.read_bytes(), "the fixed-versions table")
    rows = data.get("fix", [])
    out: list[Fixed] = []
    for i, row in enumerate(rows):
        missing = [k for k in KEYS if k not in row]
        if missing or set(row) - set(KEYS) - set(OPTIONAL):
            want = f"give {', '.join(KEYS)} (and optionally {', '.join(OPTIONAL)})"
            raise fail(path, f"fix[{i}]", f"keys {sorted(row)}", want)
        if not str(row["source"]).startswith("https://"):
            raise fail(path, f"fix[{i}].source", repr(row["source"]), "give the https URL the fact is from")
        for key, want in OPTIONAL.items():
            if key in row and not (isinstance(row[key], want) and row[key]):
                raise fail(path, f"fix[{i}].{key}", repr(row[key]), f"give a non-empty {want.__name__}")
        if ("wheel" in row) != ("before" in row):
            raise fail(path, f"fix[{i}]", "wheel without before (or before without wheel)", "give both or neither")
        unknown = [c for c in row.get("classes", []) if c not in CLASSES]
        if unknown:
            raise fail(path, f"fix[{i}].classes", repr(unknown[0]), f"use classes of {', '.join(CLASSES)}")
        extra = {k: (tuple(v) if isinstance(v, list) else v) for k, v in row.items() if k in OPTIONAL}
        if row["component"] not in _COMPONENT:
            extra.setdefault("classes", LIBRARY_CLASSES)
        out.append(Fixed(row["component"], tuple(row["archs"]), row["version"], row["fact"], row["source"], **extra))
    return out


@functools.lru_cache(maxsize=1)
def default_table() -> tuple[Fixed, ...]:
    """The shipped table, read once per process (diagnose asks for it per finding)."""
    return tuple(load())


def library_key(name: str) -> str:
    """One spelling for a library's names: flash-attn, flash_attn and Flash_Attn are one; vllm._C is vllm."""
    key = name.strip().lower().replace("-", "_")
    return re.sub(r"\._c$", "", key)


def library_rows(names: list[str], cls: str, spark: bool, table: tuple[Fixed, ...] | list[Fixed]) -> list[Fixed]:
    """The library rows about one of `names` for a finding of class `cls`, for the GPU the log shows: sm_121 rows on
    a DGX Spark, sm_120 rows otherwise (the first release with sm_120 code runs on both, rules [BIN])."""
    keys = {library_key(n) for n in names if n}
    want = "sm_121" if spark else "sm_120"
    return [
        r
        for r in table
        if not r.toolchain
        and cls in r.classes
        and library_key(r.component) in keys
        and any(a.startswith(want) for a in r.archs)
    ]


def rows_for(text: str, table: list[Fixed]) -> list[Fixed]:
    """The rows whose arch the text names and whose component it names (Triton before plain CUDA)."""
    archs = {m.group(0).lower() for m in _ARCH.finditer(text)}
    named = [c for c, p in _COMPONENT.items() if p.search(text)]
    if "triton" in named:
        named = ["triton"]  # Triton's own ptxas: the CUDA toolkit on PATH is not what failed
    return [r for r in table if r.toolchain and r.component in named and archs & set(r.archs)]


def add_fixed_versions(result: Diagnosis, table: list[Fixed] | None = None) -> None:
    """A note on each toolchain finding with the releases that know the arch it lacks, and their sources."""
    causes = [f for f in result.causes if f.cls == "toolchain-lacks-arch"]
    if not causes:
        return
    table = list(default_table()) if table is None else table
    around = [e.line for e in result.unnamed_errors]  # the lines near it say whose tool it is ("Triton ...")
    for f in causes:
        text = " ".join([f.line, *f.details.values(), *around])
        for row in rows_for(text, table):
            f.notes.append(row.note())
